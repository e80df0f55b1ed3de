"""Storing validated batches exactly once: insert-or-skip on ``event_id``, conflicts refused.

The write path is set-based: one ``INSERT … ON CONFLICT (event_id) DO NOTHING`` for every event of
a transaction and one ``calls`` upsert for every call it touched (the ``stream.started`` fields
included), as driver-level statements (no ORM unit of work). Several batches may share one
transaction — group commit, see ``billing.ingest.writer`` — and each keeps the outcome it would
have had alone, in arrival order: a batch with a conflict stores nothing and the others are
unaffected.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import operator
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import Conflict, EventConflict
from billing.ingest.schemas import Event, StreamStarted, StreamTokens
from billing.ingest.validation import ParsedEvent
from billing.storage.db import is_stale_connection, is_unavailable, write_connection
from billing.storage.types import sqlite_text


@dataclass(frozen=True)
class IngestResult:
    """What ``POST /v1/events`` answers: newly stored events and duplicates (CONTRACT "Ingest")."""

    accepted: int
    duplicates: int


def content_hash(parsed: ParsedEvent) -> str:
    """SHA-256 (hex) of the event's canonical validated form.

    Key order, white space, a defaulted ``attempt`` and the offset an instant is written in do not
    change it (CONTRACT "Ingest": "same content").
    """
    # The event's fields as pydantic's JSON form would give them (``model_dump(mode="json")``),
    # without building that dict: every field is a str, int, None, a str -> str dict or a UTC
    # datetime, which orjson writes exactly as pydantic does with ``Z`` for UTC (a test pins it).
    canonical = orjson.dumps(parsed.event.__dict__, option=_CANONICAL)
    return hashlib.sha256(canonical).hexdigest()


_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z


class _Row:
    """One event to store: the first occurrence of its ``event_id`` in its batch, with the
    column values computed up front, on the request's side (the writer thread is the serial
    part of ingest: it only runs the statements)."""

    __slots__ = (
        "attempt",
        "digest",
        "event_id",
        "index",
        "occurred_at",
        "occurred_text",
        "received",
        "request_id",
        "sqlite",
        "started",
    )

    def __init__(
        self,
        digest: str,
        index: int,
        event: Event,
        raw: dict[str, Any],
        received: datetime,
        received_text: str,
    ) -> None:
        self.event_id = event.event_id
        self.request_id = event.request_id
        self.attempt = event.attempt
        self.occurred_at = event.occurred_at
        self.occurred_text = sqlite_text(event.occurred_at)  # SQLite's form of the column
        self.received = received
        self.digest = digest
        self.index = index
        #: The ``events`` row as SQLite's parameters (see ``_SQLITE_INSERT_EVENTS``).
        self.sqlite = (
            event.event_id,
            event.request_id,
            event.attempt,
            event.type,
            self.occurred_text,
            received_text,
            digest,
            orjson.dumps(raw).decode(),
            *(
                (event.output_tokens_delivered, event.output_tokens_generated)
                if isinstance(event, StreamTokens)
                else (None, None)
            ),
        )
        #: For a ``stream.started``: api_key_id, model, protocol, metadata (as the JSON text the
        #: ``calls`` row stores).
        self.started: tuple[str, str, str, str] | None = (
            (event.api_key_id, event.model, event.protocol, json.dumps(event.metadata))
            if isinstance(event, StreamStarted)
            else None
        )


@dataclass(frozen=True)
class PreparedBatch:
    """A validated batch with its content hashes, ready to be stored (see ``prepare_batch``)."""

    events: Sequence[ParsedEvent]
    now: datetime
    rows: list[_Row]


def prepare_batch(batch: Sequence[ParsedEvent], now: datetime) -> PreparedBatch:
    """Hash every event and drop repeats inside the batch (CPU only, no database).

    An ``event_id`` repeated in the batch with the same content is a duplicate; with different
    content ``EventConflict`` is raised (listing each later repeat by its index).
    """
    first: dict[str, _Row] = {}
    rows: list[_Row] = []
    conflicts: list[Conflict] = []
    received_text = sqlite_text(now)
    for index, parsed in enumerate(batch):
        event = parsed.event
        event_id = event.event_id
        digest = content_hash(parsed)
        seen = first.get(event_id)
        if seen is not None:
            if seen.digest != digest:
                conflicts.append(Conflict(index, event_id))
            continue
        row = _Row(digest, index, event, parsed.raw, now, received_text)
        first[event_id] = row
        rows.append(row)
    if conflicts:
        raise EventConflict(conflicts)
    return PreparedBatch(batch, now, rows)


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
#: the group's snapshot (PostgreSQL, ``_CallRaced``); the last attempt numbers such events in place
#: and locks those calls after the events, out of order, which can deadlock. A review's stress run
#: (8 threads posting overlapping copies of the same calls' events) needed up to 11 attempts for a
#: group, and deadlocked in 7 of 10 runs with 3; none in 4 runs with 1000.
_RACE_RETRIES = 100


class _CallRaced(Exception):
    """PostgreSQL: a call of the group was committed by another transaction after this one's
    snapshot, so the events statement could neither create nor lock it (``_PG_INSERT_EVENTS``)."""


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
    On PostgreSQL a group one of whose calls another transaction created meanwhile is rolled
    back and written again (up to ``_RACE_RETRIES`` times), so that its locks stay in order.
    """
    new: list[tuple[_Row, int]] = []
    stale_retried = False
    attempt = 0
    try:
        while True:
            try:
                with write_connection(sessions) as conn:
                    counts, new = _store(conn, items, fill_raced=attempt >= _RACE_RETRIES)
                break
            except _CallRaced:
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
) -> tuple[list[int], list[tuple[_Row, int]]]:
    """Insert the events of ``items`` and touch their calls; returns the accepted count per item
    and the events inserted (event row, item number), in arrival order.

    Raises ``EventConflict`` on any conflict (for a single item: its conflicts, first occurrences
    in batch order; for several: the caller falls back to one by one), and on PostgreSQL
    ``_CallRaced`` for a call created by another transaction since this one's snapshot, unless
    ``fill_raced`` (then its events get its number by a second statement, and it is locked after
    the events, out of the usual order).
    """
    single = len(items) == 1
    # The first occurrence of each event_id in the group, with the item that brings it, in
    # arrival order (an event_id repeated in a later item of the group is a duplicate there, or
    # a conflict), and how many each item brings.
    in_order: list[tuple[_Row, int]]
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
    # A fixed order makes concurrent transactions take index locks in the same order (no deadlocks).
    rows = sorted((row for row, _ in in_order), key=_by_event_id)
    # Every event row carries its call's number, so a call unknown so far is numbered (SQLite) or
    # created (PostgreSQL) before its events are inserted. Such a call has no stored event (every
    # stored event's call exists), so every event of it here is new: its row is what the upsert
    # in ``_touch_calls`` would create; a conflict rolls the call back with the events.
    calls = _call_fields(in_order)
    known = None if conn.dialect.name == "postgresql" else _sqlite_calls(conn, sorted(calls))
    # PostgreSQL: the calls the events statement created, or locked and found pending with a key.
    quiet: set[str] = set()
    inserted = _insert_events(conn, rows, calls, known, quiet, fill_raced)  # None: every row
    if inserted is None:
        counts, new_events = firsts, in_order
    else:
        skipped = [row for row in rows if row.event_id not in inserted]
        stored = _stored_hashes(conn, [row.event_id for row in skipped])
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
    # one found pending with a key (PostgreSQL, locked): only the others are touched (in a
    # stream's later events, nearly always none).
    if inserted is None:
        # Every event was new: each call has all of its events here, so its fields are the ones
        # computed above.
        touched = {rid: f for rid, f in calls.items() if rid not in quiet} if quiet else calls
    else:
        touched = _call_fields([e for e in new_events if e[0].request_id not in quiet])
    if touched:
        _touch_calls(conn, touched, known)
    return counts, new_events


