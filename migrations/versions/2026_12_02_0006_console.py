"""the calls and ledger entries with units, by key (and calls by model), for GET /v1/usage

Revision ID: 0006_console
Revises: 0005_drift_rollup
Create Date: 2026-12-02 00:06:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_console"
down_revision: str | None = "0005_drift_rollup"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The partial indexes added: (table, columns), each over the rows with units only.
INDEXES = (
    ("calls", ("api_key_id", "started_at")),
    ("calls", ("model", "started_at")),
    ("ledger_entries", ("api_key_id", "booked_at")),
)


def _name(table: str, columns: Sequence[str]) -> str:
    return f"ix_{table}_{'_'.join(columns)}"


def upgrade() -> None:
    # Plain CREATE INDEX on both databases (no batch rebuild of calls: on SQLite that would drop
    # 0004's expression index ix_calls_drift_day).
    for table, columns in INDEXES:
        op.create_index(
            _name(table, columns),
            table,
            list(columns),
            postgresql_where=sa.text("units IS NOT NULL"),
            sqlite_where=sa.text("units IS NOT NULL"),
        )


def downgrade() -> None:
    for table, columns in reversed(INDEXES):
        op.drop_index(_name(table, columns), table)
