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
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

from billing.errors import Conflict, EventConflict
from billing.ingest.schemas import StreamStarted
from billing.ingest.validation import ParsedEvent
from billing.storage.db import write_transaction


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
    canonical = parsed.event.model_dump(mode="json")
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


class _Row:
    """One event to store: the first occurrence of its ``event_id`` in its batch, with the
    column values computed up front (off the writer thread)."""

    __slots__ = (
        "attempt",
        "body",
        "digest",
        "event_id",
        "index",
        "occurred_at",
        "occurred_text",
        "parsed",
        "request_id",
        "type",
    )

    def __init__(self, digest: str, index: int, parsed: ParsedEvent) -> None:
        event = parsed.event
        self.event_id = event.event_id
        self.request_id = event.request_id
        self.attempt = event.attempt
        self.type = event.type
        self.occurred_at = event.occurred_at
        self.occurred_text = _sqlite_time(event.occurred_at)  # SQLite's form of the column
        self.body = orjson.dumps(parsed.raw).decode()
        self.digest = digest
        self.index = index
        self.parsed = parsed


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
    for index, parsed in enumerate(batch):
        event_id = parsed.event.event_id
        digest = content_hash(parsed)
        seen = first.get(event_id)
        if seen is not None:
            if seen.digest != digest:
                conflicts.append(Conflict(index, event_id))
            continue
        row = _Row(digest, index, parsed)
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
    new event is marked pending for the reconciler, with ``last_received_at = now``.
    """
    prepared = prepare_batch(batch, now)
    accepted = _store(session, [prepared])[0]
    return IngestResult(accepted=accepted, duplicates=len(batch) - accepted)


def write_group(
    sessions: sessionmaker[Session], items: Sequence[PreparedBatch]
) -> list[IngestResult | EventConflict]:
    """Store several batches in one transaction (one commit, one disk flush); committed on return.

    Each batch gets what it would have got alone, in the order given: an ``IngestResult``, or an
    ``EventConflict`` (that batch stored nothing). Conflicts are rare: when one shows up, the shared
    transaction is rolled back and the batches are stored again one by one, each in a savepoint.
    A database error fails every batch of the group (nothing of any of them is stored).
    """
    try:
        with write_transaction(sessions) as session:
            counts = _store(session, items)
    except EventConflict as conflict:
        if len(items) == 1:
            return [conflict]
        return _write_one_by_one(sessions, items)
    return [
        IngestResult(accepted=n, duplicates=len(item.events) - n)
        for n, item in zip(counts, items, strict=True)
    ]


def _write_one_by_one(
    sessions: sessionmaker[Session], items: Sequence[PreparedBatch]
) -> list[IngestResult | EventConflict]:
    results: list[IngestResult | EventConflict] = []
    with write_transaction(sessions) as session:
        for item in items:
            try:
                with session.begin_nested():
                    n = _store(session, [item])[0]
            except EventConflict as conflict:
                results.append(conflict)
                continue
            results.append(IngestResult(accepted=n, duplicates=len(item.events) - n))
    return results


def _store(session: Session, items: Sequence[PreparedBatch]) -> list[int]:
    """Insert the events of ``items`` and touch their calls; returns the accepted count per item.

    Raises ``EventConflict`` on any conflict (for a single item: its conflicts, first occurrences
    in batch order; for several: the caller falls back to one by one).
    """
    owner: dict[str, tuple[int, str]] = {}
    rows: list[tuple[_Row, datetime]] = []
    for i, item in enumerate(items):
        for row in item.rows:
            seen = owner.get(row.event_id)
            if seen is None:
                owner[row.event_id] = (i, row.digest)
                rows.append((row, item.now))
            elif seen[1] != row.digest:
                raise EventConflict([Conflict(row.index, row.event_id)])
    if not rows:
        return [0] * len(items)
    # A fixed order makes concurrent transactions take index locks in the same order (no deadlocks).
    rows.sort(key=lambda pair: pair[0].event_id)
    conn = session.connection()
    inserted = _insert_events(conn, rows)
    if len(inserted) < len(rows):
        skipped = [row.event_id for row, _ in rows if row.event_id not in inserted]
        stored = _stored_hashes(conn, skipped)
        bad = [eid for eid in skipped if stored.get(eid) != owner[eid][1]]
        if bad:
            if len(items) > 1:
                raise EventConflict([])
            by_id = {row.event_id: row for row in items[0].rows}
            raise EventConflict(
                sorted((Conflict(by_id[eid].index, eid) for eid in bad), key=lambda c: c.index)
            )
    counts = [0] * len(items)
    new_events: list[tuple[ParsedEvent, datetime, int]] = []
    for i, item in enumerate(items):
        for row in item.rows:
            if row.event_id in inserted and owner[row.event_id][0] == i:
                counts[i] += 1
                new_events.append((row.parsed, item.now, i))
    if new_events:
        _touch_calls(session, new_events, max(item.now for item in items))
    return counts


# --- statements per dialect ------------------------------------------------------------------


def _sqlite_time(value: datetime) -> str:
    """The text SQLAlchemy's SQLite DATETIME stores for a UTC instant (``UTCDateTime``):
    ``YYYY-MM-DD HH:MM:SS.ffffff``, always with microseconds."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


