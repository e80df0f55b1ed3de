"""Call numbers: every call is numbered when ingest first sees it, and every
event carries its call's number, by which the reconciler and the call log find a call's events.

On SQLite the number is one more than the largest (under the write lock); on PostgreSQL it comes
from the sequence, and a call committed by another transaction while a post is being stored is
given to that post's events by a second statement (the race is staged here with a transaction
held open).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from billing.ingest.service import IngestResult, prepare_batch, store_batch, write_group
from billing.ingest.validation import parse_batch
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from tests.builders import seed_disconnected as disconnected
from tests.builders import seed_started as started
from tests.builders import seed_tokens as tokens
from tests.builders import seed_usage as usage
from tests.invariants import check_invariants


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def store(sessions: sessionmaker[Session], *events: dict[str, Any]) -> IngestResult:
    now = datetime.now(UTC)
    batch = prepare_batch(parse_batch(orjson.dumps({"events": list(events)}), now), now)
    [result] = write_group(sessions, [batch])
    assert isinstance(result, IngestResult)
    return result


def numbers(sessions: sessionmaker[Session]) -> tuple[dict[str, int], dict[str, int]]:
    """(request_id -> calls.call_no, event_id -> events.call_no)."""
    with sessions() as session:
        calls = {r: n for r, n in session.execute(text("SELECT request_id, call_no FROM calls"))}
        events = {e: n for e, n in session.execute(text("SELECT event_id, call_no FROM events"))}
    return calls, events


def test_calls_are_numbered_in_the_order_first_seen_and_events_carry_the_number(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    assert store(sessions, started("a1", request_id="a"), tokens("a2", request_id="a")) == (
        IngestResult(2, 0)
    )
    # One batch: two new calls (numbered in request_id order), events of a known call.
    assert store(
        sessions,
        tokens("c1", request_id="c"),
        started("b1", request_id="b"),
        tokens("a3", request_id="a"),
    ) == IngestResult(3, 0)
    # A retried post: duplicates only, no call numbered, nothing changed.
    assert store(sessions, started("b1", request_id="b")) == IngestResult(0, 1)
    # A late event of the first call, after newer calls.
    assert store(sessions, usage("a4", request_id="a"), started("d1", request_id="d")) == (
        IngestResult(2, 0)
    )
    calls, events = numbers(sessions)
    assert calls["a"] < calls["b"] < calls["c"] < calls["d"]
    assert len(set(calls.values())) == 4
    assert events == {
        "a1": calls["a"],
        "a2": calls["a"],
        "a3": calls["a"],
        "a4": calls["a"],
        "b1": calls["b"],
        "c1": calls["c"],
        "d1": calls["d"],
    }
    check_invariants(create_engine(settings.database_url, poolclass=NullPool), rollups=False)


@pytest.mark.parametrize(
    "request_id",
    ['q"uote', "back\\slash", "literal \\u0041", "😀" * 128, "名前", "e\u0301", "null", "123"],
)
def test_a_stored_call_with_any_id_keeps_its_number_and_gets_its_key_late(
    sessions: sessionmaker[Session], request_id: str
) -> None:
    """A stored call is found again by its id, whatever characters it holds (on SQLite the
    stored calls come back as JSON text: quotes, backslashes and any script must survive), keeps
    its number, and gets its key from a ``stream.started`` that arrives after its first event."""
    assert store(sessions, tokens("t1", request_id=request_id)) == IngestResult(1, 0)
    assert store(
        sessions, started("s1", request_id=request_id), tokens("t2", request_id=request_id)
    ) == IngestResult(2, 0)
    calls, events = numbers(sessions)
    assert list(calls) == [request_id]
    assert events == {"t1": calls[request_id], "s1": calls[request_id], "t2": calls[request_id]}
    with sessions() as session:
        key = session.execute(
            text("SELECT api_key_id FROM calls WHERE request_id = :r"), {"r": request_id}
        ).scalar_one()
    assert key == "key_7f3a"


def test_the_call_log_and_the_reconciler_find_a_calls_events_by_its_number(
    client: TestClient,
) -> None:
    """Two calls whose events interleave over several posts: each call's detail lists exactly
    its events, and the settled figures are each call's own (CONTRACT "Reconciliation")."""
    posts = [
        [started("x-s", request_id="x"), started("y-s", request_id="y")],
        [tokens("x-t", request_id="x", delivered=40, generated=60)],
        [tokens("y-t", request_id="y", delivered=5, generated=9)],
        [
            disconnected(
                "x-d", request_id="x", output_tokens_delivered=40, output_tokens_generated=70
            ),
            usage("y-u", request_id="y", output_tokens=12),
        ],
        [usage("x-u", request_id="x", output_tokens=90)],
    ]
    for events in posts:
        reply = client.post("/v1/events", json={"events": events})
        assert reply.status_code == 200, reply.text
    assert client.post("/v1/reconcile", json={}).status_code == 200
    x = client.get("/v1/calls/x").json()
    y = client.get("/v1/calls/y").json()
    assert sorted(e["event_id"] for e in x["events"]) == ["x-d", "x-s", "x-t", "x-u"]
    assert sorted(e["event_id"] for e in y["events"]) == ["y-s", "y-t", "y-u"]
    assert (x["status"], x["output_tokens_billed"], x["output_tokens_delivered"]) == (
        "client_disconnected",
        90,
        40,
    )
    assert (y["status"], y["output_tokens_billed"], y["output_tokens_delivered"]) == (
        "completed",
        12,
        5,
    )


