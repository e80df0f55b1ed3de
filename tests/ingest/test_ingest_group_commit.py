"""Group commit (``billing.ingest.writer``): batches that share one transaction each keep the
outcome they would have had alone, in arrival order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import EventConflict
from billing.ingest.service import IngestResult, PreparedBatch, prepare_batch, write_group
from billing.ingest.validation import parse_batch
from billing.ingest.writer import SPLIT_EVENTS, GroupWriter, new_writer
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker, write_connection
from billing.storage.models import Call, Event
from tests.builders import RECENT as T0
from tests.builders import seed_started as started
from tests.builders import seed_tokens as tokens
from tests.builders import seed_usage as usage


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def batch(*events: dict[str, Any]) -> PreparedBatch:
    now = datetime.now(UTC)
    return prepare_batch(parse_batch(orjson.dumps({"events": list(events)}), now), now)


def stored_ids(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as session:
        return set(session.scalars(select(Event.event_id)))


def test_a_repeat_in_a_later_batch_of_the_group_is_a_duplicate(
    sessions: sessionmaker[Session],
) -> None:
    results = write_group(
        sessions, [batch(started("s"), tokens("t")), batch(tokens("t"), usage("u"))]
    )
    assert results == [IngestResult(2, 0), IngestResult(1, 1)]
    assert stored_ids(sessions) == {"s", "t", "u"}


def test_a_conflict_with_an_earlier_batch_of_the_group_refuses_only_the_later_one(
    sessions: sessionmaker[Session],
) -> None:
    results = write_group(
        sessions,
        [
            batch(started("s"), tokens("t", generated=10)),
            batch(usage("u"), tokens("t", generated=99)),
            batch(tokens("t", generated=10), tokens("t2", generated=20)),
        ],
    )
    assert results[0] == IngestResult(2, 0)
    assert isinstance(results[1], EventConflict)
    assert [(c.index, c.event_id) for c in results[1].conflicts] == [(1, "t")]
    assert results[2] == IngestResult(1, 1)
    assert stored_ids(sessions) == {"s", "t", "t2"}  # nothing of the refused batch


def test_a_conflict_with_a_stored_event_refuses_its_batch_and_not_the_others(
    sessions: sessionmaker[Session],
) -> None:
    assert write_group(sessions, [batch(usage("x", output_tokens=1))]) == [IngestResult(1, 0)]
    results = write_group(
        sessions,
        [
            batch(started("a")),
            batch(tokens("y"), usage("x", output_tokens=2)),  # x differs from the stored one
            batch(tokens("y")),  # new: the batch before it stored nothing
        ],
    )
    assert results[0] == IngestResult(1, 0)
    assert isinstance(results[1], EventConflict)
    assert [(c.index, c.event_id) for c in results[1].conflicts] == [(1, "x")]
    assert results[2] == IngestResult(1, 0)
    assert stored_ids(sessions) == {"x", "a", "y"}


def test_the_first_batch_with_a_stream_started_names_the_call(
    sessions: sessionmaker[Session],
) -> None:
    write_group(
        sessions,
        [
            batch(tokens("t", request_id="r")),
            batch(started("s2", request_id="r", api_key_id="key_first", attempt=2)),
            batch(started("s1", request_id="r", api_key_id="key_second")),
        ],
    )
    with sessions() as session:
        call = session.get_one(Call, "r")
        assert (call.api_key_id, call.started_at, call.pending) == ("key_first", T0, True)
        assert session.scalar(select(func.count()).select_from(Call)) == 1


def test_a_call_stored_without_a_key_gets_it_from_a_later_group(
    sessions: sessionmaker[Session],
) -> None:
    write_group(sessions, [batch(tokens("t", request_id="r"))])
    write_group(sessions, [batch(started("s", request_id="r", metadata={"team": "x"}))])
    write_group(sessions, [batch(started("s9", request_id="r", api_key_id="key_late"))])
    with sessions() as session:
        call = session.get_one(Call, "r")
        assert (call.api_key_id, call.metadata_, call.pending) == ("key_7f3a", {"team": "x"}, True)


def test_the_writer_answers_every_batch_after_its_commit(sessions: sessionmaker[Session]) -> None:
    writer = GroupWriter(sessions, max_threads=2)

    async def post_all() -> list[IngestResult]:
        futures = [
            asyncio.wrap_future(writer.submit(batch(tokens(f"t{i}", request_id=f"r{i % 7}"))))
            for i in range(200)
        ]
        return await asyncio.gather(*futures)

    results = asyncio.run(post_all())
    assert results == [IngestResult(1, 0)] * 200
    assert len(stored_ids(sessions)) == 200


def test_the_writer_is_busy_for_a_second_after_a_batch(sessions: sessionmaker[Session]) -> None:
    """What the background reconciler asks before each step (short steps while busy)."""
    writer = GroupWriter(sessions, max_threads=1)
    assert writer.busy() is False
    future = writer.submit(batch(tokens("busy-1")))
    assert writer.busy() is True  # from the submit, not the commit
    assert future.result(timeout=30) == IngestResult(1, 0)
    assert writer.busy(within_s=0.0) is False
    time.sleep(0.2)
    assert writer.busy(within_s=0.1) is False
    assert writer.busy(within_s=60.0) is True


def test_store_answers_on_the_event_loop_after_the_commit(sessions: sessionmaker[Session]) -> None:
    """``GroupWriter.store`` (what the HTTP handler awaits): each batch gets its own outcome,
    a conflicting batch its 409 error, and the others are stored."""
    writer = GroupWriter(sessions, max_threads=1)
    writer.submit(batch(tokens("t0", request_id="r0"))).result()

    async def post_all() -> list[IngestResult | BaseException]:
        batches = [batch(tokens(f"t{i}", request_id=f"r{i % 7}")) for i in range(100)]
        batches.append(batch(tokens("t0", request_id="r0", generated=999)))
        return await asyncio.gather(*(writer.store(b) for b in batches), return_exceptions=True)

    results = asyncio.run(post_all())
    assert results[0] == IngestResult(0, 1)
    assert results[1:100] == [IngestResult(1, 0)] * 99
    assert isinstance(results[100], EventConflict)
    assert [(c.index, c.event_id) for c in results[100].conflicts] == [(0, "t0")]
    assert len(stored_ids(sessions)) == 100


def _writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "billing-ingest-writer"}


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


@contextmanager
def _writes_held(
    sessions: sessionmaker[Session], settings: Settings, is_postgres: bool
) -> Iterator[None]:
    """Block every ingest write until the block ends (SQLite: the engine's write lock;
    PostgreSQL: a lock on ``events`` that inserts wait for)."""
    if not is_postgres:
        with write_connection(sessions):
            yield
        return
    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("LOCK TABLE events IN EXCLUSIVE MODE")
            yield
    finally:
        engine.dispose()


def test_many_small_posts_share_one_writer_thread(sessions: sessionmaker[Session]) -> None:
    """Posts of a few events never start a second writer (each would write smaller groups, a
    transaction's round trips each): fewer than ``SPLIT_EVENTS`` events ever wait."""
    before = _writer_threads()
    writer = GroupWriter(sessions, max_threads=3)

    async def post_all() -> list[IngestResult]:
        return await asyncio.gather(
            *(writer.store(batch(tokens(f"t{i}", request_id=f"r{i % 13}"))) for i in range(400))
        )

    assert asyncio.run(post_all()) == [IngestResult(1, 0)] * 400
    assert len(_writer_threads() - before) == 1
    assert len(stored_ids(sessions)) == 400


def test_large_batches_waiting_start_more_writers_that_end_on_small_groups(
    sessions: sessionmaker[Session], settings: Settings, is_postgres: bool
) -> None:
    """While ``SPLIT_EVENTS`` events wait for a busy writer another one starts (up to the
    maximum); a writer that then writes a small group while others run ends."""
    before = _writer_threads()
    writer = GroupWriter(sessions, max_threads=3)
    big = [
        batch(*(tokens(f"b{k}-{i}", request_id=f"rb{k}") for i in range(SPLIT_EVENTS)))
        for k in range(4)
    ]
    with _writes_held(sessions, settings, is_postgres):
        futures = []
        for k, item in enumerate(big):
            futures.append(writer.submit(item))
            if k < 3:
                # Taken by a writer (which then waits for the held writes) before the next one
                # comes: the 2nd and 3rd find every writer busy and start one each.
                _wait_until(lambda: writer._waiting == 0, f"batch {k} was taken")
                _wait_until(
                    lambda n=k + 1: len(_writer_threads() - before) == n,  # type: ignore[misc]
                    f"writer {k + 1}",
                )
        time.sleep(0.05)
        assert len(_writer_threads() - before) == 3  # the 4th waits for a busy writer
    assert [f.result() for f in futures] == [IngestResult(SPLIT_EVENTS, 0)] * 4
    for i in range(6):  # small posts, one at a time: a writer that writes one ends
        assert writer.submit(batch(tokens(f"s{i}", request_id="rs"))).result() == IngestResult(1, 0)
    _wait_until(lambda: len(_writer_threads() - before) == 1, "one writer is left")
    assert len(stored_ids(sessions)) == 4 * SPLIT_EVENTS + 6


def test_a_writer_thread_that_dies_is_replaced(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer thread ended by an unexpected error is no longer counted: the next post starts
    another one instead of waiting for ever."""
    writer = GroupWriter(sessions, max_threads=3)
    real_write = writer._write
    calls = 0

    def write_once_then_die(group: Any) -> None:
        nonlocal calls
        calls += 1
        real_write(group)
        if calls == 1:
            raise RuntimeError("writer thread bug")

    monkeypatch.setattr(writer, "_write", write_once_then_die)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the thread's traceback
    assert writer.submit(batch(tokens("d1", request_id="rd"))).result(5) == IngestResult(1, 0)
    _wait_until(lambda: writer._threads == 0, "the dead thread is uncounted")
    assert writer.submit(batch(tokens("d2", request_id="rd"))).result(5) == IngestResult(1, 0)
    assert {"d1", "d2"} <= stored_ids(sessions)


def test_a_writer_connection_killed_while_idle_is_replaced_without_an_error(
    settings: Settings, is_postgres: bool
) -> None:
    """PostgreSQL: the writers' engine does not pre-ping; a connection the server dropped since
    its last use (a restart, an idle-session kill) is found dead by the group's first statement,
    and the group is written again on a fresh connection instead of answering 503."""
    if not is_postgres:
        pytest.skip("PostgreSQL: SQLite connections are files, they do not die")
    writer = new_writer(settings, make_sessionmaker(make_engine(settings)))
    try:
        assert writer.submit(batch(tokens("t1", request_id="r1"))).result() == IngestResult(1, 0)
        killer = make_engine(settings)
        with killer.begin() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        killer.dispose()
        assert killed >= 1  # the writer's pooled connection among them
        result = writer.submit(batch(tokens("t2", request_id="r2"), tokens("t1", request_id="r1")))
        assert result.result() == IngestResult(1, 1)
    finally:
        writer.close()
    with make_engine(settings).connect() as conn:
        stored = conn.execute(select(Event.event_id).order_by(Event.event_id)).scalars().all()
    assert stored == ["t1", "t2"]
