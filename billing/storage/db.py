"""Database engines and transactions for SQLite (WAL) and PostgreSQL (psycopg 3)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from billing.settings import Settings


def make_engine(settings: Settings) -> Engine:
    """Create the engine for ``settings.database_url``.

    SQLite: WAL journal, ``synchronous=FULL`` (an acknowledged event is on disk), a busy timeout of
    ``sqlite_busy_timeout_ms``, foreign keys on, and write transactions that begin with
    ``BEGIN IMMEDIATE`` so that two writers queue on the lock instead of failing to upgrade.
    PostgreSQL: a pooled psycopg 3 engine with pre-ping, so a cut connection is replaced.
    """
    url = settings.database_url
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"timeout": settings.sqlite_busy_timeout_ms / 1000, "check_same_thread": False},
            pool_size=settings.db_pool_size,
            max_overflow=20,
            pool_pre_ping=False,
        )
        _configure_sqlite(engine, settings.sqlite_busy_timeout_ms)
        return engine
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=20,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5},
    )


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control from the driver: SQLAlchemy emits BEGIN itself (below).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory; sessions never expire objects on commit (handlers read after commit)."""
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


@contextmanager
def write_transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One write transaction: commits on success, rolls back on any exception.

    On SQLite it begins with ``BEGIN IMMEDIATE`` (the write lock is taken up front, so concurrent
    writers wait up to the busy timeout instead of deadlocking on a lock upgrade).
    """
    with factory() as session:
        session.connection(execution_options={"sqlite_immediate": True})
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def read_transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One read-only transaction (a consistent snapshot); always rolled back at the end."""
    with factory() as session:
        try:
            yield session
        finally:
            session.rollback()


def is_unavailable(error: BaseException) -> bool:
    """Whether a database error means "the database is unavailable now" (answer 503, retry).

    True for connection failures, a cut connection, and a SQLite database that stays locked past
    the busy timeout; false for errors that a retry would not fix.
    """
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, OperationalError):
        return True
    orig = getattr(error, "orig", None)
    return isinstance(orig, sqlite3.OperationalError)