# --- statements per dialect ------------------------------------------------------------------


#: Rows per multi-row statement on SQLite, largest first: a group of any size runs as a few
#: statements of these sizes, then one statement for the rest (fewer than the smallest size: a
#: statement per row count, each prepared once and cached by the driver). One multi-row
#: statement instead of one step per row also means one release of the GIL instead of hundreds.
_SQLITE_CHUNKS = (
    (256, 128, 64, 32) if sqlite3.sqlite_version_info >= (3, 32) else (90, 45, 22)
)  # at most 11 parameters a row: within 32766 (SQLite ≥ 3.32), or 999 before


@functools.lru_cache(maxsize=128)
def _multi_row(head: str, marks: str, tail: str, rows: int) -> str:
    return f"{head} VALUES {', '.join([marks] * rows)}{tail}"


def _sqlite_many(
    conn: Connection, head: str, marks: str, tail: str, params: Sequence[tuple[Any, ...]]
) -> int:
    """``head VALUES (…), (…) tail`` over ``params`` in a few multi-row statements; returns the
    number of rows changed."""
    changed = 0
    i = 0
    for size in (*_SQLITE_CHUNKS, len(params) % _SQLITE_CHUNKS[-1]):
        while size and len(params) - i >= size:
            flat = tuple(itertools.chain.from_iterable(params[i : i + size]))
            changed += conn.exec_driver_sql(_multi_row(head, marks, tail, size), flat).rowcount
            i += size
    return changed


