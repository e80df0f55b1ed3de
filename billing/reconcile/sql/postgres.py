"""The reconciler's SQL on PostgreSQL (``billing.reconcile.repository``).

A step's calls are passed as one array parameter (``= ANY(%b)``), so each read is one statement
whatever the step's size; reads use the driver's own cursor (tens of thousands of rows per step,
no result processing). Writes are one statement per table, so a step of thousands of calls is a
handful of round trips: the ``calls`` UPDATE takes its rows as arrays (``unnest``), the attempts
and ledger entries are inserted with ``COPY``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.reconcile.ledger import ENTRY_COLUMNS
from billing.reconcile.rows import Update
from billing.reconcile.sql import common as core
from billing.reconcile.sql.postgres_fastpath import PostgresSettleCommon

if TYPE_CHECKING:
    from billing.reconcile.entries import Entry

READ_STATES = """
SELECT request_id, settled, attempts, call_no, last_received_at, api_key_id, model, started_at
FROM calls WHERE request_id = ANY(%b)
"""

# A call's events are found by its number (index events(call_no, seq), see Event).
EVENT_BODIES = """
SELECT request_id, body, received_at FROM events
WHERE call_no IN (SELECT call_no FROM calls WHERE request_id = ANY(%b))
    AND type <> 'stream.tokens'
"""

# stream.tokens folded per call and attempt: the earliest and latest occurred_at, the largest of
# each counter (from the columns ingest fills in from the validated event), the latest arrival.
FOLD_TOKENS = """
SELECT min(request_id), attempt, min(occurred_at), max(occurred_at),
    max(output_tokens_delivered), max(output_tokens_generated), max(received_at)
FROM events
WHERE call_no IN (SELECT call_no FROM calls WHERE request_id = ANY(%b))
    AND type = 'stream.tokens'
GROUP BY call_no, attempt
"""

#: The PostgreSQL type of each of ``CALL_SET``, ``CALL_IDENTITY`` and request_id (the arrays of
#: the ``calls`` UPDATE).
_CALL_TYPES = {
    "protocol": "varchar",
    "metadata": "text",
    "ended_at": "timestamptz",
    "status": "varchar",
    "settled": "bool",
    "settled_at": "timestamptz",
    "usage_source": "varchar",
    "attempts": "int4",
    **dict.fromkeys(TOKEN_FIELDS, "int8"),
    "cost_pusd": "int8",
    "anomalies": "text",
    "error_type": "varchar",
    "stop_reason": "varchar",
    "last_received_at": "timestamptz",
    "service_tier": "varchar",
    "units": "text",
    "other_models": "text",
    "customer_id": "varchar",
    "plan_id": "varchar",
    "charge_pusd": "int8",
    "counters": "text",
    "provider_cost_pusd": "int8",
    "inference_geo": "varchar",
    "leakage_pusd": "int8",
    "api_key_id": "varchar",
    "model": "varchar",
    "started_at": "timestamptz",
    "request_id": "varchar",
}
_UPDATED = (*core.CALL_SET, *core.CALL_IDENTITY)


def _set(name: str) -> str:
    if name == "settled_at":
        return "settled_at = COALESCE(calls.settled_at, u.settled_at)"
    if name in ("metadata", "anomalies", "units", "other_models", "counters"):
        return f"{name} = u.{name}::json"
    return f"{name} = u.{name}"


_ARRAYS = ", ".join(f"%b::{_CALL_TYPES[name]}[]" for name in (*_UPDATED, "request_id"))

#: Every call of a step at once: one array per column (``call_values``, ``CALL_IDENTITY``,
#: request_id).
UPDATE_CALLS = (
    f"UPDATE calls SET {', '.join(_set(name) for name in _UPDATED)}, pending = false "
    f"FROM unnest({_ARRAYS}) AS u({', '.join((*_UPDATED, 'request_id'))}) "
    "WHERE calls.request_id = u.request_id"
)

DELETE_ATTEMPTS = "DELETE FROM call_attempts WHERE request_id = ANY(%b::varchar[])"
COPY_ATTEMPTS = f"COPY call_attempts ({', '.join(core.ATTEMPT_COLUMNS)}) FROM STDIN"
COPY_ENTRIES = f"COPY ledger_entries ({', '.join(ENTRY_COLUMNS)}) FROM STDIN"


def _same(value: datetime | None) -> datetime | None:
    return value


def _fetch(session: Session, statement: str, request_ids: Sequence[str]) -> list[Any]:
    """The rows of ``statement`` (one array of request ids) for every chunk of ``request_ids``."""
    cursor = session.connection().connection.cursor()
    rows: list[Any] = []
    try:
        for start in range(0, len(request_ids), core.CHUNK):
            cursor.execute(statement, (list(request_ids[start : start + core.CHUNK]),))
            rows.extend(cursor.fetchall())
    finally:
        cursor.close()
    return rows


def _copy(session: Session, statement: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` with ``COPY … FROM STDIN``: psycopg formats each row in C, where an
    ``unnest`` of arrays builds every array in Python."""
    if not rows:
        return
    cursor = session.connection().connection.cursor()
    try:
        with cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    finally:
        cursor.close()


class PostgresReconcile(PostgresSettleCommon, core.CoreReconcile):
    """``ReconcileRepository`` on PostgreSQL."""

    steps_at_once = True  # each step locks its calls: FOR UPDATE SKIP LOCKED
    states, bodies, folds = READ_STATES, EVENT_BODIES, FOLD_TOKENS
    fetch = staticmethod(_fetch)

    def utc(self, value: datetime) -> datetime:
        return value if value.tzinfo is UTC else value.astimezone(UTC)

    def driver_time(self, value: datetime) -> Any:
        return value

    def write_calls(self, session: Session, updates: Sequence[Update], now: datetime) -> None:
        if not updates:
            return
        rows = [
            (
                *core.call_values(new, fig, now, _same),
                new.api_key_id,
                new.model,
                new.started_at,
                new.request_id,
            )
            for _old, new, fig in updates
        ]
        columns = tuple(list(column) for column in zip(*rows, strict=True))
        session.connection().exec_driver_sql(UPDATE_CALLS, columns)

    def write_attempts(self, session: Session, updates: Sequence[Update]) -> None:
        stale = core.had_attempts(updates)
        if stale:
            session.connection().exec_driver_sql(DELETE_ATTEMPTS, (stale,))
        _copy(session, COPY_ATTEMPTS, core.attempt_rows(updates))

    def write_entries(self, session: Session, entries: Sequence[Entry]) -> None:
        rows = [entry.row(entry.booked_at, _same) for entry in entries]
        rows.sort(key=operator.itemgetter(0, 1))  # by request_id, seq
        _copy(session, COPY_ENTRIES, rows)
