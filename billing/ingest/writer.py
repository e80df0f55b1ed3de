"""Group commit for ``POST /v1/events``: concurrent batches share one transaction and one flush.

Every acknowledged event must be on disk, and a disk flush (``fdatasync``) costs milliseconds
whatever it carries: one commit per request caps single-event posts at a few hundred a second.
So requests hand their validated, hashed batch to a writer thread; the writer takes every batch
that is waiting (up to ``MAX_GROUP_EVENTS`` events) and stores them in one transaction with
``write_group``, which keeps each batch's own outcome (accepted/duplicates, or a 409 that stores
nothing of that batch). A request is answered only after that transaction has committed.

SQLite has one writer thread per engine (it has one writer anyway, and in-process queueing avoids
the busy handler's sleeps); PostgreSQL has up to ``PG_WRITERS`` (its own group commit merges
their flushes). Writer threads start on demand and end after ``IDLE_S`` without work, so an
engine that is no longer used leaves no thread behind.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from billing.errors import EventConflict
from billing.ingest.outcome import settle_unanswered
from billing.ingest.service import CommitUnanswered, IngestResult, PreparedBatch, write_group

#: A group stops taking waiting batches once it holds this many events.
MAX_GROUP_EVENTS = 5000
#: Writer threads per PostgreSQL engine.
PG_WRITERS = 3
#: A writer thread with nothing to do for this long ends (a new one starts with the next batch).
IDLE_S = 2.0


@dataclass
class _Pending:
    batch: PreparedBatch
    future: Future[IngestResult]


class GroupWriter:
    """Stores submitted batches in shared transactions; see the module docstring."""

    def __init__(self, sessions: sessionmaker[Session], max_threads: int) -> None:
        self._sessions = sessions
        self._max_threads = max_threads
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, batch: PreparedBatch) -> Future[IngestResult]:
        """Queue ``batch``; the future resolves once it is committed (or raises its error)."""
        future: Future[IngestResult] = Future()
        with self._lock:
            self._queue.put(_Pending(batch, future))
            if self._threads < self._max_threads and self._idle == 0:
                self._threads += 1
                threading.Thread(
                    target=self._run, name="billing-ingest-writer", daemon=True
                ).start()
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                first = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queue.empty():
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
            group: list[_Pending] = []
            size = 0
            pending: _Pending | None = first
            while pending is not None:
                # A request whose client went away before its batch was taken is not stored;
                # once taken, it can no longer be cancelled.
                if pending.future.set_running_or_notify_cancel():
                    group.append(pending)
                    size += len(pending.batch.events)
                if size >= MAX_GROUP_EVENTS:
                    break
                try:
                    pending = self._queue.get_nowait()
                except queue.Empty:
                    pending = None
            if group:
                self._write(group)

    def _write(self, group: list[_Pending]) -> None:
        try:
            results = write_group(self._sessions, [p.batch for p in group])
        except CommitUnanswered as unanswered:
            # Finding out whether it committed may take seconds while the database is away: on a
            # thread of its own, so that the batches behind this group get their answers now.
            threading.Thread(
                target=settle_unanswered,
                args=(self._sessions, unanswered, [p.future for p in group]),
                name="billing-ingest-outcome",
                daemon=True,
            ).start()
            return
        except BaseException as error:  # every batch of the group failed; nothing was stored
            for pending in group:
                pending.future.set_exception(error)
            return
        for pending, result in zip(group, results, strict=True):
            if isinstance(result, EventConflict):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)


def new_writer(sessions: sessionmaker[Session], dialect: str) -> GroupWriter:
    """A group writer for an app's session factory (SQLite: one thread; PostgreSQL: several)."""
    return GroupWriter(sessions, PG_WRITERS if dialect == "postgresql" else 1)