_EVENT_COLUMNS = (
    "event_id, request_id, attempt, type, occurred_at, received_at, content_hash, body, "
    "output_tokens_delivered, output_tokens_generated, call_no"
)

_SQLITE_INSERT_EVENTS = (
    f"INSERT INTO events ({_EVENT_COLUMNS})",
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    " ON CONFLICT (event_id) DO NOTHING",
)
# PostgreSQL takes a group's rows as one JSON array of arrays (a text parameter, unpacked by
# the server): building and sending it costs the service's process far less CPU than one binary
# array per column, and that process (one GIL for the event loop and the writers) is what bounds
# single-event posts. Timestamps are RFC 3339 with ``Z``; the body is a JSON string element.
# The parameter is cast to ``jsonb``, parsed once: each ``->>`` on a ``json`` value parses the
# element's text again (ten fields of a row with its body: ≈ 70 → ≈ 32 µs of server time per event
# for the events insert alone, measured on a group of 400).
#
# One statement locks the stored calls and reads their numbers (``c``: a LATERAL primary-key
# probe per call, ``FOR NO KEY UPDATE``, so that a reconciler settling one is waited for and its
# result seen: ``quiet`` is read from the row as it is once locked), creates the calls not seen
# before (``n``: numbered by the sequence, so only new calls take a number) and inserts the events
# with their call's number (``k``: the new calls and the stored ones). The calls created here and
# the stored ones pending with a key need nothing more (``quiet``): the reconciler will read the
# new events; only the others go through the upsert of ``_touch_calls`` (already locked here).
# The probes are parameterized by each element, one primary-key lookup per call whatever the
# planner thinks of the size of ``calls`` (as joins or ``= ANY(array)``, a generic plan made
# while the table was small scanned all of it for every group: 256 ms a group at 200,000 calls).
# Every transaction takes its locks in one order — the stored calls by request_id (the array is
# sorted, and ``n``'s sort reads all of ``c`` before its first insert), then the new calls by
# request_id, then the events by event_id (the ``ORDER BY`` reads all of ``k`` before the first
# event is inserted) — so concurrent groups cannot deadlock (without the sort the join fed events
# in hash order, and a test saw a deadlock's 503). A call committed by another transaction after
# this statement's snapshot is waited for by the ``calls`` insert and then skipped, without being
# visible here, so it is neither created nor locked, and its events get a null number: the group
# is rolled back and written again (``_CallRaced``; a new snapshot sees that call), and only after
# ``_RACE_RETRIES`` are they given the number by ``_PG_FILL_CALL_NO`` and the call locked after
# the events, out of order.
_CALL_COLUMNS = (
    "call_no, request_id, first_received_at, last_received_at, change_seq, pending, status, "
    "settled, attempts, anomalies, api_key_id, model, protocol, started_at, metadata"
)
# A new ``calls`` row (``_CALL_COLUMNS``) from an element of ``_pg_call_values`` ({rid}: its id).
_PG_NEW_CALL = (
    "nextval('calls_call_no_seq'), {rid}, (j->>1)::timestamptz, (j->>2)::timestamptz, 1, true, "
    "'open', false, 0, '[]'::json, j->>3, j->>4, j->>5, (j->>6)::timestamptz, (j->>7)::json"
)
_PG_INSERT_EVENTS = (
    "WITH c AS (SELECT j->>0 AS request_id, j, s.call_no AS stored_no, s.quiet "
    "FROM jsonb_array_elements(%s::jsonb) AS j LEFT JOIN LATERAL "
    "(SELECT call_no, pending AND api_key_id IS NOT NULL AS quiet FROM calls "
    "WHERE calls.request_id = j->>0 FOR NO KEY UPDATE) AS s ON true), "
    f"n AS (INSERT INTO calls ({_CALL_COLUMNS}) "
    f"SELECT {_PG_NEW_CALL.format(rid='request_id')} FROM c WHERE stored_no IS NULL "
    'ORDER BY request_id COLLATE "C" '
    "ON CONFLICT (request_id) DO NOTHING RETURNING request_id, call_no), "
    "k AS (SELECT request_id, call_no, true AS quiet FROM n UNION ALL "
    "SELECT request_id, stored_no, quiet FROM c WHERE stored_no IS NOT NULL), "
    f"e AS (INSERT INTO events ({_EVENT_COLUMNS}) "
    "SELECT j->>0, j->>1, (j->>2)::integer, j->>3, (j->>4)::timestamptz, (j->>5)::timestamptz, "
    "j->>6, j->>7, (j->>8)::bigint, (j->>9)::bigint, k.call_no "
    "FROM jsonb_array_elements(%s::jsonb) AS j LEFT JOIN k ON k.request_id = j->>1 "
    'ORDER BY (j->>0) COLLATE "C" '
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id, request_id, call_no) "
    "SELECT e.event_id, e.request_id, e.call_no, coalesce(k.quiet, false) "
    "FROM e LEFT JOIN k ON k.request_id = e.request_id"
)
_PG_FILL_CALL_NO = (
    "UPDATE events SET call_no = calls.call_no FROM calls "
    "WHERE events.event_id = ANY(%s) AND calls.request_id = events.request_id"
)
_TO_JSON = orjson.OPT_UTC_Z

