"""Ingest's SQL on SQLite (``billing.ingest.repository``).

SQLite has one writer at a time (``BEGIN IMMEDIATE``): a group reads its calls' numbers and
state first, numbers the calls not stored yet (one more than the largest so far), inserts the
events with their numbers, then upserts the calls. Nothing can change those calls in between.
Rows go in multi-row statements of a few fixed sizes (``_CHUNKS``), each prepared once and
cached by the driver; one multi-row statement instead of one step per row also means one
release of the GIL instead of hundreds.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from sqlalchemy.engine import Connection

from billing.ingest.rows import CallFields, Inserted
from billing.ingest.sql.common import CALL_COLUMNS, EVENT_COLUMNS, event_texts
from billing.storage.types import sqlite_text

if TYPE_CHECKING:
    from billing.ingest.prepare import EventRow

#: Rows per multi-row statement, largest first: a group of any size runs as a few statements of
#: these sizes, then one statement for the rest (fewer than the smallest size). At most 11
#: parameters a row: within 32766 (SQLite ≥ 3.32), or 999 before.
_CHUNKS = (256, 128, 64, 32) if sqlite3.sqlite_version_info >= (3, 32) else (90, 45, 22)


class _MultiRow(NamedTuple):
    """``head VALUES marks, marks, … tail``: ``sql[n]`` is the statement for ``n`` rows, for
    each size of ``_CHUNKS`` and every count below the smallest one (built once, at import)."""

    head: str
    marks: str
    tail: str
    sql: dict[int, str]


def _multi_row(head: str, marks: str, tail: str) -> _MultiRow:
    sizes = (*_CHUNKS, *range(1, _CHUNKS[-1]))
    return _MultiRow(
        head, marks, tail, {n: f"{head} VALUES {', '.join([marks] * n)}{tail}" for n in sizes}
    )


def _many(conn: Connection, statement: _MultiRow, params: Sequence[tuple[Any, ...]]) -> int:
    """``statement`` over ``params`` in a few multi-row statements; returns the number of rows
    changed."""
    changed = 0
    i = 0
    sql = statement.sql
    for size in (*_CHUNKS, len(params) % _CHUNKS[-1]):
        while size and len(params) - i >= size:
            flat = tuple(itertools.chain.from_iterable(params[i : i + size]))
            changed += conn.exec_driver_sql(sql[size], flat).rowcount
            i += size
    return changed


#: Ids per lookup statement; its ``IN`` lists come in powers of two up to it, the ids padded
#: with NULLs (which match nothing) to the next size.
_LOOKUP = 512


def _in_lists(template: str) -> dict[int, str]:
    """``template`` with ``{marks}`` replaced by n ``?`` for each power of two n ≤ ``_LOOKUP``."""
    sizes = (1 << k for k in range(_LOOKUP.bit_length()))
    return {n: template.format(marks=", ".join(["?"] * n)) for n in sizes}


def _padded(ids: Sequence[str]) -> tuple[int, tuple[str | None, ...]]:
    """The ``_in_lists`` size for ``ids`` (1 to ``_LOOKUP`` of them) and the ids padded to it."""
    size = 1 << (len(ids) - 1).bit_length()
    return size, (*ids, *[None] * (size - len(ids)))


#: The stored calls among ``{marks}`` as one JSON array of [request_id, call_no, no key,
#: pending], and the largest number so far: one row, because the driver gives up the GIL for
#: every row it steps to, and the writer thread may then wait for it while the event loop
#: validates posts.
READ_CALLS = _in_lists(
    "SELECT (SELECT json_group_array(json_array(request_id, call_no, api_key_id IS NULL, "
    "pending)) FROM calls WHERE request_id IN ({marks})), "
    "(SELECT coalesce(max(call_no), 0) FROM calls)"
)
#: An ``EventRow``'s values and its call's number.
INSERT_EVENTS = _multi_row(
    f"INSERT INTO events ({EVENT_COLUMNS})",
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    " ON CONFLICT (event_id) DO NOTHING",
)
LAST_ROWID = "SELECT last_insert_rowid()"
EVENTS_AFTER = "SELECT event_id FROM events WHERE seq > ?"
STORED_HASHES = _in_lists("SELECT event_id, content_hash FROM events WHERE event_id IN ({marks})")
#: SQLite rewrites the index entries of every column a SET names, even to the same value: the
#: upsert creates the new calls and marks pending the reconciled ones, and the stream.started
#: fields of a call that already existed without a key are filled in by ``FILL_STARTED`` (a
#: no-op for nearly every row).
UPSERT_CALLS = _multi_row(
    f"INSERT INTO calls ({CALL_COLUMNS})",
    "(?, ?, ?, ?, 1, 1, 'open', 0, 0, '[]', ?, ?, ?, ?, ?, ?, ?)",
    " ON CONFLICT (request_id) DO UPDATE SET last_received_at = excluded.last_received_at, "
    "change_seq = calls.change_seq + 1, pending = 1 WHERE calls.pending = 0",
)
FILL_STARTED = (
    "UPDATE calls SET api_key_id = ?, model = ?, protocol = ?, started_at = ?, metadata = ?, "
    "provider = ?, upstream_account = ? WHERE request_id = ? AND api_key_id IS NULL"
)


class _StoredCalls:
    """What a group reads of its calls before inserting (``SqliteIngest._read_calls``)."""

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


class SqliteIngest:
    """``IngestRepository`` on SQLite."""

    #: One writer thread: SQLite has one writer anyway, and queueing in the process avoids the
    #: busy handler's sleeps; it shares the app's engine and its in-process write lock.
    writers = 1
    writers_share_engine = True

    def make_partition(self, conn: Connection, year: int, month: int) -> bool:
        return False  # one table, no partitions

    def insert_events(
        self, conn: Connection, rows: Sequence[EventRow], calls: CallFields, *, fill_raced: bool
    ) -> Inserted:
        stored = self._read_calls(conn, sorted(calls))
        numbers = stored.numbers
        changed = _many(
            conn, INSERT_EVENTS, [(*event_texts(row), numbers[row.request_id]) for row in rows]
        )
        if changed == len(rows):
            return Inserted(None, set(), stored)
        if changed == 0:
            return Inserted(set(), set(), stored)
        # One writer at a time, so the rows these statements inserted got the consecutive seqs
        # that end at the last one inserted.
        last = conn.exec_driver_sql(LAST_ROWID).scalar_one()
        ids = set(conn.exec_driver_sql(EVENTS_AFTER, (last - changed,)).scalars())
        return Inserted(ids, set(), stored)

    def _read_calls(self, conn: Connection, request_ids: Sequence[str]) -> _StoredCalls:
        """Each call's ``call_no``: the stored one, or for a call not stored yet one more than
        the largest so far (in request_id order); and which stored calls have no key, and which
        are pending. Runs under SQLite's write lock, so no other writer can take the same
        numbers."""
        numbers: dict[str, int | None] = {}
        keyless: set[str] = set()
        pending: set[str] = set()
        top = 0
        for at in range(0, len(request_ids), _LOOKUP):
            size, params = _padded(request_ids[at : at + _LOOKUP])
            stored, top = conn.exec_driver_sql(READ_CALLS[size], params).one()
            for request_id, call_no, no_key, is_pending in orjson.loads(stored):
                numbers[request_id] = call_no
                if no_key:
                    keyless.add(request_id)
                if is_pending:
                    pending.add(request_id)
        numbers.update(
            (rid, top + n) for n, rid in enumerate((r for r in request_ids if r not in numbers), 1)
        )
        return _StoredCalls(numbers, keyless, pending)

    def stored_hashes(self, conn: Connection, event_ids: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for at in range(0, len(event_ids), _LOOKUP):
            size, params = _padded(event_ids[at : at + _LOOKUP])
            found.update(
                {eid: digest for eid, digest in conn.exec_driver_sql(STORED_HASHES[size], params)}
            )
        return found

    def touch_calls(self, conn: Connection, calls: CallFields, inserted: Inserted) -> None:
        """See ``IngestRepository.touch_calls``. A call found pending (read in this
        transaction, under the write lock: nothing changed it since) is left out of the upsert,
        which would leave it alone anyway: in a stream's later events nearly every call is
        pending, and the no-op rows would cost the writer thread."""
        stored = inserted.stored
        assert isinstance(stored, _StoredCalls)
        texts: dict[datetime, str] = {}
        params = []
        numbers = stored.numbers
        fill: list[tuple[Any, ...]] = []
        pending = stored.pending
        for rid in sorted(calls):
            first, last, started, _ = calls[rid]
            fields: tuple[Any, ...] = (None, None, None, None, None, None, None)
            if started is not None:
                key, model, protocol, metadata, provider, account = started.started
                fields = (key, model, protocol, started.occurred_text, metadata, provider, account)
                if rid in stored.keyless:
                    fill.append((*fields, rid))
            if rid in pending:
                continue
            first_text = texts.get(first)
            if first_text is None:
                first_text = texts[first] = sqlite_text(first)
            last_text = texts.get(last)
            if last_text is None:
                last_text = texts[last] = sqlite_text(last)
            params.append((numbers[rid], rid, first_text, last_text, *fields))
        if params:
            _many(conn, UPSERT_CALLS, params)
        # Calls that existed before without a key (their stream.started arrived late): usually
        # none.
        if fill:
            conn.exec_driver_sql(FILL_STARTED, fill)
