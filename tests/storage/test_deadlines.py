"""Issue 29, a database that stops answering is an outage, not a hang: statement deadlines on
both databases (``billing.storage.db``), and the reconciler's one-line outage and back-off
(``billing.reconcile.runner.Backoff``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from billing.reconcile.runner import MAX_OUTAGE_PAUSE_S, Backoff, run_pass
from billing.settings import Settings
from billing.storage.db import is_unavailable, make_engine, make_sessionmaker
from tests.tcp_proxy import TcpProxy

#: A statement that runs for minutes on SQLite (a recursive count to a billion).
SLOW_SQLITE = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) "
    "SELECT count(*) FROM n"
)


def test_a_statement_past_its_deadline_fails_as_an_outage(db_url: str, is_postgres: bool) -> None:
    engine = make_engine(Settings(database_url=db_url, db_statement_timeout_s=0.5))
    slow = "SELECT pg_sleep(30)" if is_postgres else SLOW_SQLITE
    started = time.monotonic()
    with pytest.raises(OperationalError) as caught, engine.connect() as conn:
        conn.execute(text(slow))
    took = time.monotonic() - started
    # PostgreSQL cancels it at statement_timeout; SQLite's is interrupted by the watchdog.
    assert took < 0.5 + 1.0 + 1.0, took
    assert is_unavailable(caught.value)
    with engine.connect() as conn:  # the engine serves again at once
        assert conn.execute(text("SELECT 1")).scalar() == 1
    engine.dispose()


def test_a_blackholed_postgres_fails_within_the_deadline(db_url: str, is_postgres: bool) -> None:
    if not is_postgres:
        pytest.skip("a database host behind a proxy (SQLite is a local file)")
    target = make_url(db_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        via = target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        engine = make_engine(Settings(database_url=via, db_statement_timeout_s=1.0))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
            proxy.blackhole()
            started = time.monotonic()
            with pytest.raises(OperationalError) as caught:
                conn.execute(text("SELECT 2"))
            took = time.monotonic() - started
        # statement_timeout (1 s) cannot arrive: the watchdog cuts it 1 s later.
        assert 1.9 < took < 3.5, took
        assert is_unavailable(caught.value)
        proxy.resume()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 3")).scalar() == 3
        engine.dispose()


def _unreachable(tmp_path: Path, is_postgres: bool) -> Settings:
    if is_postgres:
        with TcpProxy("127.0.0.1", 9) as proxy:  # a port just freed: nobody listens
            port = proxy.port
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/billing"
    else:
        url = f"sqlite:///{tmp_path / 'no-such-directory' / 'billing.db'}"
    return Settings(database_url=url, reconcile_interval_s=2.0)


def test_the_reconciler_says_an_outage_in_one_line_and_backs_off(
    tmp_path: Path, is_postgres: bool, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _unreachable(tmp_path, is_postgres)
    sessions = make_sessionmaker(make_engine(settings))
    backoff = Backoff(settings.reconcile_interval_s)
    pauses = []
    with caplog.at_level(logging.DEBUG, logger="billing.reconcile"):
        for _ in range(8):
            with pytest.raises(OperationalError) as caught:
                run_pass(sessions, settings)
            assert backoff.failed(caught.value)
            pauses.append(backoff.pause_s)
    assert pauses == [4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    assert MAX_OUTAGE_PAUSE_S == 60.0
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    line = record.getMessage()
    assert "\n" not in line and line.startswith("database unavailable (OperationalError: ")
    assert line.endswith("reconciliation paused, retrying with growing pauses up to 60 s")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="billing.reconcile"):
        backoff.succeeded()
        backoff.succeeded()
    assert [r.getMessage() for r in caplog.records] == [
        "database available again after 8 failed passes; reconciliation resumed"
    ]
    assert backoff.pause_s == 2.0


def test_an_error_that_is_not_an_outage_is_not_backed_off() -> None:
    backoff = Backoff(2.0)
    assert not backoff.failed(ValueError("a bug"))
    assert backoff.pause_s == 2.0
