"""credit entries: drop the index by grant, which no statement reads

Revision ID: 0022_credit_entries_grant_index
Revises: 0020_credit_remainders
Create Date: 2026-12-06 00:22:00

A reconciliation step books a ``credit_entries`` row for every call it draws (issue #40: the
reconcile throughput with credits in force). Since migration 0020 a grant's remainder is kept on
``credit_grants.remaining_pusd``: no statement looks entries up by ``grant_id`` any more (the
credits export's remainders group the entries of a time range, read by ``booked_at``), yet every
draw paid an insert into ``ix_credit_entries_grant_id`` (about 1.6 µs of CPU a draw on SQLite).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022_credit_entries_grant_index"
down_revision: str | None = "0021_rollups_by_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_credit_entries_grant_id", table_name="credit_entries")


def downgrade() -> None:
    op.create_index("ix_credit_entries_grant_id", "credit_entries", ["grant_id"])
