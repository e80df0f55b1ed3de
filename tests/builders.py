"""Events and posts for the tests: one place that builds what a gateway sends.

Two families:
- ``raw``, ``started``, ``tokens``, ``disconnect``, ``usage``, ``failed``: compact events for the
  rule and the reconciler (positional counts, ``at`` in seconds after the fixed ``T0``), and
  ``parse`` to validate them as ingest does;
- ``seed_*``: the README's seed scenario (22 input tokens, 750 output billed, 380 delivered) at
  ``RECENT`` (two hours ago, so that it is never refused as in the future), for ingest tests;
  ``post`` and ``post_raw`` send them to ``POST /v1/events``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from billing.ingest.schemas import Event

T0 = datetime(2026, 10, 15, 8, 0, tzinfo=UTC)


_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def raw(
    type_: str,
    event_id: str,
    request_id: str = "r1",
    at: float = 0,
    attempt: int = 1,
    **fields: Any,
) -> dict[str, Any]:
    """An event as a gateway posts it (JSON-ready); ``at`` is seconds after ``T0``."""
    occurred = (T0 + timedelta(seconds=at)).isoformat().replace("+00:00", "Z")
    body = {
        "event_id": event_id,
        "request_id": request_id,
        "type": type_,
        "occurred_at": occurred,
        "attempt": attempt,
    }
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


def started(
    eid: str,
    rid: str = "r1",
    at: float = 0,
    attempt: int = 1,
    *,
    key: str = "key_a",
    model: str = "m1",
    protocol: str = "anthropic.messages",
    input_tokens: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return raw(
        "stream.started",
        eid,
        rid,
        at,
        attempt,
        api_key_id=key,
        model=model,
        protocol=protocol,
        input_tokens=input_tokens,
        **extra,
    )


def tokens(
    eid: str, gen: int, dlv: int, rid: str = "r1", at: float = 0, attempt: int = 1
) -> dict[str, Any]:
    return raw(
        "stream.tokens",
        eid,
        rid,
        at,
        attempt,
        output_tokens_generated=gen,
        output_tokens_delivered=dlv,
    )


def disconnect(
    eid: str, dlv: int, gen: int | None = None, rid: str = "r1", at: float = 0, attempt: int = 1
) -> dict[str, Any]:
    return raw(
        "stream.client_disconnected",
        eid,
        rid,
        at,
        attempt,
        output_tokens_delivered=dlv,
        output_tokens_generated=gen,
    )


def usage(
    eid: str,
    inp: int,
    out: int,
    source: str = "upstream",
    rid: str = "r1",
    at: float = 0,
    attempt: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    return raw(
        "stream.usage",
        eid,
        rid,
        at,
        attempt,
        input_tokens=inp,
        output_tokens=out,
        source=source,
        **extra,
    )


def failed(
    eid: str,
    error_type: str = "api_error",
    rid: str = "r1",
    at: float = 0,
    attempt: int = 1,
    gen: int | None = None,
) -> dict[str, Any]:
    return raw(
        "stream.failed", eid, rid, at, attempt, error_type=error_type, output_tokens_generated=gen
    )


def parse(events: Iterable[Mapping[str, Any]]) -> list[Event]:
    return [_adapter.validate_python(dict(e)) for e in events]


#: A past instant for events (well inside the 5-minute future limit whatever the clock says).
RECENT = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0)


def recent_ts(seconds: float = 0, offset_hours: int = 0) -> str:
    """``RECENT + seconds`` as RFC 3339, written in the zone ``offset_hours`` east of UTC."""
    moment = RECENT + timedelta(seconds=seconds)
    if offset_hours == 0:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return moment.astimezone(timezone(timedelta(hours=offset_hours))).isoformat()


def seed_started(event_id: str, request_id: str = "req-1", **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "request_id": request_id,
        "type": "stream.started",
        "occurred_at": recent_ts(0),
        "api_key_id": "key_7f3a",
        "model": "claude-sonnet-5-5",
        "protocol": "anthropic.messages",
    }
    return {**event, **fields}


def seed_tokens(
    event_id: str, request_id: str = "req-1", generated: int = 10, delivered: int = 9, **fields: Any
) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "request_id": request_id,
        "type": "stream.tokens",
        "occurred_at": recent_ts(1),
        "output_tokens_generated": generated,
        "output_tokens_delivered": delivered,
    }
    return {**event, **fields}


def seed_usage(event_id: str, request_id: str = "req-1", **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "request_id": request_id,
        "type": "stream.usage",
        "occurred_at": recent_ts(3),
        "input_tokens": 22,
        "output_tokens": 750,
        "source": "upstream",
    }
    return {**event, **fields}


def seed_disconnected(event_id: str, request_id: str = "req-1", **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "request_id": request_id,
        "type": "stream.client_disconnected",
        "occurred_at": recent_ts(2),
        "output_tokens_delivered": 380,
    }
    return {**event, **fields}


def seed_failed(event_id: str, request_id: str = "req-1", **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "request_id": request_id,
        "type": "stream.failed",
        "occurred_at": recent_ts(4),
        "error_type": "overloaded_error",
    }
    return {**event, **fields}


def post(client: TestClient | httpx.Client, events: list[Any]) -> httpx.Response:
    return client.post("/v1/events", json={"events": events})


def post_raw(client: TestClient | httpx.Client, body: bytes) -> httpx.Response:
    return client.post("/v1/events", content=body, headers={"Content-Type": "application/json"})
