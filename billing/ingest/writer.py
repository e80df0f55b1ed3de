"""Group commit for ``POST /v1/events``: concurrent batches share one transaction and one flush.

Every acknowledged event must be on disk, and a disk flush (``fdatasync``) costs milliseconds
whatever it carries: one commit per request caps single-event posts at a few hundred a second.
So requests hand their validated, hashed batch to a writer thread; the writer takes every batch
that is waiting (up to ``MAX_GROUP_EVENTS`` events) and stores them in one transaction with
``write_group``, which keeps each batch's own outcome (accepted/duplicates, or a 409 that stores
nothing of that batch). A request is answered only after that transaction has committed.

The store says how many writer threads an engine has (``IngestRepository.writers``: SQLite one,
PostgreSQL a few, whose flushes its own group commit merges). A writer thread starts on demand
and ends after ``IDLE_S`` without work, so an engine that is no longer used leaves no thread
behind. A second (third) one starts only while at least ``SPLIT_EVENTS`` events wait for a
busy writer, and ends after writing a group smaller than that: a transaction costs a few round
trips whatever it carries, so many small posts are cheaper in one group than split between
writers, while large batches gain from one writer's statements running while another's wait
for the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from billing.ingest.outcome import settle_unanswered
from billing.ingest.repository import repository as ingest_repository
from billing.ingest.service import CommitUnanswered, IngestResult, PreparedBatch, write_group
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker

#: A group stops taking waiting batches once it holds this many events.
MAX_GROUP_EVENTS = 5000
#: A writer thread with nothing to do for this long ends (a new one starts with the next batch).
IDLE_S = 2.0
#: Events waiting for a busy writer that start another one (up to the writer's maximum); one that
#: writes a smaller group while others run ends (many small posts are cheaper in one group).
SPLIT_EVENTS = 1000

Outcome = IngestResult | BaseException


class _Pending:
    """A submitted batch and where its outcome goes: a ``concurrent.futures.Future`` (``loop``
    is None) or an asyncio future of ``loop``."""

    __slots__ = ("batch", "future", "loop")

    def __init__(
        self,
        batch: PreparedBatch,
        future: Future[IngestResult] | asyncio.Future[IngestResult],
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.batch = batch
        self.future = future
        self.loop = loop

    def take(self) -> bool:
        """Whether the batch is still wanted (its waiter was not cancelled); once taken, it is
        stored whatever happens to the waiter."""
        if self.loop is None:
            return self.future.set_running_or_notify_cancel()  # type: ignore[union-attr]
        return not self.future.cancelled()


def _deliver(pendings: Sequence[_Pending], outcomes: Sequence[Outcome]) -> None:
    """Set each asyncio future's outcome (runs on their event loop)."""
    for pending, outcome in zip(pendings, outcomes, strict=True):
        future = pending.future
        if future.done():  # cancelled meanwhile
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class GroupWriter:
    """Stores submitted batches in shared transactions; see the module docstring."""

    def __init__(
        self, sessions: sessionmaker[Session], max_threads: int, owned: Engine | None = None
    ) -> None:
        self._sessions = sessions
        self._owned = owned
        self._max_threads = max_threads
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._waiting = 0  # events in the queue
        self._ending = 0  # threads writing their last group (still counted in ``_threads``)
        self._last_put = float("-inf")  # time.monotonic() of the latest submitted batch

    def busy(self, within_s: float = 1.0) -> bool:
        """Whether a batch was submitted in the last ``within_s`` seconds (the reconciler keeps
        its steps short while it is, see ``billing.reconcile.runner``)."""
        return time.monotonic() - self._last_put < within_s

    def close(self) -> None:
        """Release the engine this writer owns, if any (its threads end when idle)."""
        if self._owned is not None:
            self._owned.dispose()

    def submit(self, batch: PreparedBatch) -> Future[IngestResult]:
        """Queue ``batch``; the future resolves once it is committed (or raises its error)."""
        future: Future[IngestResult] = Future()
        self._put(_Pending(batch, future, None))
        return future

    async def store(self, batch: PreparedBatch) -> IngestResult:
        """Queue ``batch`` and wait, on the running event loop, until it is committed.

        The same as awaiting ``submit``'s future, with less work per request: the writer hands
        the outcomes of a whole group to the loop in one call (one wake-up per group instead of
        one per batch). Raises the batch's error (``EventConflict``, a database error, …).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[IngestResult] = loop.create_future()
        self._put(_Pending(batch, future, loop))
        return await future

    def _put(self, pending: _Pending) -> None:
        with self._lock:
            self._queue.put(pending)
            self._waiting += len(pending.batch.events)
            self._last_put = time.monotonic()
            if (
                self._threads < self._max_threads
                and self._idle == 0
                and (self._threads == 0 or self._waiting >= SPLIT_EVENTS)
            ):
                self._threads += 1
                threading.Thread(
                    target=self._run, name="billing-ingest-writer", daemon=True
                ).start()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:  # an unexpected error: no longer counted, so that another starts
            with self._lock:
                self._threads -= 1
            raise

    def _serve(self) -> None:
        """Write groups until idle for ``IDLE_S``, or after a small group while other writers
        run; uncounts this thread (under the lock) before returning."""
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
            group: list[_Pending] = []
            size = 0
            pending: _Pending | None = first
            while pending is not None:
                # A request whose client went away before its batch was taken is not stored;
                # once taken, it can no longer be cancelled.
                size += len(pending.batch.events)
                if pending.take():
                    group.append(pending)
                if size >= MAX_GROUP_EVENTS:
                    break
                try:
                    pending = self._queue.get_nowait()
                except queue.Empty:
                    pending = None
            with self._lock:
                self._idle -= 1
                self._waiting -= size
                # The last group of this thread: it stays counted while it writes (the maximum
                # holds), and at least one other thread that is not ending goes on.
                last = size < SPLIT_EVENTS and self._threads - self._ending > 1
                if last:
                    self._ending += 1
            if group:
                self._write(group)
            if last:
                with self._lock:
                    self._ending -= 1
                    self._threads -= 1
                return

    def _write(self, group: list[_Pending]) -> None:
        try:
            results: Sequence[Outcome] = write_group(self._sessions, [p.batch for p in group])
        except CommitUnanswered as unanswered:
            # Finding out whether it committed may take seconds while the database is away: on a
            # thread of its own, so that the batches behind this group get their answers now.
            threading.Thread(
                target=self._settle,
                args=(group, unanswered),
                name="billing-ingest-outcome",
                daemon=True,
            ).start()
            return
        except BaseException as error:  # every batch of the group failed; nothing was stored
            results = [error] * len(group)
        self._answer(group, results)

    def _settle(self, group: list[_Pending], unanswered: CommitUnanswered) -> None:
        self._answer(group, settle_unanswered(self._sessions, unanswered))

    @staticmethod
    def _answer(group: Sequence[_Pending], outcomes: Sequence[Outcome]) -> None:
        """Hand each batch its outcome: directly for ``submit``'s futures, and in one call per
        event loop for ``store``'s."""
        by_loop: dict[asyncio.AbstractEventLoop, tuple[list[_Pending], list[Outcome]]] = {}
        for pending, outcome in zip(group, outcomes, strict=True):
            if pending.loop is None:
                future: Future[IngestResult] = pending.future  # type: ignore[assignment]
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
                continue
            mine = by_loop.get(pending.loop)
            if mine is None:
                mine = by_loop[pending.loop] = ([], [])
            mine[0].append(pending)
            mine[1].append(outcome)
        for loop, (pendings, results) in by_loop.items():
            # A closed loop (RuntimeError) has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, pendings, results)


def new_writer(settings: Settings, sessions: sessionmaker[Session]) -> GroupWriter:
    """A group writer for an app with the store's ``writers`` threads: on the app's engine, whose
    in-process write lock it shares, or on an engine of its own without pre-ping, a round trip
    saved per transaction (see ``write_group``). ``close`` it after use."""
    repository = ingest_repository(sessions.kw["bind"])
    if repository.writers_share_engine:
        return GroupWriter(sessions, repository.writers)
    engine = make_engine(settings, pre_ping=False, pool_size=repository.writers)
    return GroupWriter(make_sessionmaker(engine), repository.writers, owned=engine)