#: Rows per multi-row statement on SQLite, largest first: a group of any size runs as a few
#: statements of these sizes (each prepared once and cached by the driver). One multi-row
#: statement instead of one step per row also means one release of the GIL instead of hundreds.
_SQLITE_CHUNKS = (
    (256, 64, 16, 4, 1) if sqlite3.sqlite_version_info >= (3, 32) else (120, 30, 8, 2, 1)
)  # at most 8 parameters a row: within 32766 (SQLite ≥ 3.32), or 999 before


@functools.lru_cache(maxsize=64)
def _multi_row(head: str, marks: str, tail: str, rows: int) -> str:
    return f"{head} VALUES {', '.join([marks] * rows)}{tail}"


def _sqlite_many(
    conn: Connection, head: str, marks: str, tail: str, params: Sequence[tuple[Any, ...]]
) -> int:
    """``head VALUES (…), (…) tail`` over ``params`` in a few multi-row statements; returns the
    number of rows changed."""
    changed = 0
    i = 0
    for size in _SQLITE_CHUNKS:
        while len(params) - i >= size:
            flat = tuple(itertools.chain.from_iterable(params[i : i + size]))
            changed += conn.exec_driver_sql(_multi_row(head, marks, tail, size), flat).rowcount
            i += size
    return changed


_EVENT_COLUMNS = "event_id, request_id, attempt, type, occurred_at, received_at, content_hash, body"

