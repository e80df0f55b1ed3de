"""``/healthz``, ``/readyz`` and ``/metrics`` (CONTRACT "Operations")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

T0 = datetime.now(UTC) - timedelta(hours=1)


def _event(
    event_id: str, request_id: str, kind: str, seconds: int, **fields: Any
) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "request_id": request_id,
        "type": kind,
        "occurred_at": (T0 + timedelta(seconds=seconds)).isoformat(),
        **fields,
    }


def _call(request_id: str) -> list[dict[str, Any]]:
    """Six events of one call (the seed disconnect scenario)."""
    return [
        _event(
            f"{request_id}-1",
            request_id,
            "stream.started",
            0,
            api_key_id="key_demo",
            model="claude-sonnet-5-5",
            protocol="anthropic.messages",
            input_tokens=22,
        ),
        _event(f"{request_id}-2", request_id, "stream.tokens", 1,
               output_tokens_generated=120, output_tokens_delivered=118),
        _event(f"{request_id}-3", request_id, "stream.tokens", 2,
               output_tokens_generated=250, output_tokens_delivered=240),
        _event(f"{request_id}-4", request_id, "stream.tokens", 4,
               output_tokens_generated=390, output_tokens_delivered=380),
        _event(f"{request_id}-5", request_id, "stream.client_disconnected", 4,
               output_tokens_delivered=380, output_tokens_generated=400),
        _event(f"{request_id}-6", request_id, "stream.usage", 9,
               input_tokens=22, output_tokens=750, source="upstream", stop_reason="end_turn"),
    ]  # fmt: skip


def scrape(
    client: TestClient | httpx.Client,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}, parsed as Prometheus text."""
    reply = client.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_healthz(client: TestClient) -> None:
    reply = client.get("/healthz")
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok"}


def test_readyz_on_a_migrated_database(client: TestClient) -> None:
    reply = client.get("/readyz")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"status": "ready"}


def test_metrics_start_at_zero(client: TestClient) -> None:
    samples = scrape(client)
    assert value(samples, "billing_events_accepted_total") == 0
    assert value(samples, "billing_events_duplicate_total") == 0
    assert value(samples, "billing_calls_open") == 0


def test_metrics_count_what_ingest_did(client: TestClient) -> None:
    events = _call("req-m1")

    assert client.post("/v1/events", json={"events": events}).json() == {
        "accepted": 6,
        "duplicates": 0,
    }
    assert client.post("/v1/events", json={"events": events}).json() == {
        "accepted": 0,
        "duplicates": 6,
    }
    bad = _event("bad", "req-m2", "stream.tokens", 1, output_tokens_generated=-1,
                 output_tokens_delivered=0)  # fmt: skip
    assert client.post("/v1/events", json={"events": [bad]}).status_code == 422
    conflicting = [{**events[5], "output_tokens": 751}, {**events[1], "attempt": 2}]
    assert client.post("/v1/events", json={"events": conflicting}).status_code == 409
    too_many = [_event(f"x{i}", "req-m3", "stream.failed", 1, error_type="stalled")
                for i in range(1001)]  # fmt: skip
    assert client.post("/v1/events", json={"events": too_many}).status_code == 413

    samples = scrape(client)

    assert value(samples, "billing_events_accepted_total") == 6
    assert value(samples, "billing_events_duplicate_total") == 6
    assert value(samples, "billing_events_rejected_total", reason="invalid") == 1
    assert value(samples, "billing_events_rejected_total", reason="conflict") == 2
    assert value(samples, "billing_events_rejected_total", reason="too_large") == 1
    assert value(samples, "billing_calls_open") == 1  # req-m1; nothing of the refused batches

    def requests(status: str) -> float | None:
        return value(
            samples,
            "billing_request_duration_seconds_count",
            method="POST",
            route="/v1/events",
            status=status,
        )

    assert requests("200") == 2
    assert requests("422") == 1
    assert requests("409") == 1
    assert requests("413") == 1
    total = value(
        samples,
        "billing_request_duration_seconds_sum",
        method="POST",
        route="/v1/events",
        status="200",
    )
    assert total is not None and total > 0


def test_calls_open_counts_each_call_once(client: TestClient) -> None:
    for request_id in ("req-a", "req-b", "req-c"):
        assert client.post("/v1/events", json={"events": _call(request_id)}).status_code == 200
    assert value(scrape(client), "billing_calls_open") == 3


def test_metrics_over_real_http(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.post("/v1/events", json={"events": _call("req-h")}).json()["accepted"] == 6
    samples = scrape(http)
    assert value(samples, "billing_events_accepted_total") == 6
    assert value(samples, "billing_calls_open") == 1
    health = value(
        samples,
        "billing_request_duration_seconds_count",
        method="GET",
        route="/healthz",
        status="200",
    )
    assert health == 1
