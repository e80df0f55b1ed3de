"""Database engines and transactions for SQLite (WAL) and PostgreSQL (psycopg 3)."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from billing.settings import Settings

T = TypeVar("T")


def make_engine(
    settings: Settings,
    *,
    pre_ping: bool = True,
    pool_size: int | None = None,
    url: str | None = None,
) -> Engine:
    """Create the engine for ``url`` (by default ``settings.database_url``).

    SQLite: WAL journal, ``synchronous=FULL`` (an acknowledged event is on disk), a busy timeout of
    ``sqlite_busy_timeout_ms``, foreign keys on, and write transactions that begin with
    ``BEGIN IMMEDIATE`` so that two writers queue on the lock instead of failing to upgrade.
    PostgreSQL: a pooled psycopg 3 engine (``pool_size``, default ``db_pool_size``) with
    pre-ping, so a cut connection is replaced before it is used; ``pre_ping=False`` saves that
    round trip per checkout for a user that retries a transaction whose connection turns out
    to be dead (``billing.ingest.service.write_group``).
    """
    url = url or settings.database_url
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={
                "timeout": settings.sqlite_busy_timeout_ms / 1000,
                "check_same_thread": False,
            },
            pool_size=settings.db_pool_size,
            max_overflow=20,
            pool_pre_ping=False,
        )
        _configure_sqlite(engine, settings.sqlite_busy_timeout_ms)
        _watch_statements(engine, settings.db_statement_timeout_s, _interrupt_sqlite)
        lock = WriteLock()
        _WRITE_LOCKS[engine] = lock
        path = engine.url.database
        if path and path != ":memory:" and not path.startswith("file:"):
            _CHECKPOINTERS[engine] = _Checkpointer(path, lock, settings.sqlite_busy_timeout_ms)
        return engine
    given = make_url(url).query
    connect_args: dict[str, Any] = {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in given}
    if "options" not in given:
        # jit=off: the service's statements are short, and PostgreSQL's JIT (on above a plan
        # cost of 100,000) compiles for tens of milliseconds where a statement runs for a few:
        # the console's budgets near their limit cross that cost at about 12,000 budgets.
        connect_args["options"] = (
            f"-c statement_timeout={int(settings.db_statement_timeout_s * 1000)} -c jit=off"
        )
    engine = create_engine(
        url,
        pool_size=pool_size or settings.db_pool_size,
        max_overflow=20,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        connect_args=connect_args,
    )
    # The server cancels a statement past statement_timeout itself; the watchdog's grace lets
    # that answer arrive first, and catches the statements of a server that cannot answer.
    _watch_statements(engine, settings.db_statement_timeout_s + _WATCHDOG_GRACE_S, _cut_socket)
    return engine


#: Seconds past ``statement_timeout`` before the watchdog cuts a PostgreSQL connection.
_WATCHDOG_GRACE_S = 1.0
#: How often the watchdog looks at the statements under way (seconds).
_WATCHDOG_EVERY_S = 0.25


class _Watchdog:
    """Ends the statements that wait past their deadline for a database that does not answer.

    A database host that goes silent (a partition, a proxy that stops forwarding, a hung disk)
    leaves a statement waiting for ever: the local TCP stack keeps acknowledging, so neither
    keepalives nor ``tcp_user_timeout`` notice anything when a proxy holds the other end. Every
    statement, COMMIT and ROLLBACK that goes through SQLAlchemy is registered here while it runs;
    one daemon thread per process ``kill``s the connection of those past their deadline
    (PostgreSQL: its socket is shut down, so the driver fails as for a cut connection and
    SQLAlchemy discards it; SQLite: ``interrupt()``). The statement then raises the database's
    error, which ``is_unavailable`` takes for an outage: the request answers 503.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[float, Any, Callable[[Any], None]]] = {}
        self._thread: threading.Thread | None = None

    def start(self, connection: Any, deadline_s: float, kill: Callable[[Any], None]) -> int:
        key = id(connection)
        self._running[key] = (time.monotonic() + deadline_s, connection, kill)
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._watch, name="billing-db-watchdog", daemon=True
                    )
                    self._thread.start()
        return key

    def stop(self, key: int) -> None:
        self._running.pop(key, None)

    def _watch(self) -> None:
        while True:
            time.sleep(_WATCHDOG_EVERY_S)
            now = time.monotonic()
            for key, (deadline, connection, kill) in list(self._running.items()):
                if now > deadline and self._running.get(key, (None,))[0] == deadline:
                    self._running.pop(key, None)
                    with contextlib.suppress(Exception):
                        kill(connection)


