"""What every handler needs from the running app: settings, engine, sessions, metrics; and the
one way a handler reads the database."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from billing.ingest.writer import GroupWriter, new_writer
from billing.metrics import Metrics
from billing.settings import Settings
from billing.storage.db import read_transaction, single_reads, write_transaction
from billing.storage.replica import replayed_as_of
from billing.timefmt import rfc3339

T = TypeVar("T")


@dataclass
class AppState:
    """Per-app resources, created by ``create_app`` and disposed at shutdown; the ingest writer
    is created by the first post (``writer()``)."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    metrics: Metrics
    ingest_writer: GroupWriter | None = None
    #: ``BILLING_READ_DATABASE_URL``'s sessions (a replica), when it is set.
    replica_sessions: sessionmaker[Session] | None = None
    _writer_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def writer(self) -> GroupWriter:
        """The app's group-commit writer (``billing.ingest.writer``), created on first use."""
        writer = self.ingest_writer
        if writer is None:
            with self._writer_lock:
                writer = self.ingest_writer
                if writer is None:
                    writer = self.ingest_writer = new_writer(self.settings, self.sessions)
        return writer

    @property
    def reader(self) -> sessionmaker[Session]:
        """Where the call log, usage, console, drift and exports read: the replica if any."""
        return self.replica_sessions or self.sessions


def get_state(request: Request) -> AppState:
    """FastAPI dependency: the app's ``AppState``."""
    state: AppState = request.app.state.billing
    return state


async def read(state: AppState, work: Callable[[Session], T]) -> T:
    """``work(session)`` in a read-only transaction, in the thread pool (off the event loop)."""

    def run() -> T:
        with read_transaction(state.sessions) as session:
            return work(session)

    return await run_in_threadpool(run)


async def read_single(state: AppState, work: Callable[[Session], T]) -> T:
    """``read`` for ``work`` that reads one statement (its own consistent snapshot): on
    PostgreSQL in autocommit, without the ``BEGIN``, isolation level and ``ROLLBACK`` round
    trips of a read transaction (``billing.storage.db.single_reads``)."""

    def run() -> T:
        with single_reads(state.sessions) as session:
            return work(session)

    return await run_in_threadpool(run)


async def write(state: AppState, work: Callable[[Session, datetime], T]) -> T:
    """``work(session, now)`` in a write transaction (SQLite: ``BEGIN IMMEDIATE``), in the
    thread pool."""

    def run() -> T:
        # urgent: a request waits on this transaction (SQLite: ahead of background writers).
        with write_transaction(state.sessions, urgent=True) as session:
            return work(session, datetime.now(UTC))

    return await run_in_threadpool(run)


async def read_json(state: AppState, work: Callable[[Session], Any]) -> Response:
    """``read(state, work)``'s answer as a JSON response (orjson, in the thread pool too)."""
    body = await read(state, lambda session: orjson.dumps(work(session)))
    return Response(body, media_type="application/json")


#: The header of every answer read through ``routed``: RFC 3339 UTC, or absent when unknown.
AS_OF_HEADER = "X-Billing-As-Of"


def as_of_headers(as_of: datetime | None) -> dict[str, str]:
    """``{AS_OF_HEADER: as_of}``, or nothing when ``as_of`` is unknown."""
    stamp = rfc3339(as_of)
    return {} if stamp is None else {AS_OF_HEADER: stamp}


def read_as_of(sessions: sessionmaker[Session]) -> datetime | None:
    """What the database of ``sessions`` has replayed (``billing.storage.replica``), read before
    any snapshot taken after it."""
    with single_reads(sessions) as session:
        return replayed_as_of(session)


async def routed(state: AppState, work: Callable[[Session], T]) -> tuple[T, datetime | None]:
    """``read`` on ``state.reader`` (the replica, if any), with the answer's ``as_of``: read first,
    so the snapshot ``work`` reads holds at least every commit up to it."""

    def run() -> tuple[T, datetime | None]:
        as_of = read_as_of(state.reader)
        with read_transaction(state.reader) as session:
            return work(session), as_of

    return await run_in_threadpool(run)


async def routed_json(state: AppState, work: Callable[[Session], Any]) -> Response:
    """``routed(state, work)``'s answer as a JSON response with its ``X-Billing-As-Of``."""
    body, as_of = await routed(state, lambda session: orjson.dumps(work(session)))
    return Response(body, media_type="application/json", headers=as_of_headers(as_of))