#: Per call: [first received, last received, row of the stream.started that sets the fields,
#: its batch number] (see ``_call_fields``).
_CallFields = dict[str, list[Any]]


def _call_fields(new_events: Sequence[tuple[_Row, int]]) -> _CallFields:
    """What a ``calls`` row is written from, per call of ``new_events`` ((event row, batch
    number), batch by batch in arrival order): its first and last arrival, and the
    ``stream.started`` of the lowest attempt in the first batch that brings one."""
    calls: _CallFields = {}
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


def _pg_call_values(calls: _CallFields) -> str:
    """The calls as the JSON array of arrays the PostgreSQL statements unpack, by request_id."""
    ordered: list[tuple[Any, ...]] = []
    for rid in sorted(calls):
        first, last, started, _ = calls[rid]
        if started is None:
            ordered.append((rid, first, last, None, None, None, None, None))
        else:
            key, model, protocol, metadata = started.started
            ordered.append((rid, first, last, key, model, protocol, started.occurred_at, metadata))
    return orjson.dumps(ordered, option=_TO_JSON).decode()


class _SqliteCalls:
    """The stored state ingest needs of a group's calls on SQLite (``_sqlite_calls``)."""

    __slots__ = ("keyless", "numbers", "pending")

    def __init__(
        self, numbers: dict[str, int | None], keyless: set[str], pending: set[str]
    ) -> None:
        #: Each call's ``call_no`` (stored, or given now to a call not stored yet).
        self.numbers = numbers
        #: The stored calls without a key yet (their ``stream.started`` has not arrived).
        self.keyless = keyless
        #: The stored calls that are pending already (the ``calls`` upsert leaves them alone).
        self.pending = pending


