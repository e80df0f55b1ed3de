"""The archive's statements both databases share (SQLAlchemy Core over ``events`` and
``calls``); ``CoreArchive`` is the part of both repositories they have in common."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy import Connection, and_, delete, func, insert, or_, select
from sqlalchemy.sql.elements import ColumnElement

from billing.archive.rows import EventRecord
from billing.storage.models import Call, Event

_TABLE = Event.__table__
#: The columns of ``events`` an archive holds, in the table's order (every column of it).
COLUMNS = tuple(column.name for column in _TABLE.columns)
#: The columns that are never null (the Parquet fields that are not nullable).
REQUIRED = frozenset(column.name for column in _TABLE.columns if not column.nullable)
_COLUMNS = [_TABLE.c[name] for name in COLUMNS]
#: Rows per read of a month (and per Parquet row group).
CHUNK = 50_000


def _in(start: datetime, end: datetime) -> ColumnElement[bool]:
    return and_(Event.occurred_at >= start, Event.occurred_at < end)


class CoreArchive:
    """What both databases run alike."""

    def oldest(self, conn: Connection, before: datetime) -> datetime | None:
        found: datetime | None = conn.scalar(
            select(func.min(Event.occurred_at)).where(Event.occurred_at < before)
        )
        return found

    def open_calls(self, conn: Connection, start: datetime, end: datetime) -> int:
        numbers = select(Event.call_no).where(_in(start, end))
        query = select(func.count()).where(
            Call.call_no.in_(numbers), or_(Call.pending.is_(True), Call.settled.is_(False))
        )
        return int(conn.scalar(query) or 0)

    def month_rows(
        self, conn: Connection, start: datetime, end: datetime
    ) -> Iterator[list[EventRecord]]:
        query = select(*_COLUMNS).where(_in(start, end)).order_by(Event.seq)
        # (on the statement: the connection's own options would stay set for what follows)
        result = conn.execute(query.execution_options(yield_per=CHUNK))
        for chunk in result.partitions():
            yield [tuple(row) for row in chunk]

    def delete_month(self, conn: Connection, start: datetime, end: datetime) -> int:
        return conn.execute(delete(Event).where(_in(start, end))).rowcount

    def insert_rows(self, conn: Connection, rows: Sequence[EventRecord]) -> None:
        if rows:
            conn.execute(insert(Event), [dict(zip(COLUMNS, row, strict=True)) for row in rows])

    def lock_month(self, conn: Connection, start: datetime, end: datetime) -> None:
        """Nothing by default (SQLite: the write transaction holds the database's one lock)."""
