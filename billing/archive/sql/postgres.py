"""The archive on PostgreSQL.

A month is read and removed in one transaction that first locks, in ``SHARE ROW EXCLUSIVE``
mode, its partition and the default one (``events_YYYY_MM``, ``events_default``: migration
``0017_event_partitions``): a late event of that month waits until the month is archived instead
of being removed unread; ingest of every other month and every read go on. ``event_ids`` keeps
the archived events' ids and hashes, so a gateway that sends one again is answered as before
(a duplicate, or a 409); a restore adds them where missing (into another database, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection

from billing.archive.rows import EventRecord
from billing.archive.sql.common import COLUMNS, CoreArchive

PARTITION_OF = "SELECT to_regclass(%s) IS NOT NULL"
LOCK = "LOCK TABLE {tables} IN SHARE ROW EXCLUSIVE MODE"
KNOWN_IDS = (
    "INSERT INTO event_ids (event_id, content_hash) "
    "SELECT i, decode(h, 'hex') FROM unnest(%s::varchar[], %s::varchar[]) AS u(i, h) "
    "ON CONFLICT (event_id) DO NOTHING"
)
_ID = COLUMNS.index("event_id")
_HASH = COLUMNS.index("content_hash")


class PostgresArchive(CoreArchive):
    """``ArchiveRepository`` on PostgreSQL."""

    def lock_month(self, conn: Connection, start: datetime, end: datetime) -> None:
        partition = f"events_{start.year:04d}_{start.month:02d}"
        tables = ["events_default"]
        if conn.exec_driver_sql(PARTITION_OF, (partition,)).scalar():
            tables.insert(0, partition)
        conn.exec_driver_sql(LOCK.format(tables=", ".join(tables)))

    def insert_rows(self, conn: Connection, rows: Sequence[EventRecord]) -> None:
        super().insert_rows(conn, rows)
        if rows:
            ids = [row[_ID] for row in rows]
            hashes = [row[_HASH] for row in rows]
            conn.exec_driver_sql(KNOWN_IDS, (ids, hashes))
