"""A reconciliation pass keeps going when one call cannot be booked."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from billing.reconcile.runner import run_pass
from billing.storage.models import Call, Event, LedgerEntry

STARTED = {
    "type": "stream.started",
    "occurred_at": "2026-10-15T08:00:00Z",
    "api_key_id": "key_r",
    "model": "m-r",
    "protocol": "anthropic.messages",
}
USAGE = {
    "type": "stream.usage",
    "occurred_at": "2026-10-15T08:00:02Z",
    "input_tokens": 10,
    "output_tokens": 20,
    "source": "upstream",
}


def _call(request_id: str) -> list[dict[str, object]]:
    return [
        {**STARTED, "event_id": f"{request_id}-s", "request_id": request_id},
        {**USAGE, "event_id": f"{request_id}-u", "request_id": request_id},
    ]


def test_a_poisoned_call_does_not_block_the_others(
    app: FastAPI, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    events = _call("good-1") + _call("bad") + _call("good-2")
    assert client.post("/v1/events", json={"events": events}).json() == {
        "accepted": 6,
        "duplicates": 0,
    }
    state = app.state.billing
    with state.sessions.begin() as session:
        # A stored body that no longer parses (as after a botched manual repair).
        session.execute(update(Event).where(Event.event_id == "bad-u").values(body="{not json"))
    with caplog.at_level(logging.ERROR, logger="billing.reconcile"):
        result = run_pass(state.sessions, state.settings, now=datetime(2026, 10, 15, 9, tzinfo=UTC))
    assert result.settled == 2
    assert "call 'bad' could not be reconciled" in caplog.text
    with state.sessions() as session:
        settled = dict(session.execute(select(Call.request_id, Call.settled)).tuples().all())
        pending = session.scalar(select(Call.pending).where(Call.request_id == "bad"))
        entries = session.scalars(select(LedgerEntry.request_id).order_by(LedgerEntry.request_id))
        assert list(entries) == ["good-1", "good-2"]
    assert settled == {"good-1": True, "good-2": True, "bad": False}
    assert pending is True


@pytest.mark.parametrize("threads", [1, 3])
def test_steps_run_at_once_settle_each_call_once(
    app: FastAPI, client: TestClient, threads: int
) -> None:
    """``reconcile_threads`` steps at once (PostgreSQL; SQLite runs one): small steps so that
    the threads take turns at the due calls; every call is settled by exactly one step."""
    events = [event for i in range(240) for event in _call(f"c{i:03d}")]
    for start in range(0, len(events), 1000):
        reply = client.post("/v1/events", json={"events": events[start : start + 1000]})
        assert reply.status_code == 200
    state = app.state.billing
    settings = state.settings.model_copy(
        update={"reconcile_threads": threads, "reconcile_batch_size": 7}
    )
    result = run_pass(state.sessions, settings, now=datetime(2026, 10, 15, 9, tzinfo=UTC))
    assert (result.examined, result.settled, result.adjusted) == (240, 240, 0)
    assert sorted(result.settled_ids) == [f"c{i:03d}" for i in range(240)]
    with state.sessions() as session:
        entries = list(session.scalars(select(LedgerEntry.request_id)))
        assert sorted(entries) == [f"c{i:03d}" for i in range(240)]
        assert session.scalar(select(Call.request_id).where(Call.settled.is_(False))) is None