def _sqlite_calls(conn: Connection, request_ids: Sequence[str]) -> _SqliteCalls:
    """Each call's ``call_no``: the stored one, or for a call not stored yet one more than the
    largest so far (in request_id order); and which stored calls have no key, and which are
    pending (``_touch_calls`` leaves those out of its upsert). One statement per
    500 calls, answering in one row (the stored calls as a JSON array, and the largest number):
    the driver gives up the GIL for every row it steps to, and this thread may then wait for it
    while the event loop validates posts. Runs under SQLite's write lock, so no other writer can
    take the same numbers."""
    numbers: dict[str, int | None] = {}
    keyless: set[str] = set()
    pending: set[str] = set()
    top = 0
    for at in range(0, len(request_ids), 500):
        chunk = request_ids[at : at + 500]
        stored, top = conn.exec_driver_sql(
            "SELECT (SELECT json_group_array(json_array(request_id, call_no, "
            "api_key_id IS NULL, pending)) "
            f"FROM calls WHERE request_id IN ({', '.join(['?'] * len(chunk))})), "
            "(SELECT coalesce(max(call_no), 0) FROM calls)",
            tuple(chunk),
        ).one()
        for request_id, call_no, no_key, is_pending in orjson.loads(stored):
            numbers[request_id] = call_no
            if no_key:
                keyless.add(request_id)
            if is_pending:
                pending.add(request_id)
    numbers.update(
        (rid, top + n) for n, rid in enumerate((r for r in request_ids if r not in numbers), 1)
    )
    return _SqliteCalls(numbers, keyless, pending)


def _insert_events(
    conn: Connection,
    rows: Sequence[_Row],
    calls: _CallFields,
    stored: _SqliteCalls | None,
    quiet: set[str],
    fill_raced: bool,
) -> set[str] | None:
    """Insert the rows with their call's number, skipping stored ``event_id``s; returns the ids
    actually inserted, or None when every row was. ``calls`` are the rows' calls as
    ``_call_fields`` gives them: on PostgreSQL (``stored`` None) the new ones are created here
    and the stored ones locked (see ``_PG_INSERT_EVENTS``), and the calls that need no upsert
    after it (created, or pending with a key) are added to ``quiet``; on SQLite ``stored`` has
    each call's number."""
    if conn.dialect.name == "postgresql":
        values = orjson.dumps(
            [(*row.sqlite[:4], row.occurred_at, row.received, *row.sqlite[6:]) for row in rows],
            option=_TO_JSON,
        ).decode()
        returned = conn.exec_driver_sql(_PG_INSERT_EVENTS, (_pg_call_values(calls), values)).all()
        unnumbered = [event_id for event_id, _, call_no, _ in returned if call_no is None]
        if unnumbered:
            if not fill_raced:
                raise _CallRaced
            conn.exec_driver_sql(_PG_FILL_CALL_NO, (unnumbered,))
        quiet.update(request_id for _, request_id, _, is_quiet in returned if is_quiet)
        inserted = {event_id for event_id, _, _, _ in returned}
        return None if len(inserted) == len(rows) else inserted
    assert stored is not None
    numbers = stored.numbers
    changed = _sqlite_many(
        conn, *_SQLITE_INSERT_EVENTS, [(*row.sqlite, numbers[row.request_id]) for row in rows]
    )
    if changed == len(rows):
        return None
    if changed == 0:
        return set()
    # SQLite: one writer at a time (BEGIN IMMEDIATE), so the rows these statements inserted got
    # the consecutive seqs that end at the last one inserted.
    last = conn.exec_driver_sql("SELECT last_insert_rowid()").scalar_one()
    return set(
        conn.exec_driver_sql(
            "SELECT event_id FROM events WHERE seq > ?", (last - changed,)
        ).scalars()
    )


