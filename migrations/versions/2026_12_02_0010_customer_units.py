"""the calls and ledger entries with units, by customer, for GET /v1/usage?customer_id=

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 00:10:00

Without them SQLite reads a customer's units through the customer's plain index, every call of
the period (as 0006 found for a key's).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (index name, table, columns), each over the rows with units only.
INDEXES = (
    ("ix_calls_units_customer_id_started_at", "calls", ("customer_id", "started_at")),
    (
        "ix_ledger_entries_units_customer_id_booked_at",
        "ledger_entries",
        ("customer_id", "booked_at"),
    ),
)


def upgrade() -> None:
    # Plain CREATE INDEX on both databases (no batch rebuild of the big tables).
    for name, table, columns in INDEXES:
        op.create_index(
            name,
            table,
            list(columns),
            postgresql_where=sa.text("units IS NOT NULL"),
            sqlite_where=sa.text("units IS NOT NULL"),
        )


def downgrade() -> None:
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
