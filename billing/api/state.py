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
from billing.storage.db import read_transaction, write_transaction

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


async def write(state: AppState, work: Callable[[Session, datetime], T]) -> T:
    """``work(session, now)`` in a write transaction (SQLite: ``BEGIN IMMEDIATE``), in the
    thread pool."""

    def run() -> T:
        with write_transaction(state.sessions) as session:
            return work(session, datetime.now(UTC))

    return await run_in_threadpool(run)


async def read_json(state: AppState, work: Callable[[Session], Any]) -> Response:
    """``read(state, work)``'s answer as a JSON response (orjson, in the thread pool too)."""
    body = await read(state, lambda session: orjson.dumps(work(session)))
    return Response(body, media_type="application/json")