_WATCHDOG = _Watchdog()


def _cut_socket(connection: Any) -> None:
    """Shut down a psycopg connection's socket (the blocked driver sees the connection end)."""
    with socket.socket(fileno=os.dup(connection.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _interrupt_sqlite(connection: Any) -> None:
    connection.interrupt()


def _watch_statements(engine: Engine, deadline_s: float, kill: Callable[[Any], None]) -> None:
    """Register every statement, COMMIT and ROLLBACK of ``engine`` with the watchdog."""
    dialect = engine.dialect

    def watched(method: Callable[..., Any], of_cursor: bool) -> Callable[..., Any]:
        def run(target: Any, *args: Any, **kwargs: Any) -> Any:
            key = _WATCHDOG.start(target.connection if of_cursor else target, deadline_s, kill)
            try:
                return method(target, *args, **kwargs)
            finally:
                _WATCHDOG.stop(key)

        return run

    for name, of_cursor in (
        ("do_execute", True),
        ("do_executemany", True),
        ("do_execute_no_params", True),
        ("do_commit", False),
        ("do_rollback", False),
        ("do_ping", False),
    ):
        setattr(dialect, name, watched(getattr(dialect, name), of_cursor))


#: libpq settings of every PostgreSQL connection, unless the database URL gives its own
#: (``?keepalives_idle=60``): a connection attempt gives up after 5 s; a database host that
#: disappears without closing the connection (a crash, a partition) is noticed within about 25 s
#: by a statement waiting for it (TCP keepalive probes after 10 s of silence, every 5 s, 3 missed)
#: or 30 s after data it sent went unacknowledged (``tcp_user_timeout``, ms), instead of the
#: kernel's default of more than 2 hours; the statement then fails as a database outage (503).
PG_CONNECT_DEFAULTS: dict[str, int] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


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
        # An in-memory database for a transaction's working tables (the reconciler's common
        # calls, billing.reconcile.fastpath): a TEMP table lives in a file of its own, journaled;
        # ATTACH cannot run inside a transaction, so here.
        cursor.execute("ATTACH DATABASE ':memory:' AS scratch")
        # Checkpoints run in the background (``_Checkpointer``), off the committing request's
        # path; this is only the fallback for writes that do not go through write_transaction.
        cursor.execute(f"PRAGMA wal_autocheckpoint={_FALLBACK_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory; sessions never expire objects on commit (handlers read after commit)."""
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


#: WAL size (pages) at which a writer connection checkpoints by itself (SQLite's default is 1000):
#: only reached when the background checkpointer is not running.
_FALLBACK_AUTOCHECKPOINT_PAGES = 16384
#: The background checkpointer's cadence, the WAL size (frames) above which it restarts the WAL
#: (so that writers reuse the file from its start instead of growing it), and its idle exit.
#: A restart holds the write lock for the frames written since the last checkpoint and a flush
#: of the database file: 100-250 ms on a busy disk, when every writer (an authorization too)
#: waits; 8192 frames (32 MiB of 4 KiB pages) makes it half as frequent as 4096 did, and stays
#: well under ``_FALLBACK_AUTOCHECKPOINT_PAGES``, where a committing writer would checkpoint.
_CHECKPOINT_EVERY_S = 1.0
_RESTART_AT_FRAMES = 8192
_CHECKPOINT_IDLE_S = 2.0
_RESTART_WAIT_MS = 50


class _Checkpointer:
    """Background WAL checkpoints for one SQLite file, so commits only append to the WAL.

    A commit with ``synchronous=FULL`` writes its pages to the WAL and flushes it: that is what
    makes an acknowledged event durable, and it is unchanged. Copying the WAL back into the
    database file (a checkpoint) is separate work that SQLite would otherwise do inside a commit
    every 1000 pages; here a thread does it every ``_CHECKPOINT_EVERY_S`` while writes happen
    (``PASSIVE``: writers carry on meanwhile), then restarts the WAL under the in-process write lock
    once it is large. The thread ends after ``_CHECKPOINT_IDLE_S`` without a write.
    """

    def __init__(self, path: str, lock: WriteLock, busy_timeout_ms: int) -> None:
        self._path = path
        self._lock = lock
        self._busy_timeout_ms = busy_timeout_ms
        self._guard = threading.Lock()
        self._running = False
        self._last_write = 0.0

    def poke(self) -> None:
        """A write was committed: make sure the checkpointer runs."""
        self._last_write = time.monotonic()
        if self._running:
            return
        with self._guard:
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._run, name="billing-sqlite-checkpoint", daemon=True).start()

    def _run(self) -> None:
        try:
            # A short busy timeout: RESTART waits for readers still on the old WAL (an export
            # can read for minutes) while this thread holds the in-process write lock, so it
            # gives up quickly and tries again at the next round instead.
            conn = sqlite3.connect(
                self._path,
                isolation_level=None,
                check_same_thread=False,
                timeout=min(self._busy_timeout_ms, _RESTART_WAIT_MS) / 1000,
            )
        except sqlite3.Error:
            with self._guard:
                self._running = False
            return
        try:
            conn.execute("PRAGMA synchronous=FULL")
            while True:
                time.sleep(_CHECKPOINT_EVERY_S)
                idle = time.monotonic() - self._last_write > _CHECKPOINT_IDLE_S
                try:
                    _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if frames >= _RESTART_AT_FRAMES:
                        with self._lock:
                            conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                except sqlite3.Error:
                    pass  # busy or locked: the next round tries again
                if idle:
                    with self._guard:
                        if time.monotonic() - self._last_write > _CHECKPOINT_IDLE_S:
                            self._running = False
                            return
        finally:
            conn.close()


_CHECKPOINTERS: weakref.WeakKeyDictionary[Engine, _Checkpointer] = weakref.WeakKeyDictionary()


class WriteLock:
    """A re-entrant lock whose urgent waiters go first: the in-process queue for SQLite's one
    write lock.

    A request that waits on its answer (``POST /v1/authorizations``, any write of
    ``billing.api.state.write``) takes it ``urgent``: while an urgent waiter waits, the lock goes
    to it as soon as it is free, not to a reconciliation step, the checkpointer's WAL restart,
    the webhook worker or the ingest group writer that were waiting too (a plain ``RLock``
    hands it to whichever thread wakes first: an authorization then waited for a whole step of
    100-500 ms after the one that held the lock). Urgent waiters among themselves, and the
    others among themselves, take turns as the threads wake. A transaction that holds the lock
    is never interrupted: this orders the queue, it does not shorten a hold.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._urgent = 0  # urgent threads waiting

    def acquire(self, urgent: bool = False) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            if urgent:
                self._urgent += 1
                try:
                    while self._owner is not None:
                        self._cond.wait()
                finally:
                    self._urgent -= 1
            else:
                while self._owner is not None or self._urgent:
                    self._cond.wait()
            self._owner = me
            self._depth = 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a WriteLock this thread does not hold")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> WriteLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: One lock per SQLite engine: the threads of a process take turns at the write lock here, instead
#: of polling it through SQLite's busy handler (which sleeps up to 100 ms between tries). Other
#: processes on the same file still queue through the busy timeout.
_WRITE_LOCKS: weakref.WeakKeyDictionary[Engine, WriteLock] = weakref.WeakKeyDictionary()


@contextmanager
def write_transaction(factory: sessionmaker[Session], *, urgent: bool = False) -> Iterator[Session]:
    """One write transaction: commits on success, rolls back on any exception.

    On SQLite it begins with ``BEGIN IMMEDIATE`` (the write lock is taken up front, so concurrent
    writers wait up to the busy timeout instead of deadlocking on a lock upgrade), and the writers
    of one process queue on an in-process lock first (``WriteLock``): ``urgent`` (a request
    waiting on its answer) goes ahead of the other writers waiting there.
    """
    with _queued(factory.kw.get("bind"), urgent), _write(factory) as session:
        yield session


@contextmanager
def write_connection(factory: sessionmaker[Session]) -> Iterator[Connection]:
    """``write_transaction`` for code that runs only driver-level statements: a ``Connection``
    of the factory's engine instead of an ORM ``Session`` (which costs CPU of its own per
    transaction), with the same locking, ``BEGIN IMMEDIATE`` and commit-or-rollback."""
    bind = factory.kw["bind"]
    with bind.connect() as conn:
        conn.execution_options(sqlite_immediate=True)  # in place (SQLAlchemy 2)
        with _queued(bind), conn.begin():
            yield conn


@contextmanager
def _queued(bind: object, urgent: bool = False) -> Iterator[None]:
    """Hold the engine's in-process write lock (SQLite) for the transaction inside, and wake
    the background checkpointer once it has committed; nothing for other engines."""
    lock = _WRITE_LOCKS.get(bind) if isinstance(bind, Engine) else None
    if lock is None:
        yield
        return
    lock.acquire(urgent)
    try:
        yield
    finally:
        lock.release()
    checkpointer = _CHECKPOINTERS.get(bind)  # type: ignore[call-overload]
    if checkpointer is not None:
        checkpointer.poke()


@contextmanager
def _write(factory: sessionmaker[Session]) -> Iterator[Session]:
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
    """One read-only transaction (a consistent snapshot); always rolled back at the end.

    On PostgreSQL it runs at REPEATABLE READ, so every statement reads the snapshot of the first
    (READ COMMITTED would let a step that commits between two statements show a call's row
    before the step and its attempts or ledger after it). SQLite's read transaction is one
    snapshot already.
    """
    with _reading(factory, "REPEATABLE READ") as session:
        yield session


@contextmanager
def single_reads(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session for reads that are each one statement, each its own consistent snapshot (a
    reader that needs several statements to agree uses ``read_transaction``). On PostgreSQL the
    connection is in autocommit: no ``BEGIN`` and ``ROLLBACK`` round trips around the
    statement; SQLite's is a read transaction as
    ``read_transaction``'s (no round trips there)."""
    with _reading(factory, "AUTOCOMMIT") as session:
        yield session


@contextmanager
def _reading(factory: sessionmaker[Session], pg_isolation: str) -> Iterator[Session]:
    """A session that is always rolled back, at ``pg_isolation`` on PostgreSQL."""
    with factory() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": pg_isolation})
        try:
            yield session
        finally:
            session.rollback()


def is_stale_connection(error: BaseException) -> bool:
    """Whether ``error`` came from a connection that had died (the server restarted, a proxy
    cut it): SQLAlchemy has invalidated it, so a new transaction gets a fresh connection."""
    return isinstance(error, DBAPIError) and error.connection_invalidated


def is_unavailable(error: BaseException) -> bool:
    """Whether a database error means "the database is unavailable now" (answer 503, retry).

    True for connection failures, a cut connection, and a SQLite database that stays locked past
    the busy timeout, cannot be opened, read or written; false for errors that a retry would not
    fix, SQLite's ``SQLITE_ERROR`` among them (a statement it refuses: an integer overflow,
    malformed JSON, a missing table — which the pass must not take for an outage and retry for
    ever: the reconciler then redoes the step call by call and leaves the failing ones pending).
    """
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    orig = getattr(error, "orig", error)
    if isinstance(orig, sqlite3.OperationalError):
        return orig.sqlite_errorcode & 0xFF != sqlite3.SQLITE_ERROR
    return isinstance(error, OperationalError)


#: One statement: the transaction's snapshot exported for another connection to read, or null
#: on a hot standby, which cannot export one.
_EXPORT_SNAPSHOT = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_export_snapshot() END"
#: The threads that run a read beside its transaction (``read_beside``).
_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="billing-read-beside")


