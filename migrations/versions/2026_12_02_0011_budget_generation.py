"""the budgets' generation: a one-row counter every budget write bumps

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 00:11:00

A process keeps the budget versions in force in memory (``billing.budgets.cache``) and reads
this one row to know whether they changed (another process or replica may have written them).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "budget_generation",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "generation": 0}])


def downgrade() -> None:
    op.drop_table("budget_generation")
