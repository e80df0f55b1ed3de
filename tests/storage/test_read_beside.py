"""``read_beside``: a read of a transaction's snapshot on a second PostgreSQL connection (the
console's Overview reads its budgets so), or on the session itself where it cannot be."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from billing.settings import Settings
from billing.storage.db import (
    make_engine,
    make_sessionmaker,
    read_beside,
    read_transaction,
    single_reads,
    write_transaction,
)


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings)
    try:
        with write_transaction(make_sessionmaker(engine)) as session:
            session.execute(text("DELETE FROM budget_generation"))
            session.execute(text("INSERT INTO budget_generation (id, generation) VALUES (1, 7)"))
        yield make_sessionmaker(engine)
    finally:
        engine.dispose()


def _bump(sessions: sessionmaker[Session]) -> None:
    with write_transaction(sessions) as session:
        session.execute(text("UPDATE budget_generation SET generation = generation + 1"))


def _generation(session: Session) -> int:
    return int(session.scalar(text("SELECT generation FROM budget_generation")))


def _backend(session: Session) -> int:
    return int(session.scalar(text("SELECT pg_backend_pid()")))


def test_the_read_beside_sees_the_transactions_snapshot(
    sessions: sessionmaker[Session], is_postgres: bool
) -> None:
    """A commit after the transaction's snapshot is seen by neither the transaction nor the
    read beside it; on PostgreSQL that read runs on another connection (another backend)."""
    with read_transaction(sessions) as session:
        assert _generation(session) == 7  # the snapshot is taken
        _bump(sessions)
        seen: list[Session] = []

        def read(reader: Session) -> tuple[int, int | None]:
            seen.append(reader)
            return _generation(reader), _backend(reader) if is_postgres else None

        with read_beside(session, read) as answer:
            assert _generation(session) == 7
            generation, backend = answer()
        assert generation == 7
        if is_postgres:
            assert seen[0] is not session
            assert backend != _backend(session)
        else:
            assert seen == [session]
    with read_transaction(sessions) as session:
        assert _generation(session) == 8


def test_outside_a_repeatable_read_the_read_runs_on_the_session(
    sessions: sessionmaker[Session],
) -> None:
    """A session whose statements each read their own snapshot (``single_reads``: autocommit
    on PostgreSQL) has no snapshot to share: the read runs on it, when its answer is asked."""
    with single_reads(sessions) as session:
        seen: list[Session] = []

        def read(reader: Session) -> int:
            seen.append(reader)
            return _generation(reader)

        with read_beside(session, read) as answer:
            assert seen == []
            _bump(sessions)
            assert answer() == 8
        assert seen == [session]


def test_the_read_besides_error_is_raised_by_its_answer(
    sessions: sessionmaker[Session],
) -> None:
    def read(reader: Session) -> int:
        return int(reader.scalar(text("SELECT generation FROM no_such_table")))

    with (
        read_transaction(sessions) as session,
        read_beside(session, read) as answer,
        pytest.raises(Exception, match="no_such_table"),
    ):
        answer()
    with read_transaction(sessions) as session:  # the connections are usable again
        assert _generation(session) == 7
