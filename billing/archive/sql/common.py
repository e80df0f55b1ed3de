"""The archive's statements both databases share (SQLAlchemy Core over ``events`` and
``calls``); ``CoreArchive`` is the part of both repositories they have in common."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from sqlalchemy import (
    Connection,
    Select,
    and_,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from billing.archive.rows import EventRecord
from billing.storage.dialects import DialectInsert
from billing.storage.lists import Listed
from billing.storage.models import Call, Event, MonthArchive, ParkedCall

_TABLE = Event.__table__
#: The columns of ``events`` an archive holds, in the table's order (every column of it).
COLUMNS = tuple(column.name for column in _TABLE.columns)
#: The columns that are never null (the Parquet fields that are not nullable).
REQUIRED = frozenset(column.name for column in _TABLE.columns if not column.nullable)
_COLUMNS = [_TABLE.c[name] for name in COLUMNS]
#: Rows per read of a month (and per Parquet row group).
CHUNK = 50_000


#: Whether any month is archived (one probe each reconciliation step, before its fast path).
_ANY_ARCHIVED = select(exists().select_from(MonthArchive))


def _archived_calls(listed: Listed) -> Select[str]:
    """Of the bound calls (``ids``, one list parameter: a step's thousands), the settled ones
    that may have events in an archived month: the call existed when the month was archived,
    and its events as last settled (``started_at`` to ``ended_at``, the first and last
    ``occurred_at``; unknown: either way) reach into it."""
    return select(Call.request_id).where(
        listed(Call.request_id, "ids"),
        Call.settled.is_(True),
        exists().where(
            MonthArchive.archived_at > Call.first_received_at,
            or_(Call.started_at.is_(None), Call.started_at < MonthArchive.month_end),
            or_(Call.ended_at.is_(None), Call.ended_at >= MonthArchive.month_start),
        ),
    )


#: The calls parked made pending again (as a late event makes a call pending).
_UNPARK = (
    update(Call)
    .where(Call.request_id.in_(select(ParkedCall.request_id)))
    .values(pending=True, change_seq=Call.change_seq + 1)
)


def _in(start: datetime, end: datetime) -> ColumnElement[bool]:
    return and_(Event.occurred_at >= start, Event.occurred_at < end)


class CoreArchive:
    """What both databases run alike, given each one's ``INSERT`` construct (its ``ON CONFLICT
    DO NOTHING``) and list parameter (``listed``)."""

    def __init__(self, insert: DialectInsert, listed: Listed) -> None:
        self._listed = listed
        self._archived_calls = _archived_calls(listed)
        # Parked again (a call touching another archived month): kept with its first time.
        self._park = insert(ParkedCall).on_conflict_do_nothing(index_elements=["request_id"])

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

    def month_hashes(
        self, conn: Connection, start: datetime, end: datetime, event_ids: list[str]
    ) -> dict[str, str]:
        """Of ``event_ids``, those stored in the month, with their content hashes (one
        statement; PostgreSQL reads the month's partition and the default one alone: no index
        by ``event_id`` on ``events`` there)."""
        query = select(Event.event_id, Event.content_hash).where(
            _in(start, end), self._listed(Event.event_id, "ids")
        )
        found = conn.execute(query, {"ids": self._listed.value(event_ids)})
        return {event_id: digest for event_id, digest in found}

    def insert_rows(self, conn: Connection, rows: Sequence[EventRecord]) -> None:
        if rows:
            conn.execute(insert(Event), [dict(zip(COLUMNS, row, strict=True)) for row in rows])

    def lock_month(self, conn: Connection, start: datetime, end: datetime) -> None:
        """Nothing by default (SQLite: the write transaction holds the database's one lock)."""

    def record_month(
        self, conn: Connection, start: datetime, end: datetime, archived_at: datetime, file: str
    ) -> None:
        conn.execute(
            insert(MonthArchive).values(
                month_start=start, month_end=end, archived_at=archived_at, file=file
            )
        )

    def archived_file(self, conn: Connection, start: datetime) -> str | None:
        found: str | None = conn.scalar(
            select(MonthArchive.file).where(MonthArchive.month_start == start)
        )
        return found

    def forget_month(self, conn: Connection, start: datetime) -> None:
        conn.execute(delete(MonthArchive).where(MonthArchive.month_start == start))

    def unpark(self, conn: Connection) -> int:
        made = conn.execute(_UNPARK).rowcount
        conn.execute(delete(ParkedCall))
        return int(made)

    def archived_calls(self, conn: Connection, request_ids: Sequence[str]) -> list[str]:
        if not request_ids or not conn.scalar(_ANY_ARCHIVED):
            return []
        ids = self._listed.value(list(request_ids))
        return list(conn.scalars(self._archived_calls, {"ids": ids}))

    def park(self, conn: Connection, request_ids: Sequence[str], now: datetime) -> None:
        conn.execute(
            update(Call).where(Call.request_id.in_(list(request_ids))).values(pending=False)
        )
        conn.execute(self._park, [{"request_id": rid, "parked_at": now} for rid in request_ids])
