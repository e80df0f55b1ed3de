"""The budgets' advisory locks on PostgreSQL (CONTRACT "Authorizations and holds (v3)": admission
atomic per budget): an authorization's budgets, and a step's alerts, are locked in one statement,
each lock in ascending order of its key, so that two transactions over the same budgets never
wait for each other. (SQLite: one writer at a time, no lock to take.)"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, text

from billing.budgets.repository import repository
from billing.budgets.sql.postgres import ALERT_LOCKS, HOLD_LOCKS
from billing.storage.db import write_transaction
from tests.budgets.helpers import state

_MINE = text(
    "SELECT classid::bigint * 4294967296 + objid::bigint, granted FROM pg_locks "
    "WHERE locktype = 'advisory' AND pid = :pid ORDER BY 1"
)


def _locks(client: TestClient, pid: int) -> list[tuple[int, bool]]:
    with state(client).engine.connect() as conn:
        return [(int(key), bool(granted)) for key, granted in conn.execute(_MINE, {"pid": pid})]


@pytest.fixture
def postgres(is_postgres: bool) -> None:
    if not is_postgres:
        pytest.skip("SQLite runs one write transaction at a time")


@pytest.mark.usefixtures("postgres")
def test_every_budget_is_locked_in_one_statement(client: TestClient) -> None:
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    with write_transaction(state(client).sessions) as session:
        conn = session.connection()
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        event.listen(conn, "before_cursor_execute", count)
        try:
            repository(session).lock_budgets(session, [9, 3, 5])
            repository(session).lock_alerts(session, [4, 2])
        finally:
            event.remove(conn, "before_cursor_execute", count)
        held = _locks(client, pid)
    assert len(statements) == 2
    assert held == sorted(
        [(HOLD_LOCKS + row, True) for row in (3, 5, 9)]
        + [(ALERT_LOCKS + row, True) for row in (2, 4)]
    )


@pytest.mark.usefixtures("postgres")
def test_the_locks_are_taken_in_ascending_order(client: TestClient) -> None:
    """Budget 5 held by another transaction: the authorization over 9, 3 and 5 holds 3 and
    waits for 5, without 9; once 5 is free it holds all three."""
    sessions = state(client).sessions
    started, free, done, end = (threading.Event() for _ in range(4))
    pids: list[int] = []

    def holder() -> None:
        with write_transaction(sessions) as session:
            session.connection().execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": HOLD_LOCKS + 5}
            )
            started.set()
            assert free.wait(30)

    def authorization() -> None:
        with write_transaction(sessions) as session:
            pids.append(session.connection().execute(text("SELECT pg_backend_pid()")).scalar_one())
            repository(session).lock_budgets(session, [9, 3, 5])
            done.set()
            assert end.wait(30)

    first = threading.Thread(target=holder)
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=authorization)
    second.start()
    deadline = time.monotonic() + 30
    while not (pids and (HOLD_LOCKS + 5, False) in _locks(client, pids[0])):
        assert time.monotonic() < deadline, "the authorization never waited for budget 5"
        time.sleep(0.05)
    assert _locks(client, pids[0]) == [(HOLD_LOCKS + 3, True), (HOLD_LOCKS + 5, False)]
    assert not done.is_set()
    free.set()
    first.join(30)
    assert done.wait(30)
    assert _locks(client, pids[0]) == [(HOLD_LOCKS + row, True) for row in (3, 5, 9)]
    end.set()
    second.join(30)
