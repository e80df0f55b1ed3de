"""The SQL of the archive, as a ``Protocol``, and ``repository(conn)``, which gives the SQLite
or the PostgreSQL implementation (``billing.archive.sql``). Every method runs inside the
caller's transaction and never commits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql, sqlite

from billing.archive.rows import EventRecord
from billing.archive.sql.postgres import PostgresArchive
from billing.archive.sql.sqlite import SqliteArchive
from billing.storage.dialects import ByDialect
from billing.storage.lists import ARRAY_LIST, JSON_LIST


class ArchiveRepository(Protocol):
    """Reading, removing and putting back a month of ``events`` (``[start, end)`` of
    ``occurred_at``); the months archived (``archived_months``) and the calls parked meanwhile
    (``parked_calls``)."""

    def oldest(self, conn: Connection, before: datetime) -> datetime | None:
        """The earliest ``occurred_at`` before ``before``, if any."""
        ...

    def open_calls(self, conn: Connection, start: datetime, end: datetime) -> int:
        """How many calls with events in the month are not settled, or pending."""
        ...

    def lock_month(self, conn: Connection, start: datetime, end: datetime) -> None:
        """Hold off new events of the month until the transaction ends."""
        ...

    def month_rows(
        self, conn: Connection, start: datetime, end: datetime
    ) -> Iterator[list[EventRecord]]:
        """The month's events by ``seq``, in chunks."""
        ...

    def delete_month(self, conn: Connection, start: datetime, end: datetime) -> int:
        """Remove the month's events; how many."""
        ...

    def month_hashes(
        self, conn: Connection, start: datetime, end: datetime, event_ids: list[str]
    ) -> dict[str, str]:
        """Of ``event_ids``, those in ``events`` now with an ``occurred_at`` in [``start``,
        ``end``), with their content hashes."""
        ...

    def insert_rows(self, conn: Connection, rows: Sequence[EventRecord]) -> None:
        """Put archived events back as they were (their ``seq`` included)."""
        ...

    def record_month(
        self, conn: Connection, start: datetime, end: datetime, archived_at: datetime, file: str
    ) -> None:
        """Note the month ``[start, end)`` as archived to ``file`` at ``archived_at``."""
        ...

    def archived_file(self, conn: Connection, start: datetime) -> str | None:
        """The file of the month that starts at ``start``, if it is archived."""
        ...

    def forget_month(self, conn: Connection, start: datetime) -> None:
        """The month that starts at ``start`` is archived no more."""
        ...

    def unpark(self, conn: Connection) -> int:
        """Make every parked call pending again, and forget them; how many."""
        ...

    def archived_calls(self, conn: Connection, request_ids: Sequence[str]) -> list[str]:
        """Of these calls, the settled ones that may have events in an archived month (one
        probe when no month is archived)."""
        ...

    def park(self, conn: Connection, request_ids: Sequence[str], now: datetime) -> None:
        """Leave these (locked, pending) calls as they are, not pending, and note them parked."""
        ...


_REPOSITORIES: ByDialect[ArchiveRepository] = ByDialect(
    sqlite=SqliteArchive(sqlite.insert, JSON_LIST),
    postgresql=PostgresArchive(postgresql.insert, ARRAY_LIST),
)


def repository(bind: Connection | Engine) -> ArchiveRepository:
    """The archive's repository of the database behind ``bind``."""
    return _REPOSITORIES.of(bind)
