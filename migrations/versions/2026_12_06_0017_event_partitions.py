"""PostgreSQL: raw events range-partitioned by month of occurred_at; event_ids the dedup authority

Revision ID: 0017_event_partitions
Revises: 0014_failure_charges
Create Date: 2026-12-06 10:00:00

CONTRACT "Replicas, failover and archives (v3)": on PostgreSQL the raw events are
range-partitioned by month of ``occurred_at`` (declarative partitioning), so a month is a table
of its own: archived, vacuumed and, one day, dropped on its own.

A partitioned table's unique index must hold the partition key, so ``event_id`` alone can no
longer be unique on ``events``: ``event_ids`` (event_id, content_hash as bytes) becomes the authority on
which events are stored (ingest inserts there first, on conflict nothing, and stores only the
events that went in, in the same statement: ``billing.ingest.sql.postgres.INSERT_EVENTS``), and
keeps each event's content hash so that a repeated event is told a duplicate or a conflict
even after its month was archived (``billing archive``). Every lookup by id reads ``event_ids``;
``events`` keeps an index on ``event_id`` only for its rows without a call number (none once
ingest's transaction commits: ``FILL_CALL_NO``), its primary key becomes ``(seq, occurred_at)``
and ``(call_no, seq)`` stays.

Partitions: ``events_YYYY_MM`` for every month from the oldest stored event (at most
``BACK_MONTHS`` back) to ``AHEAD_MONTHS`` after the current one, and ``events_default`` for any
other ``occurred_at`` (a gateway's clock years off): never a failed insert. The service makes
the months ahead from then on (``billing.ingest.partitions``); a month made later takes its
rows out of the default partition.

The stored events are copied (one ``INSERT … SELECT``: the table is rewritten, so on a large
database run it in a maintenance window). SQLite: nothing (one file, one writer; no partitions).
"""

from collections.abc import Sequence
from datetime import UTC, datetime

from alembic import op

revision: str = "0017_event_partitions"
down_revision: str | None = "0014_failure_charges"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Months made after the current one.
AHEAD_MONTHS = 3
#: The oldest month given a partition of its own (older rows go to the default partition).
BACK_MONTHS = 36


def _month(year: int, month: int, add: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + add
    return index // 12, index % 12 + 1


def _partition(year: int, month: int) -> str:
    start_year, start_month = year, month
    end_year, end_month = _month(year, month, 1)
    return (
        f"CREATE TABLE events_{start_year:04d}_{start_month:02d} PARTITION OF events FOR VALUES "
        f"FROM ('{start_year:04d}-{start_month:02d}-01 00:00:00+00') "
        f"TO ('{end_year:04d}-{end_month:02d}-01 00:00:00+00')"
    )


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    now = datetime.now(UTC)
    oldest = bind.exec_driver_sql("SELECT min(occurred_at) FROM events").scalar()
    first = _month(now.year, now.month, -BACK_MONTHS)
    if oldest is not None:
        oldest = oldest.astimezone(UTC)
        first = max(first, (oldest.year, oldest.month))
    else:
        first = (now.year, now.month)
    last = _month(now.year, now.month, AHEAD_MONTHS)
    for statement in (
        "ALTER TABLE events RENAME TO events_unpartitioned",
        "ALTER TABLE events_unpartitioned RENAME CONSTRAINT pk_events TO pk_events_unpartitioned",
        "ALTER TABLE events_unpartitioned RENAME CONSTRAINT uq_events_event_id "
        "TO uq_events_unpartitioned_event_id",
        "ALTER INDEX ix_events_call_no_seq RENAME TO ix_events_unpartitioned_call_no_seq",
        "CREATE TABLE events (LIKE events_unpartitioned INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (occurred_at)",
        # The sequence outlives the old table.
        "ALTER SEQUENCE events_seq_seq OWNED BY events.seq",
        "ALTER TABLE events ADD CONSTRAINT pk_events PRIMARY KEY (seq, occurred_at)",
        "CREATE INDEX ix_events_call_no_seq ON events (call_no, seq)",
        # Only the events not numbered yet (within ingest's transaction: FILL_CALL_NO).
        "CREATE INDEX ix_events_unnumbered ON events (event_id) WHERE call_no IS NULL",
        "CREATE TABLE events_default PARTITION OF events DEFAULT",
    ):
        op.execute(statement)
    year, month = first
    while (year, month) <= last:
        op.execute(_partition(year, month))
        year, month = _month(year, month, 1)
    # The hash as its 32 bytes, not its 64 hex digits (a row per event: docs/SCALE.md).
    op.execute(
        "CREATE TABLE event_ids (event_id VARCHAR(128) NOT NULL, content_hash BYTEA "
        "NOT NULL, CONSTRAINT pk_event_ids PRIMARY KEY (event_id))"
    )
    op.execute("INSERT INTO events SELECT * FROM events_unpartitioned")
    op.execute(
        "INSERT INTO event_ids SELECT event_id, decode(content_hash, 'hex') "
        "FROM events_unpartitioned"
    )
    op.execute("DROP TABLE events_unpartitioned")
    op.execute("ANALYZE events")
    op.execute("ANALYZE event_ids")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for statement in (
        "ALTER TABLE events RENAME TO events_partitioned",
        "ALTER TABLE events_partitioned RENAME CONSTRAINT pk_events TO pk_events_partitioned",
        "ALTER INDEX ix_events_call_no_seq RENAME TO ix_events_partitioned_call_no_seq",
        "ALTER INDEX ix_events_unnumbered RENAME TO ix_events_partitioned_unnumbered",
        "CREATE TABLE events (LIKE events_partitioned INCLUDING DEFAULTS)",
        "ALTER SEQUENCE events_seq_seq OWNED BY events.seq",
        "INSERT INTO events SELECT * FROM events_partitioned",
        "ALTER TABLE events ADD CONSTRAINT pk_events PRIMARY KEY (seq)",
        "ALTER TABLE events ADD CONSTRAINT uq_events_event_id UNIQUE (event_id)",
        "CREATE INDEX ix_events_call_no_seq ON events (call_no, seq)",
        "DROP TABLE events_partitioned",
        "DROP TABLE event_ids",
    ):
        op.execute(statement)
