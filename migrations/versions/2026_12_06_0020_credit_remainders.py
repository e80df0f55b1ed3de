"""credit remainders: each grant's remainder and each owner's overdraft, kept by every booking

Revision ID: 0020_credit_remainders
Revises: 0019_open_calls_by_owner
Create Date: 2026-12-06 00:20:00

CONTRACT "Prepaid credits (v3)": the balance, the ``credit_required`` check at authorization and
each reconciliation step's draws read what is left of an owner's grants. Summed from
``credit_entries`` that read every draw of every grant of the owner (about 10,000 a grant at
1,000,000 calls: 38 ms a balance on SQLite, 67 ms on PostgreSQL). ``credit_grants.remaining_pusd``
(the grant's entries: its grant less its draws, reversals, expiries and voids) and
``credit_overdrafts`` (per owner: its overdrafts less their reversals) keep those sums, updated
in the transaction that books each entry (``billing.credits.sql.common.CoreCredits.add``): the
entries, only ever added, stay the proof; these are their totals. Both are filled here from the
entries already booked.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_credit_remainders"
down_revision: str | None = "0019_open_calls_by_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "credit_grants",
        sa.Column("remaining_pusd", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        """UPDATE credit_grants SET remaining_pusd = coalesce((
            SELECT sum(CASE WHEN e.kind = 'grant' THEN e.amount_pusd ELSE -e.amount_pusd END)
            FROM credit_entries e WHERE e.grant_id = credit_grants.grant_id), 0)"""
    )
    op.create_table(
        "credit_overdrafts",
        sa.Column("owner", sa.String(140), nullable=False),
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("api_key_id", sa.String(128), nullable=True),
        sa.Column("overdraft_pusd", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name="pk_credit_overdrafts"),
    )
    # An entry of a customer names no key (``billing.credits.rows.Owner.of``).
    op.execute(
        """INSERT INTO credit_overdrafts (owner, customer_id, api_key_id, overdraft_pusd)
        SELECT CASE WHEN customer_id IS NOT NULL THEN 'customer:' || customer_id
                ELSE 'key:' || api_key_id END,
            customer_id, api_key_id, sum(amount_pusd)
        FROM credit_entries WHERE grant_id IS NULL
        GROUP BY customer_id, api_key_id"""
    )


def downgrade() -> None:
    op.drop_table("credit_overdrafts")
    op.drop_column("credit_grants", "remaining_pusd")
