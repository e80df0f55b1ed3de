"""the reconciler's fast path: usage bodies flagged plain at ingest; customer indexes partial

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 00:11:00

``events.plain_usage``: a ``stream.usage`` body without any of the fields the fast path declines
(the v2 dimensions) and without a JSON null, as ingest now flags it once
(``billing.storage.settle_common_sql.plain_usage``), instead of six ``LIKE`` searches of every
usage body at each settlement. The stored rows are flagged here with those searches (the field
names as of this revision).

The calls' and ledger entries' plain customer indexes cover the rows with a customer only: every
query that reads them names one customer (``customer_id = ?``, which implies ``customer_id IS
NOT NULL`` on both databases), so the calls of keys without an assignment and their ledger
entries add no entry to them (on PostgreSQL each settling ``UPDATE calls`` is a new row version
that every full index of ``calls`` gets an entry for).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The ``stream.usage`` fields the fast path declined at this revision.
DECLINED = ("cache_creation_1h_input_tokens", "service_tier", "units", "other_models", "anomalies")
#: A usage body holds none of them as a key and no JSON null (ASCII case ignored, as ingest).
PLAIN = " AND ".join(
    # (the backslash: text() would take ":null" for a bind parameter)
    ("lower(body) NOT LIKE '%\\:null%'", *(f"lower(body) NOT LIKE '%\"{n}\":%'" for n in DECLINED))
)

#: (index name, table, columns)
INDEXES = (
    (
        "ix_calls_customer_id_started_at_request_id",
        "calls",
        ("customer_id", "started_at", "request_id"),
    ),
    ("ix_ledger_entries_customer_id_booked_at", "ledger_entries", ("customer_id", "booked_at")),
)


def upgrade() -> None:
    # Plain ADD COLUMN, DROP and CREATE INDEX on both databases (no batch rebuild of big tables).
    op.add_column("events", sa.Column("plain_usage", sa.Boolean()))
    op.execute(f"UPDATE events SET plain_usage = ({PLAIN}) WHERE type = 'stream.usage'")
    for name, table, columns in INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(
            name,
            table,
            list(columns),
            postgresql_where=sa.text("customer_id IS NOT NULL"),
            sqlite_where=sa.text("customer_id IS NOT NULL"),
        )


def downgrade() -> None:
    for name, table, columns in INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, list(columns))
    with op.batch_alter_table("events") as batch:
        batch.drop_column("plain_usage")