@contextmanager
def read_beside(session: Session, read: Callable[[Session], T]) -> Iterator[Callable[[], T]]:
    """``read`` of ``session``'s snapshot run on another connection while the caller reads on
    ``session``: the context gives the function that waits for its answer (or raises its error).

    Only where the two read one snapshot: PostgreSQL with ``session`` at REPEATABLE READ
    (``read_transaction``), the snapshot exported by ``session`` (``pg_export_snapshot()``) and
    imported by a REPEATABLE READ transaction of a pooled connection (``SET TRANSACTION
    SNAPSHOT``), in a thread of ``_BESIDE``. Elsewhere (SQLite, a READ COMMITTED or
    autocommit session, a hot standby, which exports no snapshot) ``read(session)`` runs when
    its answer is asked, on ``session``: the same figures, one after the other. The second
    connection is always given back before the context ends (it only reads; rolled back)."""
    connection = session.connection()
    dbapi: Any = connection.connection.dbapi_connection
    level = getattr(dbapi, "isolation_level", None)
    repeatable = (
        connection.dialect.name == "postgresql"
        and not dbapi.autocommit
        and level is not None
        and level.name in ("REPEATABLE_READ", "SERIALIZABLE")
    )
    snapshot = connection.exec_driver_sql(_EXPORT_SNAPSHOT).scalar() if repeatable else None
    if snapshot is None:
        yield lambda: read(session)
        return

    def beside() -> T:
        with connection.engine.connect().execution_options(
            isolation_level="REPEATABLE READ"
        ) as other:
            # (First in its transaction, as PostgreSQL requires; the id is the server's text.)
            other.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            try:
                with Session(bind=other) as twin:
                    return read(twin)
            finally:
                other.rollback()

    future = _BESIDE.submit(beside)
    try:
        yield future.result
    finally:
        # The import needs ``session``'s transaction open: it stays open until the read ends.
        futures.wait([future])