_SQLITE_INSERT_EVENTS = (
    f"INSERT INTO events ({_EVENT_COLUMNS})",
    "(?, ?, ?, ?, ?, ?, ?, ?)",
    " ON CONFLICT (event_id) DO NOTHING",
)
_PG_INSERT_EVENTS = (
    f"INSERT INTO events ({_EVENT_COLUMNS}) "
    "SELECT * FROM unnest(%b::varchar[], %b::varchar[], %b::integer[], %b::varchar[], "
    "%b::timestamptz[], %b::timestamptz[], %b::varchar[], %b::text[]) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)


def _insert_events(conn: Connection, rows: Sequence[tuple[_Row, datetime]]) -> set[str]:
    """Insert the rows, skipping stored ``event_id``s; returns the ids actually inserted."""
    if conn.dialect.name == "postgresql":
        columns = (
            [row.event_id for row, _ in rows],
            [row.request_id for row, _ in rows],
            [row.attempt for row, _ in rows],
            [row.type for row, _ in rows],
            [row.occurred_at for row, _ in rows],
            [now for _, now in rows],
            [row.digest for row, _ in rows],
            [row.body for row, _ in rows],
        )
        return set(conn.exec_driver_sql(_PG_INSERT_EVENTS, columns).scalars())
    # SQLite: one writer at a time (BEGIN IMMEDIATE), so the rows this statement inserted are
    # exactly those with a seq above the largest before it.
    before = conn.exec_driver_sql("SELECT coalesce(max(seq), 0) FROM events").scalar_one()
    params = []
    received: dict[datetime, str] = {}
    for row, now in rows:
        at = received.get(now)
        if at is None:
            at = received[now] = _sqlite_time(now)
        params.append(
            (
                row.event_id,
                row.request_id,
                row.attempt,
                row.type,
                row.occurred_text,
                at,
                row.digest,
                row.body,
            )
        )
    if _sqlite_many(conn, *_SQLITE_INSERT_EVENTS, params) == len(params):
        return {row.event_id for row, _ in rows}
    return set(
        conn.exec_driver_sql("SELECT event_id FROM events WHERE seq > ?", (before,)).scalars()
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


_ON_CONFLICT_TOUCH = (
    " ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
    "change_seq = calls.change_seq + 1, pending = excluded.pending"
)
_ON_CONFLICT = (
    _ON_CONFLICT_TOUCH
    + ", "
    + ", ".join(
        _keep_or_fill(c) for c in ("api_key_id", "model", "protocol", "started_at", "metadata")
    )
)
_CALL_COLUMNS = (
    "request_id, first_received_at, last_received_at, change_seq, pending, status, settled, "
    "attempts, anomalies, api_key_id, model, protocol, started_at, metadata"
)
# SQLite rewrites the index entries of every column a SET names, even to the same value: the
# upsert sets only the bookkeeping columns, and the stream.started fields of a call that already
# existed without a key are filled in by a second statement (a no-op for nearly every row).
_SQLITE_UPSERT_CALLS = (
    f"INSERT INTO calls ({_CALL_COLUMNS})",
    "(?, ?, ?, 1, 1, 'open', 0, 0, '[]', ?, ?, ?, ?, ?)",
    _ON_CONFLICT_TOUCH,
)
_SQLITE_FILL_STARTED = (
    "UPDATE calls SET api_key_id = ?, model = ?, protocol = ?, started_at = ?, metadata = ? "
    "WHERE request_id = ? AND api_key_id IS NULL"
)
_PG_UPSERT_CALLS = (
    f"INSERT INTO calls ({_CALL_COLUMNS}) "
    "SELECT r, f, l, 1, true, 'open', false, 0, '[]'::json, k, m, p, s, md::json "
    "FROM unnest(%b::varchar[], %b::timestamptz[], %b::timestamptz[], %b::varchar[], "
    "%b::varchar[], %b::varchar[], %b::timestamptz[], %b::text[]) AS u(r, f, l, k, m, p, s, md)"
    + _ON_CONFLICT
)


def _touch_calls(
    session: Session, new_events: Sequence[tuple[ParsedEvent, datetime, int]], now: datetime
) -> None:
    """Create or mark pending the calls with new events (one statement); record what the
    ``stream.started`` of the lowest attempt says, for a call whose key is not known yet.

    ``new_events`` are (event, time received, batch number), batch by batch in arrival order; a
    call's ``last_received_at`` is the latest of its events' arrival times (``now`` at most).
    """
    calls: dict[str, list[Any]] = {}
    started_by: dict[str, tuple[int, int]] = {}
    for parsed, received, batch_no in new_events:
        event = parsed.event
        row = calls.get(event.request_id)
        if row is None:
            # request_id, first, last, api_key_id, model, protocol, started_at, metadata
            row = [event.request_id, received, received, None, None, None, None, None]
            calls[event.request_id] = row
        elif received > row[2]:
            row[2] = received
        if isinstance(event, StreamStarted):
            # The first batch that brings a stream.started sets the fields (its lowest attempt).
            seen = started_by.get(event.request_id)
            if seen is None or (seen[0] == batch_no and event.attempt < seen[1]):
                started_by[event.request_id] = (batch_no, event.attempt)
                row[3:8] = [
                    event.api_key_id,
                    event.model,
                    event.protocol,
                    event.occurred_at,
                    json.dumps(event.metadata),
                ]
    ordered = [calls[key] for key in sorted(calls)]
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        columns = [list(column) for column in zip(*ordered, strict=True)]
        conn.exec_driver_sql(_PG_UPSERT_CALLS, tuple(columns))
        return
    params = [
        (
            rid,
            _sqlite_time(first),
            _sqlite_time(last),
            key,
            model,
            protocol,
            _sqlite_time(started) if started is not None else None,
            metadata,
        )
        for rid, first, last, key, model, protocol, started, metadata in ordered
    ]
    _sqlite_many(conn, *_SQLITE_UPSERT_CALLS, params)
    started = {p[0]: p for p in params if p[3] is not None}
    if not started:
        return
    # Calls that existed before without a key (their stream.started arrived late): usually none.
    keyless: list[str] = []
    ids = list(started)
    for at in range(0, len(ids), 500):
        chunk = ids[at : at + 500]
        keyless += conn.exec_driver_sql(
            "SELECT request_id FROM calls WHERE api_key_id IS NULL "
            f"AND request_id IN ({', '.join(['?'] * len(chunk))})",
            tuple(chunk),
        ).scalars()
    if keyless:
        conn.exec_driver_sql(_SQLITE_FILL_STARTED, [(*started[rid][3:8], rid) for rid in keyless])
