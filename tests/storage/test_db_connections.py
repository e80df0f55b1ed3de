"""PostgreSQL connections notice a database host that went away without closing them."""

from __future__ import annotations

import os
import socket

import pytest
from sqlalchemy import text

from billing.settings import Settings
from billing.storage.db import make_engine


def _tcp_options(url: str) -> dict[str, int]:
    engine = make_engine(Settings(database_url=url))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            sock = socket.socket(fileno=os.dup(dbapi.fileno()))
            try:
                return {
                    "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                    "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                }
            finally:
                sock.close()  # the duplicate only
    finally:
        engine.dispose()


def test_a_vanished_database_host_is_noticed_in_seconds_not_hours(
    is_postgres: bool, db_url: str
) -> None:
    """The kernel's own defaults (keepalive after 2 h idle, no user timeout) would leave a
    statement waiting on a crashed or partitioned host for hours; the sockets carry ours."""
    if not is_postgres:
        pytest.skip("PostgreSQL connections (SQLite is a local file)")
    assert _tcp_options(db_url) == {
        "keepalive": 1,
        "idle": 10,
        "interval": 5,
        "count": 3,
        "user_timeout_ms": 30_000,
    }


def test_the_database_url_overrides_the_connection_defaults(is_postgres: bool, db_url: str) -> None:
    if not is_postgres:
        pytest.skip("PostgreSQL connections (SQLite is a local file)")
    separator = "&" if "?" in db_url else "?"
    options = _tcp_options(f"{db_url}{separator}keepalives_idle=60&tcp_user_timeout=5000")
    assert (options["idle"], options["user_timeout_ms"], options["count"]) == (60, 5000, 3)
