"""Storing validated batches exactly once: insert-or-skip on ``event_id``, conflicts refused.

The write path is set-based: one insert-or-skip statement for every event of a transaction and
one ``calls`` upsert for every call it touched (the ``stream.started`` fields included), as
driver-level statements (``billing.ingest.repository``, no ORM unit of work). Several batches may
share one transaction — group commit, see ``billing.ingest.writer`` — and each keeps the outcome
it would have had alone, in arrival order: a batch with a conflict stores nothing and the others
are unaffected.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import Conflict, EventConflict
from billing.ingest.prepare import EventRow, PreparedBatch, content_hash, prepare_batch
from billing.ingest.repository import repository as ingest_repository
from billing.ingest.rows import CallFields, CallRaced
from billing.ingest.validation import ParsedEvent
from billing.storage.db import is_stale_connection, is_unavailable, write_connection

__all__ = [
    "CommitUnanswered",
    "IngestResult",
    "PreparedBatch",
    "content_hash",
    "prepare_batch",
    "store_batch",
    "write_group",
]


@dataclass(frozen=True)
class IngestResult:
    """What ``POST /v1/events`` answers: newly stored events and duplicates (CONTRACT "Ingest")."""

    accepted: int
    duplicates: int


def store_batch(session: Session, batch: Sequence[ParsedEvent], now: datetime) -> IngestResult:
    """Store a batch atomically inside the caller's transaction (the caller commits).

    Events whose ``event_id`` is already stored, or repeated earlier in the batch, with the same
    content are duplicates; with different content they are conflicts, and ``EventConflict`` is
    raised so that the caller rolls back and nothing of the batch is stored. Every call that got a
    new event is pending for the reconciler afterwards (marked so, with ``last_received_at =
    now``, unless it was pending already).
    """
    prepared = prepare_batch(batch, now)
    accepted = _store(session.connection(), [prepared], fill_raced=True)[0][0]
    return IngestResult(accepted=accepted, duplicates=len(batch) - accepted)


class CommitUnanswered(Exception):
    """The connection broke during a group's COMMIT: whether it committed is not known yet.

    ``new`` holds the events the transaction inserted (event_id -> content hash) and ``results``
    what each batch is answered if it did commit; ``billing.ingest.outcome`` finds out which.
    The database's error is the ``__cause__``.
    """

    def __init__(self, new: dict[str, str], results: list[IngestResult]) -> None:
        super().__init__(f"COMMIT of {len(new)} new events unanswered")
        self.new = new
        self.results = results


#: Times a group is written again when a call of it was created by a concurrent transaction after
#: the group's snapshot (``CallRaced``); the last attempt numbers such events in place and locks
#: those calls after the events, out of order, which can deadlock: so it comes only after many
#: attempts (8 threads posting overlapping copies of the same calls' events need several).
_RACE_RETRIES = 100


def write_group(
    sessions: sessionmaker[Session], items: Sequence[PreparedBatch]
) -> list[IngestResult | EventConflict]:
    """Store several batches in one transaction (one commit, one disk flush); committed on return.

    Each batch gets what it would have got alone, in the order given: an ``IngestResult``, or an
    ``EventConflict`` (that batch stored nothing). Conflicts are rare: when one shows up, the shared
    transaction is rolled back and the batches are stored again one by one, each in a savepoint.
    A database error fails every batch of the group (nothing of any of them is stored), except
    one that breaks the connection during COMMIT: ``CommitUnanswered``. A connection found dead
    before the COMMIT (the database restarted since it was last used) is replaced and the group
    written again, once: the writer's engine does not pre-ping (a round trip per transaction).
    A group one of whose calls another transaction created meanwhile (``CallRaced``) is rolled
    back and written again (up to ``_RACE_RETRIES`` times), so that its locks stay in order.
    """
    new: list[tuple[EventRow, int]] = []
    stale_retried = False
    attempt = 0
    try:
        while True:
            try:
                with write_connection(sessions) as conn:
                    counts, new = _store(conn, items, fill_raced=attempt >= _RACE_RETRIES)
                break
            except CallRaced:
                attempt += 1  # rolled back: nothing of the group was stored
            except SQLAlchemyError as error:
                if new or stale_retried or not is_stale_connection(error):
                    raise
                # Rolled back with its connection: nothing of the group was stored. Once more, on
                # a fresh connection (a second failure is the database being away: a 503).
                stale_retried = True
    except EventConflict as conflict:
        if len(items) == 1:
            return [conflict]
        return _write_one_by_one(sessions, items)
    except SQLAlchemyError as error:
        # ``new`` is filled once every statement has run: the error came from the COMMIT, and
        # the database may have committed without its answer reaching us.
        if not new or not is_unavailable(error):
            raise
        results = [
            IngestResult(accepted=n, duplicates=len(item.events) - n)
            for n, item in zip(counts, items, strict=True)
        ]
        inserted = {row.event_id: row.digest for row, _ in new}
        raise CommitUnanswered(inserted, results) from error
    return [
        IngestResult(accepted=n, duplicates=len(item.events) - n)
        for n, item in zip(counts, items, strict=True)
    ]


def _write_one_by_one(
    sessions: sessionmaker[Session], items: Sequence[PreparedBatch]
) -> list[IngestResult | EventConflict]:
    results: list[IngestResult | EventConflict] = []
    with write_connection(sessions) as conn:
        for item in items:
            try:
                with conn.begin_nested():
                    n = _store(conn, [item], fill_raced=True)[0][0]
            except EventConflict as conflict:
                results.append(conflict)
                continue
            results.append(IngestResult(accepted=n, duplicates=len(item.events) - n))
    return results


_by_event_id = operator.attrgetter("event_id")


def _store(
    conn: Connection, items: Sequence[PreparedBatch], *, fill_raced: bool
) -> tuple[list[int], list[tuple[EventRow, int]]]:
    """Insert the events of ``items`` and touch their calls; returns the accepted count per item
    and the events inserted (event row, item number), in arrival order.

    Raises ``EventConflict`` on any conflict (for a single item: its conflicts, first occurrences
    in batch order; for several: the caller falls back to one by one), and ``CallRaced`` for a
    call created by another transaction since this one's snapshot, unless ``fill_raced`` (see
    ``IngestRepository.insert_events``).
    """
    single = len(items) == 1
    # The first occurrence of each event_id in the group, with the item that brings it, in
    # arrival order (an event_id repeated in a later item of the group is a duplicate there, or
    # a conflict), and how many each item brings.
    in_order: list[tuple[EventRow, int]]
    if single:
        in_order = [(row, 0) for row in items[0].rows]
        firsts = [len(in_order)]
    else:
        digests: dict[str, str] = {}
        in_order = []
        firsts = [0] * len(items)
        for i, item in enumerate(items):
            for row in item.rows:
                seen = digests.get(row.event_id)
                if seen is None:
                    digests[row.event_id] = row.digest
                    in_order.append((row, i))
                    firsts[i] += 1
                elif seen != row.digest:
                    raise EventConflict([Conflict(row.index, row.event_id)])
    if not in_order:
        return [0] * len(items), []
    repository = ingest_repository(conn)
    # A fixed order makes concurrent transactions take index locks in the same order (no deadlocks).
    rows = sorted((row for row, _ in in_order), key=_by_event_id)
    # Every event row carries its call's number, so a call unknown so far is numbered (or
    # created) before its events are inserted. Such a call has no stored event (every stored
    # event's call exists), so every event of it here is new: its row is what the upsert of
    # ``touch_calls`` would create; a conflict rolls the call back with the events.
    calls = _call_fields(in_order)
    outcome = repository.insert_events(conn, rows, calls, fill_raced=fill_raced)
    inserted = outcome.ids  # None: every row
    if inserted is None:
        counts, new_events = firsts, in_order
    else:
        skipped = [row for row in rows if row.event_id not in inserted]
        stored = repository.stored_hashes(conn, [row.event_id for row in skipped])
        bad = [row for row in skipped if stored.get(row.event_id) != row.digest]
        if bad:
            if not single:
                raise EventConflict([])
            raise EventConflict(
                sorted((Conflict(row.index, row.event_id) for row in bad), key=lambda c: c.index)
            )
        new_events = [event for event in in_order if event[0].event_id in inserted]
        counts = [0] * len(items)
        for _, i in new_events:
            counts[i] += 1
    # A call created with these events is pending with their figures already, and so is a stored
    # one found pending with a key (``quiet``): only the others are touched (in a stream's later
    # events, nearly always none).
    quiet = outcome.quiet
    if inserted is None:
        # Every event was new: each call has all of its events here, so its fields are the ones
        # computed above.
        touched = {rid: f for rid, f in calls.items() if rid not in quiet} if quiet else calls
    else:
        touched = _call_fields([e for e in new_events if e[0].request_id not in quiet])
    if touched:
        repository.touch_calls(conn, touched, outcome)
    return counts, new_events


def _call_fields(new_events: Sequence[tuple[EventRow, int]]) -> CallFields:
    """What a ``calls`` row is written from, per call of ``new_events`` ((event row, batch
    number), batch by batch in arrival order): its first and last arrival, and the
    ``stream.started`` of the lowest attempt in the first batch that brings one."""
    calls: CallFields = {}
    for row, batch_no in new_events:
        call = calls.get(row.request_id)
        received = row.received
        if call is None:
            call = calls[row.request_id] = [received, received, None, 0]
        elif received > call[1]:
            call[1] = received
        if row.started is not None:
            # The first batch that brings a stream.started sets the fields (its lowest attempt).
            seen = call[2]
            if seen is None or (call[3] == batch_no and row.attempt < seen.attempt):
                call[2] = row
                call[3] = batch_no
    return calls
