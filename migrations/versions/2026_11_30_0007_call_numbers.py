"""calls.call_no and events.call_no: a call's events found by a number given in arrival order

Until this revision a call's events were found through ``events(request_id, seq)``. Gateways'
request ids are random, so every event inserted went to a random place of that index, and each
such insert dirties an index page of its own, which the commit writes out (on SQLite, WAL frames of
a whole page for an entry of ≈ 50 bytes): ≈ 15 µs of the ingest writer's ≈ 55 µs per event,
measured by dropping the index. From this revision every call has a number, ``calls.call_no``,
given when ingest first sees the call (SQLite: one more than the largest; PostgreSQL: the sequence
``calls_call_no_seq``), and every event carries its call's number; the index is
``events(call_no, seq)``: the events of the calls in flight land at its end.

Upgrade numbers the existing calls (SQLite: in rowid order, the order they were inserted;
PostgreSQL: by first arrival), copies each call's number onto its events, builds the two indexes
and drops ``events(request_id, seq)``. The columns stay nullable (adding a NOT NULL column
would rewrite the tables); ingest always sets them. Downgrade restores the old index and drops the
columns, the indexes and the sequence.

A server of an earlier revision still running beside newer ones (a rolling upgrade) writes calls
and events without numbers: the partial index ``ix_events_unnumbered`` (empty otherwise) lets the
reconciler find such events at the start of every step and number them and their calls
(``billing.ingest.service.number_unnumbered``), so they are billed.

Revision ID: 7d3e9f1a2c48
Revises: 6c2f8a4e1b37
Create Date: 2026-11-30 15:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7d3e9f1a2c48"
down_revision: str | None = "6c2f8a4e1b37"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("calls", sa.Column("call_no", sa.BigInteger(), nullable=True))
    op.add_column("events", sa.Column("call_no", sa.BigInteger(), nullable=True))
    if postgres:
        op.execute("CREATE SEQUENCE calls_call_no_seq AS bigint OWNED BY calls.call_no")
        op.execute(
            "UPDATE calls SET call_no = r.n FROM (SELECT request_id, row_number() OVER "
            "(ORDER BY first_received_at, request_id) AS n FROM calls) AS r "
            "WHERE r.request_id = calls.request_id"
        )
        op.execute(
            "SELECT setval('calls_call_no_seq', (SELECT coalesce(max(call_no), 0) + 1 FROM calls), "
            "false)"
        )
        op.execute(
            "UPDATE events SET call_no = c.call_no FROM calls AS c "
            "WHERE c.request_id = events.request_id"
        )
    else:
        op.execute("UPDATE calls SET call_no = rowid")
        op.execute(
            "UPDATE events SET call_no = "
            "(SELECT c.call_no FROM calls AS c WHERE c.request_id = events.request_id)"
        )
    op.create_index("ix_calls_call_no", "calls", ["call_no"], unique=True)
    op.create_index("ix_events_call_no_seq", "events", ["call_no", "seq"])
    op.create_index(
        "ix_events_unnumbered",
        "events",
        ["request_id"],
        postgresql_where=sa.text("call_no IS NULL"),
        sqlite_where=sa.text("call_no IS NULL"),
    )
    op.drop_index("ix_events_request_id_seq", table_name="events")


def downgrade() -> None:
    op.create_index("ix_events_request_id_seq", "events", ["request_id", "seq"])
    op.drop_index("ix_events_unnumbered", table_name="events")
    op.drop_index("ix_events_call_no_seq", table_name="events")
    op.drop_index("ix_calls_call_no", table_name="calls")
    # Both databases drop an unindexed column in place (SQLite since 3.35), without the table
    # copy of a batch operation.
    op.execute("ALTER TABLE events DROP COLUMN call_no")
    op.execute("ALTER TABLE calls DROP COLUMN call_no")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE IF EXISTS calls_call_no_seq")
