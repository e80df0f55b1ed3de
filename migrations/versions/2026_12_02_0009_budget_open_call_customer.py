"""budget_open_calls.customer_id: an open call's customer at its start, so that a customer
budget counts the calls of that customer (not those of the keys it owns now)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 00:09:00

The rows stored before it are the open calls' of key budgets; they get no customer (a step
writes it the next time it takes the call up), and a customer budget made after it reads its
calls again (``BudgetsRepository.refresh_open``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN (no batch rebuild) on both databases.
    op.add_column("budget_open_calls", sa.Column("customer_id", sa.String(length=128)))
    op.create_index(
        "ix_budget_open_calls_customer_id_started_at",
        "budget_open_calls",
        ["customer_id", "started_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_budget_open_calls_customer_id_started_at", table_name="budget_open_calls")
    with op.batch_alter_table("budget_open_calls") as batch:
        batch.drop_column("customer_id")
