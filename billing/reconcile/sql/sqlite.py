"""The reconciler's SQL on SQLite (``billing.reconcile.repository``).

Times are stored as naive UTC text in one fixed format (``billing.storage.types``), so text
order is time order: the step compares and writes back times as that text, unparsed. Reads use
the driver's own cursor (tens of thousands of rows per step, no result processing); writes are
``executemany`` of prepared statements (one C loop each).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from billing.reconcile.ledger import ENTRY_COLUMNS
from billing.reconcile.rows import Update
from billing.reconcile.sql import common as core
from billing.reconcile.sql.sqlite_fastpath import SqliteSettleCommon
from billing.storage.lists import with_ids
from billing.storage.types import cached_sqlite_text

if TYPE_CHECKING:
    from billing.reconcile.entries import Entry

READ_STATES = """
SELECT request_id, settled, attempts, call_no, last_received_at, api_key_id, model, started_at
FROM calls WHERE request_id IN ({ids})
"""

# A call's events are found by its number (index events(call_no, seq), see Event).
EVENT_BODIES = """
SELECT request_id, body, received_at FROM events
WHERE call_no IN (SELECT call_no FROM calls WHERE request_id IN ({ids}))
    AND type <> 'stream.tokens'
"""

# stream.tokens folded per call and attempt: the earliest and latest occurred_at, the largest of
# each counter (from the columns ingest fills in from the validated event), the latest arrival.
FOLD_TOKENS = """
SELECT min(request_id), attempt, min(occurred_at), max(occurred_at),
    max(output_tokens_delivered), max(output_tokens_generated), max(received_at)
FROM events
WHERE call_no IN (SELECT call_no FROM calls WHERE request_id IN ({ids}))
    AND type = 'stream.tokens'
GROUP BY call_no, attempt
"""

_SET = ", ".join(
    "settled_at = COALESCE(calls.settled_at, ?)" if name == "settled_at" else f"{name} = ?"
    for name in core.CALL_SET
)
_SET_IDENTITY = ", ".join(f"{name} = ?" for name in core.CALL_IDENTITY)

#: A call's new figures (parameters: ``call_values``, then request_id).
UPDATE_CALL = f"UPDATE calls SET {_SET}, pending = false WHERE request_id = ?"
#: The same, with its identity columns too (``call_values``, ``CALL_IDENTITY``, request_id).
UPDATE_CALL_AND_IDENTITY = (
    f"UPDATE calls SET {_SET}, {_SET_IDENTITY}, pending = false WHERE request_id = ?"
)

DELETE_ATTEMPTS = "DELETE FROM call_attempts WHERE request_id IN ({ids})"
INSERT_ATTEMPT = (
    f"INSERT INTO call_attempts ({', '.join(core.ATTEMPT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(core.ATTEMPT_COLUMNS))})"
)
INSERT_ENTRY = (
    f"INSERT INTO ledger_entries ({', '.join(ENTRY_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(ENTRY_COLUMNS))})"
)


def _text(value: datetime | None) -> str | None:
    """A time as SQLite stores it (None stays None)."""
    return None if value is None else cached_sqlite_text(value)


def _fetch(session: Session, statement: str, request_ids: Sequence[str]) -> list[Any]:
    """The rows of ``statement`` (an ``{ids}`` list) for every chunk of ``request_ids``."""
    cursor = session.connection().connection.cursor()
    rows: list[Any] = []
    try:
        for start in range(0, len(request_ids), core.CHUNK):
            chunk = tuple(request_ids[start : start + core.CHUNK])
            cursor.execute(with_ids(statement, len(chunk)), chunk)
            rows.extend(cursor.fetchall())
    finally:
        cursor.close()
    return rows


class SqliteReconcile(SqliteSettleCommon, core.CoreReconcile):
    """``ReconcileRepository`` on SQLite."""

    steps_at_once = False  # one writer at a time
    states, bodies, folds = READ_STATES, EVENT_BODIES, FOLD_TOKENS
    fetch = staticmethod(_fetch)

    def utc(self, value: Any) -> datetime:
        return datetime.fromisoformat(value + "+00:00")  # naive UTC text: parsed with its offset

    def driver_time(self, value: datetime) -> Any:
        return cached_sqlite_text(value)

    def write_calls(self, session: Session, updates: Sequence[Update], now: datetime) -> None:
        # SQLite rewrites the index entries of every column a SET names, even to the same value:
        # the indexed identity columns are only named for the calls where they changed.
        plain: list[tuple[Any, ...]] = []
        changed: list[tuple[Any, ...]] = []
        now_text = _text(now)
        for old, new, fig in updates:
            values = core.call_values(new, fig, now_text, _text)
            identity = (new.api_key_id, new.model, _text(new.started_at))
            if old.stored[1:] == identity:
                plain.append((*values, new.request_id))
            else:
                changed.append((*values, *identity, new.request_id))
        conn = session.connection()
        if plain:
            conn.exec_driver_sql(UPDATE_CALL, plain)
        if changed:
            conn.exec_driver_sql(UPDATE_CALL_AND_IDENTITY, changed)

    def write_attempts(self, session: Session, updates: Sequence[Update]) -> None:
        conn = session.connection()
        stale = core.had_attempts(updates)
        for start in range(0, len(stale), core.CHUNK):
            chunk = tuple(stale[start : start + core.CHUNK])
            conn.exec_driver_sql(with_ids(DELETE_ATTEMPTS, len(chunk)), chunk)
        rows = core.attempt_rows(updates)
        if rows:
            conn.exec_driver_sql(INSERT_ATTEMPT, rows)

    def write_entries(self, session: Session, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        # Every entry of a step is booked at the step's clock.
        booked = {at: _text(at) for at in {entry.booked_at for entry in entries}}
        session.connection().exec_driver_sql(
            INSERT_ENTRY, [entry.row(booked.get(entry.booked_at), _text) for entry in entries]
        )
