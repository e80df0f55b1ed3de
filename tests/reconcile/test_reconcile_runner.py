"""A reconciliation pass keeps going when one call cannot be booked."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from billing.reconcile.runner import BUSY_FIRST_STEP, BUSY_MIN_STEP, StepSizer, run_pass
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
        settled = dict(session.execute(select(Call.request_id, Call.settled)).all())
        pending = session.scalar(select(Call.pending).where(Call.request_id == "bad"))
        entries = session.scalars(select(LedgerEntry.request_id).order_by(LedgerEntry.request_id))
        assert list(entries) == ["good-1", "good-2"]
    assert settled == {"good-1": True, "good-2": True, "bad": False}
    assert pending is True


def test_a_statement_the_database_refuses_is_not_an_outage(
    app: FastAPI,
    client: TestClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    is_postgres: bool,
) -> None:
    """A statement error in a step (SQLite's "malformed JSON", PostgreSQL's division by zero)
    is the step's fault, not the database's: the pass redoes the step call by call and the other
    calls settle (a SQLite statement error used to count as an outage: every pass stopped)."""
    import billing.reconcile.service as service

    events = _call("good-1") + _call("bad") + _call("good-2")
    assert client.post("/v1/events", json={"events": events}).json() == {
        "accepted": 6,
        "duplicates": 0,
    }
    real = service.settle_common
    failing = "SELECT 1 / 0" if is_postgres else "SELECT json_extract('{not json', '$.a')"

    def refused_for_bad(session: Session, request_ids: Sequence[str], *args: Any) -> list[str]:
        if "bad" in request_ids:
            session.connection().exec_driver_sql(failing)
        return real(session, request_ids, *args)

    monkeypatch.setattr(service, "settle_common", refused_for_bad)
    state = app.state.billing
    with caplog.at_level(logging.ERROR, logger="billing.reconcile"):
        result = run_pass(state.sessions, state.settings, now=datetime(2026, 10, 15, 9, tzinfo=UTC))
    assert result.settled == 2
    assert "call 'bad' could not be reconciled" in caplog.text
    with state.sessions() as session:
        settled = dict(session.execute(select(Call.request_id, Call.settled)).all())
    assert settled == {"good-1": True, "good-2": True, "bad": False}


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


def _post_calls(client: TestClient, count: int, prefix: str) -> None:
    events = [event for i in range(count) for event in _call(f"{prefix}{i:04d}")]
    for start in range(0, len(events), 1000):
        reply = client.post("/v1/events", json={"events": events[start : start + 1000]})
        assert reply.status_code == 200


def _steps(app: FastAPI) -> list[int]:
    """Ledger entries per step, in order (each step books at its own clock: ``now`` is None)."""
    with app.state.billing.sessions() as session:
        rows = session.execute(
            select(LedgerEntry.booked_at, func.count())
            .group_by(LedgerEntry.booked_at)
            .order_by(LedgerEntry.booked_at)
        )
        return [count for _, count in rows]


def test_while_ingest_is_busy_a_pass_takes_short_steps(app: FastAPI, client: TestClient) -> None:
    """Ingest waits for the step holding what it writes (SQLite's write lock, PostgreSQL's call
    locks): while it is busy, steps are sized to ``BUSY_STEP_S``, starting at
    ``BUSY_FIRST_STEP`` calls, instead of ``reconcile_batch_size``."""
    _post_calls(client, 1200, "b")
    state = app.state.billing
    # One thread: with two (PostgreSQL's default), their first steps race for the same calls
    # (``SKIP LOCKED``), and either may book fewer than its limit.
    settings = state.settings.model_copy(
        update={"reconcile_batch_size": 4000, "reconcile_threads": 1}
    )
    result = run_pass(state.sessions, settings, busy=lambda: True)
    assert (result.examined, result.settled) == (1200, 1200)
    steps = _steps(app)
    assert sum(steps) == 1200
    assert steps[0] == BUSY_FIRST_STEP
    assert len(steps) >= 2


@pytest.mark.parametrize("threads", [1, 2])
def test_an_idle_ingest_leaves_the_steps_whole(
    app: FastAPI, client: TestClient, threads: int, is_postgres: bool
) -> None:
    """Idle, each thread's step takes up to ``reconcile_batch_size`` calls and, finding fewer,
    ends the thread's pass: one step with one thread; with two (PostgreSQL), the two first steps
    share the calls between them (``SKIP LOCKED``, in whatever split the race gives)."""
    _post_calls(client, 1200, "i")
    state = app.state.billing
    settings = state.settings.model_copy(
        update={"reconcile_batch_size": 4000, "reconcile_threads": threads}
    )
    result = run_pass(state.sessions, settings, busy=lambda: False)
    assert (result.examined, result.settled) == (1200, 1200)
    steps = _steps(app)
    if threads == 1 or not is_postgres:  # SQLite runs one step at a time
        assert steps == [1200]
    else:
        assert sum(steps) == 1200
        assert 1 <= len(steps) <= 2


def test_a_background_pass_leaves_calls_made_pending_meanwhile_to_the_next(
    app: FastAPI, client: TestClient
) -> None:
    """A pass with ``busy`` (the background one) takes the calls pending when it began: an event
    arriving during the pass makes its call pending for the next pass, which takes it (with short
    steps a pass would otherwise chase the calls still streaming, event after event)."""
    _post_calls(client, 1, "early")
    state = app.state.billing
    assert run_pass(state.sessions, state.settings).settled == 1
    _post_calls(client, 1, "late")
    late_progress = {
        "event_id": "early0000-t",
        "request_id": "early0000",
        "type": "stream.tokens",
        "occurred_at": "2026-10-15T08:00:01Z",
        "output_tokens_generated": 12,
        "output_tokens_delivered": 12,
    }
    posted: list[int] = []
    once = threading.Lock()

    def busy() -> bool:  # PostgreSQL: called by each of the pass's threads
        with once:
            if not posted:  # during the pass, before its first step
                reply = client.post("/v1/events", json={"events": [late_progress]})
                posted.append(reply.status_code)
        return True

    result = run_pass(state.sessions, state.settings, busy=busy)
    assert posted == [200]
    assert (result.examined, result.settled) == (1, 1)  # "late0000" only
    with state.sessions() as session:
        pending = dict(session.execute(select(Call.request_id, Call.pending)).all())
    assert pending == {"early0000": True, "late0000": False}
    result = run_pass(state.sessions, state.settings, busy=lambda: True)
    assert (result.examined, result.settled, result.adjusted) == (1, 0, 1)
    with state.sessions() as session:
        call = session.get(Call, "early0000")
        assert call is not None
        assert (call.pending, call.output_tokens_delivered, call.output_tokens_undelivered) == (
            False,
            12,
            8,
        )


def test_a_background_pass_takes_a_pending_call_stamped_ahead_of_its_clock(
    app: FastAPI, client: TestClient
) -> None:
    """A call's ``last_received_at`` may be later than the reconciler's clock (stamped by a host
    whose clock runs ahead, and kept when the reconciler writes it back): pending again (here as
    a new price marks it), a background pass still takes it."""
    _post_calls(client, 1, "ahead")
    state = app.state.billing
    assert run_pass(state.sessions, state.settings).settled == 1
    with state.sessions.begin() as session:
        session.execute(
            update(Call)
            .where(Call.request_id == "ahead0000")
            .values(pending=True, last_received_at=datetime.now(UTC) + timedelta(hours=1))
        )
    result = run_pass(state.sessions, state.settings, busy=lambda: True)
    assert (result.examined, result.settled, result.adjusted) == (1, 0, 0)
    with state.sessions() as session:
        call = session.get(Call, "ahead0000")
        assert call is not None
        assert (call.pending, call.status, call.input_tokens) == (False, "completed", 10)
        assert (
            call.output_tokens_billed,
            call.output_tokens_delivered,
            call.output_tokens_undelivered,
        ) == (20, 20, 0)  # no delivered count, no disconnect: delivered all (CONTRACT v2)
    assert _steps(app) == [1]  # the one settlement entry: nothing to adjust


def test_the_step_sizer_paces_busy_steps() -> None:
    sizer = StepSizer(4000)
    assert (sizer.limit(False), sizer.limit(True)) == (4000, BUSY_FIRST_STEP)
    sizer.observe(500, 0.1)  # 5,000 calls/s: 250 in 50 ms
    assert (sizer.limit(False), sizer.limit(True)) == (4000, 250)
    sizer.observe(250, 0.01)  # 25,000 calls/s: 1,250 in 50 ms
    assert sizer.limit(True) == 1250
    sizer.observe(1250, 0.001)  # more than the batch size
    assert sizer.limit(True) == 4000
    sizer.observe(4000, 100.0)  # never below the minimum
    assert sizer.limit(True) == BUSY_MIN_STEP
    sizer.observe(0, 0.0)  # an empty step tells nothing
    assert sizer.limit(True) == BUSY_MIN_STEP
    small = StepSizer(7)
    assert small.limit(True) == 7
    small.observe(7, 100.0)
    assert small.limit(True) == 7


def _progress_call(request_id: str) -> list[dict[str, object]]:
    """Two attempts with progress records out of order: the first fails without usage (billed
    from its largest counter), the second is cut by the client and has upstream usage."""
    base = {"request_id": request_id}

    def event(n: int, kind: str, second: int, attempt: int = 1, **fields: object) -> dict:
        stamp = f"2026-10-15T08:00:{second:02d}Z"
        return {
            **base,
            "event_id": f"{request_id}-{n}",
            "type": kind,
            "occurred_at": stamp,
            "attempt": attempt,
            **fields,
        }

    started = {"api_key_id": "key_p", "model": "m-p", "protocol": "openai.chat_completions"}
    return [
        event(1, "stream.started", 0, input_tokens=100, **started),
        event(2, "stream.tokens", 1, output_tokens_generated=10, output_tokens_delivered=10),
        event(3, "stream.tokens", 3, output_tokens_generated=30, output_tokens_delivered=25),
        event(4, "stream.tokens", 2, output_tokens_generated=20, output_tokens_delivered=20),
        event(5, "stream.failed", 4, error_type="upstream_error", output_tokens_generated=35),
        event(6, "stream.started", 5, attempt=2, **started),
        event(
            7, "stream.tokens", 6, attempt=2, output_tokens_generated=50, output_tokens_delivered=50
        ),
        event(8, "stream.client_disconnected", 7, attempt=2, output_tokens_delivered=60),
        event(
            9, "stream.usage", 9, attempt=2, input_tokens=100, output_tokens=90, source="upstream"
        ),
    ]


def test_progress_records_are_folded_to_the_contracts_figures(
    app: FastAPI, client: TestClient
) -> None:
    """Ingest copies a ``stream.tokens`` event's counters into the ``events`` columns the
    reconciler folds in SQL, which gives the contract's figures (attempts summed; the failed
    attempt billed its largest counter, the cut one its upstream usage)."""
    events = _progress_call("p-new") + _progress_call("p-old") + _progress_call("p-mixed")
    assert client.post("/v1/events", json={"events": events}).json() == {
        "accepted": 27,
        "duplicates": 0,
    }
    state = app.state.billing
    with state.sessions.begin() as session:
        stored = session.execute(
            select(
                Event.event_id, Event.output_tokens_delivered, Event.output_tokens_generated
            ).where(Event.request_id == "p-new")
        )
        columns = {event_id: (delivered, generated) for event_id, delivered, generated in stored}
    assert columns == {
        "p-new-1": (None, None),
        "p-new-2": (10, 10),
        "p-new-3": (25, 30),
        "p-new-4": (20, 20),
        "p-new-5": (None, None),
        "p-new-6": (None, None),
        "p-new-7": (50, 50),
        "p-new-8": (None, None),
        "p-new-9": (None, None),
    }
    # The first attempt has no upstream usage: the call settles settle_after its last arrival.
    later = datetime.now(UTC) + timedelta(seconds=state.settings.settle_after_s + 1)
    result = run_pass(state.sessions, state.settings, now=later)
    assert result.settled == 3
    with state.sessions() as session:
        rows = session.execute(
            select(
                Call.request_id,
                Call.status,
                Call.input_tokens,
                Call.output_tokens_billed,
                Call.output_tokens_delivered,
                Call.output_tokens_undelivered,
                Call.started_at,
                Call.ended_at,
            ).order_by(Call.request_id)
        ).all()
    figures = ("client_disconnected", 200, 125, 85, 40)
    started, ended = (
        datetime(2026, 10, 15, 8, tzinfo=UTC),
        datetime(2026, 10, 15, 8, 0, 9, tzinfo=UTC),
    )
    assert [tuple(row) for row in rows] == [
        (request_id, *figures, started, ended) for request_id in ("p-mixed", "p-new", "p-old")
    ]