def post_while_held(
    settings: Settings, held: str, post: Callable[[], IngestResult]
) -> IngestResult | BaseException:
    """Run ``held`` (SQL) in a transaction of another connection, start ``post`` in a thread,
    wait until the post is blocked by that transaction (its statement has taken its snapshot by
    then), commit, and return what the post returned or raised. PostgreSQL only."""
    other = create_engine(settings.database_url, poolclass=NullPool)
    watcher = create_engine(settings.database_url, poolclass=NullPool)
    holder = other.connect()
    results: list[IngestResult | BaseException] = []
    try:
        trans = holder.begin()
        holder.exec_driver_sql(held)
        holder_pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def post_it() -> None:
            try:
                results.append(post())
            except BaseException as error:  # reported by the caller's assertion
                results.append(error)

        thread = threading.Thread(target=post_it)
        thread.start()
        # 30 s: on a loaded CI machine the post's thread may start late; what every backend of
        # this database waited on is printed if it never blocks, so a failure says why.
        deadline = time.monotonic() + 30
        with watcher.connect() as conn:
            while time.monotonic() < deadline:
                blocked = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE :pid = ANY(pg_blocking_pids(pid))"
                    ),
                    {"pid": holder_pid},
                ).scalar_one()
                if blocked or results:
                    break
                time.sleep(0.02)
            backends = []
            if not blocked:
                backends = conn.execute(
                    text(
                        "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), "
                        "left(query, 120) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
        assert blocked, (
            f"the post did not wait for the other transaction (pid {holder_pid}): {results}; "
            f"backends: {backends}"
        )
        trans.commit()
        thread.join(timeout=30)
    finally:
        holder.close()
        other.dispose()
        watcher.dispose()
    assert len(results) == 1
    return results[0]


_INSERT_RACE_CALL = (
    "INSERT INTO calls (call_no, request_id, first_received_at, last_received_at, "
    "change_seq, pending, status, settled, attempts, anomalies) VALUES "
    "(nextval('calls_call_no_seq'), 'race', now(), now(), 1, true, 'open', false, 0, '[]')"
)


def _store_in_session(sessions: sessionmaker[Session], *events: dict[str, Any]) -> IngestResult:
    now = datetime.now(UTC)
    with sessions.begin() as session:
        return store_batch(session, parse_batch(orjson.dumps({"events": list(events)}), now), now)


@pytest.mark.parametrize("writer", ["write_group", "store_batch"])
def test_postgres_a_call_committed_by_another_transaction_meanwhile(
    sessions: sessionmaker[Session], settings: Settings, is_postgres: bool, writer: str
) -> None:
    """The call is inserted by a transaction that commits after this post's statement has taken
    its snapshot: the post waits for it, cannot create it and did not see it to lock it. The
    group writer rolls back and writes the group again (a new snapshot sees the call);
    ``store_batch``, in its caller's transaction, gives the events the call's number with a
    second statement. Either way the events carry that call's number."""
    if not is_postgres:
        pytest.skip("PostgreSQL: SQLite has one writer, so no other transaction can interleave")
    write = {"write_group": store, "store_batch": _store_in_session}[writer]
    event = tokens("race-t", request_id="race")
    result = post_while_held(settings, _INSERT_RACE_CALL, lambda: write(sessions, event))
    assert result == IngestResult(1, 0)
    calls, events = numbers(sessions)
    assert calls["race"] is not None
    assert events == {"race-t": calls["race"]}


def test_postgres_a_post_waits_for_a_reconciler_settling_the_call_and_marks_it_pending(
    sessions: sessionmaker[Session], settings: Settings, is_postgres: bool
) -> None:
    """A reconciler holds a pending call's row (it read the call's events, and clears
    ``pending``) while a post brings a new event of that call: the post waits for it and then
    marks the call pending again, so that the new event is reconciled. (Read in the post's
    snapshot the call is pending and would need no write: only the lock taken by the events
    statement shows the reconciler's result.)"""
    if not is_postgres:
        pytest.skip("PostgreSQL: on SQLite the reconciler and ingest share one writer")
    store(sessions, started("s", request_id="r"))
    held = (
        "SELECT 1 FROM calls WHERE request_id = 'r' FOR UPDATE; "
        "UPDATE calls SET pending = false WHERE request_id = 'r'"
    )
    result = post_while_held(settings, held, lambda: store(sessions, tokens("t", request_id="r")))
    assert result == IngestResult(1, 0)
    with sessions() as session:
        pending, change_seq = session.execute(
            text("SELECT pending, change_seq FROM calls WHERE request_id = 'r'")
        ).one()
    assert (pending, change_seq) == (True, 2)