def _stored_hashes(conn: Connection, event_ids: Sequence[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    for start in range(0, len(event_ids), 500):
        chunk = event_ids[start : start + 500]
        sql = (
            "SELECT event_id, content_hash FROM events "
            f"WHERE event_id IN ({', '.join([mark] * len(chunk))})"
        )
        found.update({eid: digest for eid, digest in conn.exec_driver_sql(sql, tuple(chunk))})
    return found


# Call identity comes from the lowest attempt's stream.started; the reconciler recomputes it from
# the events, this only makes new calls findable by key before their first pass: the started
# fields are set only while the stored call has no key yet.
def _keep_or_fill(column: str) -> str:
    return (
        f"{column} = CASE WHEN calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL "
        f"THEN excluded.{column} ELSE calls.{column} END"
    )


# A call that is pending already is left alone: the reconciler will read every event of it,
# the new ones included, and takes the last arrival from them (``received_at``), not from the
# call's row. So only new calls and calls reconciled since their last event are written: a
# stream's later events cost no write to ``calls`` at all (on PostgreSQL the events statement
# locks the stored calls, so a reconciler that holds one is waited for and its result seen, and
# a call it finds pending with a key is not upserted at all). A pending call still without a key
# is the exception: its ``stream.started`` fills in the key, model and start.
_ON_CONFLICT = (
    " ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
    "change_seq = calls.change_seq + 1, pending = excluded.pending, "
    + ", ".join(
        _keep_or_fill(c) for c in ("api_key_id", "model", "protocol", "started_at", "metadata")
    )
    + " WHERE NOT calls.pending OR (calls.api_key_id IS NULL AND excluded.api_key_id IS NOT NULL)"
)
# SQLite rewrites the index entries of every column a SET names, even to the same value: the
# upsert creates the new calls and marks pending the reconciled ones (see ``_ON_CONFLICT``), and
# the stream.started fields of a call that already existed without a key are filled in by a
# second statement (a no-op for nearly every row).
_SQLITE_UPSERT_CALLS = (
    f"INSERT INTO calls ({_CALL_COLUMNS})",
    "(?, ?, ?, ?, 1, 1, 'open', 0, 0, '[]', ?, ?, ?, ?, ?)",
    " ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
    "change_seq = calls.change_seq + 1, pending = 1 WHERE calls.pending = 0",
)
_SQLITE_FILL_STARTED = (
    "UPDATE calls SET api_key_id = ?, model = ?, protocol = ?, started_at = ?, metadata = ? "
    "WHERE request_id = ? AND api_key_id IS NULL"
)
_PG_UPSERT_CALLS = (
    f"INSERT INTO calls ({_CALL_COLUMNS}) "
    f"SELECT {_PG_NEW_CALL.format(rid='j->>0')} FROM jsonb_array_elements(%s::jsonb) AS j"
    + _ON_CONFLICT
)


def _touch_calls(conn: Connection, calls: _CallFields, stored: _SqliteCalls | None) -> None:
    """Create, or mark pending, the calls with new events that are not pending already (one
    upsert, see ``_ON_CONFLICT``); record what the
    ``stream.started`` of the lowest attempt says, for a call whose key is not known yet.

    ``calls``: the calls of the new events (``_call_fields``); a call's ``last_received_at`` is
    the latest of its new events' arrival times. ``stored``: on SQLite the
    calls' numbers, which stored calls have no key and which are pending (``_sqlite_calls``, read
    before the events were inserted, in this transaction); on PostgreSQL (None) the new calls
    exist already and the stored ones are locked (``_PG_INSERT_EVENTS``), so the upsert only marks
    calls pending or fills in a key.

    On SQLite a call found pending is left out of the upsert, which would leave it alone anyway
    (SQLite has one writer: nothing can have changed it since it was read). In a stream's later
    events nearly every call is pending: a group of posts of 100 upserted ≈ 3 pending calls for
    each new one, and the no-op rows cost the writer thread ≈ 7 of its ≈ 65 µs an event on a slow
    machine (bench/README).
    On PostgreSQL the events statement leaves out the calls it found pending with a key, once it
    held their locks (``_PG_INSERT_EVENTS``); the callers give only the others.
    """
    if stored is None:
        conn.exec_driver_sql(_PG_UPSERT_CALLS, (_pg_call_values(calls),))
        return
    texts: dict[datetime, str] = {}
    params = []
    numbers = stored.numbers
    fill: list[tuple[Any, ...]] = []
    pending = stored.pending
    for rid in sorted(calls):
        first, last, started, _ = calls[rid]
        fields: tuple[Any, ...] = (None, None, None, None, None)
        if started is not None:
            key, model, protocol, metadata = started.started
            fields = (key, model, protocol, started.occurred_text, metadata)
            if rid in stored.keyless:
                fill.append((*fields, rid))
        if rid in pending:
            # The upsert would leave it alone (``WHERE calls.pending = 0``): read in this
            # transaction, under SQLite's write lock, so nothing changed it since.
            continue
        first_text = texts.get(first)
        if first_text is None:
            first_text = texts[first] = sqlite_text(first)
        last_text = texts.get(last)
        if last_text is None:
            last_text = texts[last] = sqlite_text(last)
        params.append((numbers[rid], rid, first_text, last_text, *fields))
    if params:
        _sqlite_many(conn, *_SQLITE_UPSERT_CALLS, params)
    # Calls that existed before without a key (their stream.started arrived late): usually none.
    if fill:
        conn.exec_driver_sql(_SQLITE_FILL_STARTED, fill)


#: Calls repaired per step by ``number_unnumbered``.
_UNNUMBERED_LIMIT = 500


def number_unnumbered(conn: Connection) -> int:
    """Number the events (and their calls) stored without a call number, and mark those calls
    pending; returns how many calls were repaired (usually 0: one probe of an empty index).

    Only a server of a revision before migration 0007 running beside this one (a rolling
    upgrade) stores such rows: its ``calls`` rows and events have no ``call_no``, and the
    reconciler, which reads a call's events by number, would not see them. Run at the start of
    every reconciliation step, in its transaction (``billing.reconcile.runner``), so a call is
    numbered before the step reads it; events stored by such a server after that are numbered by
    the next step, and the call is then reconciled again (an adjustment if its figures changed).
    """
    postgres = conn.dialect.name == "postgresql"
    request_ids = sorted(
        conn.exec_driver_sql(
            "SELECT DISTINCT request_id FROM events WHERE call_no IS NULL "
            f"LIMIT {_UNNUMBERED_LIMIT}"
        ).scalars()
    )
    if not request_ids:
        return 0
    if postgres:
        ids: Any = (request_ids,)
        where = "= ANY(%s)"
        conn.exec_driver_sql(
            "UPDATE calls SET call_no = nextval('calls_call_no_seq') "
            f"WHERE request_id {where} AND call_no IS NULL",
            ids,
        )
        conn.exec_driver_sql(
            "UPDATE events SET call_no = calls.call_no FROM calls "
            f"WHERE events.call_no IS NULL AND events.request_id {where} "
            "AND calls.request_id = events.request_id",
            ids,
        )
        conn.exec_driver_sql(
            "UPDATE calls SET pending = true, change_seq = change_seq + 1 "
            f"WHERE request_id {where} AND NOT pending",
            ids,
        )
        return len(request_ids)
    ids = tuple(request_ids)
    where = f"IN ({', '.join('?' * len(ids))})"
    bare = list(
        conn.exec_driver_sql(
            f"SELECT request_id FROM calls WHERE request_id {where} AND call_no IS NULL "
            "ORDER BY request_id",
            ids,
        ).scalars()
    )
    if bare:
        top = conn.exec_driver_sql("SELECT max(call_no) FROM calls").scalar() or 0
        conn.exec_driver_sql(
            "UPDATE calls SET call_no = ? WHERE request_id = ?",
            [(top + n, rid) for n, rid in enumerate(bare, 1)],
        )
    conn.exec_driver_sql(
        "UPDATE events SET call_no = "
        "(SELECT calls.call_no FROM calls WHERE calls.request_id = events.request_id) "
        f"WHERE call_no IS NULL AND request_id {where}",
        ids,
    )
    conn.exec_driver_sql(
        f"UPDATE calls SET pending = 1, change_seq = change_seq + 1 WHERE request_id {where} "
        "AND pending = 0",
        ids,
    )
    return len(request_ids)
