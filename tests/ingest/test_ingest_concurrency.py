"""Gateways retrying at once: overlapping batches posted concurrently store every event once."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from billing.storage.models import Call, Event
from tests.conftest import LiveServer

THREADS = 8
CALLS = 40
EVENTS_PER_CALL = 10
BATCH = 50
T0 = datetime.now(UTC) - timedelta(hours=1)


def _at(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def _events() -> list[dict[str, Any]]:
    """40 calls of 10 events: started, 7 progress snapshots, a disconnect and the usage."""
    events: list[dict[str, Any]] = []
    for c in range(CALLS):
        request_id = f"req-{c:03d}"
        base = {"request_id": request_id}
        events.append(
            {
                **base,
                "event_id": f"{request_id}-0",
                "type": "stream.started",
                "occurred_at": _at(c),
                "api_key_id": f"key_{c % 4}",
                "model": "claude-sonnet-5-5",
                "protocol": "anthropic.messages",
                "input_tokens": 100 + c,
            }
        )
        for k in range(1, 8):
            events.append(
                {
                    **base,
                    "event_id": f"{request_id}-{k}",
                    "type": "stream.tokens",
                    "occurred_at": _at(c + k),
                    "output_tokens_generated": 50 * k,
                    "output_tokens_delivered": 48 * k,
                }
            )
        events.append(
            {
                **base,
                "event_id": f"{request_id}-8",
                "type": "stream.client_disconnected",
                "occurred_at": _at(c + 8),
                "output_tokens_delivered": 380,
            }
        )
        events.append(
            {
                **base,
                "event_id": f"{request_id}-9",
                "type": "stream.usage",
                "occurred_at": _at(c + 9),
                "input_tokens": 100 + c,
                "output_tokens": 750,
                "source": "upstream",
            }
        )
    return events


@pytest.mark.slow
def test_overlapping_concurrent_batches_store_every_event_once(
    live_server: LiveServer, app: FastAPI
) -> None:
    events = _events()
    assert len(events) == CALLS * EVENTS_PER_CALL
    start = threading.Barrier(THREADS)

    def gateway(seed: int) -> list[tuple[int, Any]]:
        mine = list(events)
        random.Random(seed).shuffle(mine)
        replies = []
        with httpx.Client(base_url=live_server.url, timeout=60) as client:
            start.wait(timeout=30)
            for offset in range(0, len(mine), BATCH):
                reply = client.post("/v1/events", json={"events": mine[offset : offset + BATCH]})
                replies.append((reply.status_code, reply.json()))
        return replies

    with ThreadPoolExecutor(THREADS) as pool:
        results = [r for replies in pool.map(gateway, range(THREADS)) for r in replies]

    assert len(results) == THREADS * len(events) // BATCH
    assert [status for status, _ in results] == [200] * len(results), results
    accepted = sum(body["accepted"] for _, body in results)
    duplicates = sum(body["duplicates"] for _, body in results)
    assert accepted == len(events)
    assert accepted + duplicates == THREADS * len(events)
    assert all(body["accepted"] + body["duplicates"] == BATCH for _, body in results)

    with app.state.billing.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Event)) == len(events)
        stored_ids = set(session.scalars(select(Event.event_id)))
        assert stored_ids == {e["event_id"] for e in events}
        assert len(set(session.scalars(select(Event.seq)))) == len(events)
        calls = {c.request_id: c for c in session.scalars(select(Call))}
    assert set(calls) == {f"req-{c:03d}" for c in range(CALLS)}
    for c in range(CALLS):
        call = calls[f"req-{c:03d}"]
        assert call.pending
        assert (call.api_key_id, call.model, call.protocol) == (
            f"key_{c % 4}",
            "claude-sonnet-5-5",
            "anthropic.messages",
        )
        assert call.started_at == T0 + timedelta(seconds=c)
