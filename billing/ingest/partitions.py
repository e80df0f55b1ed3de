"""``events``' months made ahead (CONTRACT "Replicas, failover and archives (v3)": on PostgreSQL
the raw events are range-partitioned by month of ``occurred_at``; partitions are made ahead by
the service).

``billing serve`` runs ``make_partitions_ahead`` when it starts and every
``MAINTENANCE_EVERY_S`` in its background work (``billing.server.app``): the current month and
the ``AHEAD_MONTHS`` after it get their partition, so a month's events never wait for one. An
event of a month without one (a gateway's clock far off) lands in the default partition and
moves to its month's partition when that is made. A no-op on SQLite.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from billing.ingest.repository import repository
from billing.storage.db import write_connection

#: Months made after the current one.
AHEAD_MONTHS = 3
#: Seconds between two looks in ``billing serve``'s background work.
MAINTENANCE_EVERY_S = 3600.0


def months_ahead(now: datetime, ahead: int = AHEAD_MONTHS) -> list[tuple[int, int]]:
    """(year, month) of ``now`` (UTC) and of the ``ahead`` months after it."""
    index = now.year * 12 + now.month - 1
    return [((index + n) // 12, (index + n) % 12 + 1) for n in range(ahead + 1)]


def make_partitions_ahead(sessions: sessionmaker[Session], now: datetime) -> list[tuple[int, int]]:
    """Make the missing partitions of ``months_ahead(now)``, one transaction each; returns the
    months made."""
    made = []
    for year, month in months_ahead(now):
        with write_connection(sessions) as conn:
            if repository(conn).make_partition(conn, year, month):
                made.append((year, month))
    return made
