"""credit overdrafts: the kept sum split into whole dollars and picodollars

Revision ID: 0027_credit_overdraft_whole
Revises: 0026_credit_entries_call_no
Create Date: 2026-12-07 12:00:00

An owner's overdraft (``credit_overdrafts.overdraft_pusd``) was kept as one 64-bit sum of
picodollars: past 2**63 (9.2 million USD of overdrafts) PostgreSQL refused the step that booked
it (its call never settled) and SQLite turned the sum into a binary float. The sum is now
``overdraft_whole_usd * 10**12 + overdraft_pusd``, ``overdraft_pusd`` below 10**12, as the usage
rollups keep their costs; the rows kept already are split so.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_credit_overdraft_whole"
down_revision: str | None = "0026_credit_entries_call_no"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Floor division and a remainder in [0, 10**12) on both databases, whose integer division
# truncates: the remainder made non-negative first, the rest then divides exactly.
_SPLIT = """
UPDATE credit_overdrafts SET
    overdraft_whole_usd = (overdraft_pusd
        - ((overdraft_pusd % 1000000000000) + 1000000000000) % 1000000000000) / 1000000000000,
    overdraft_pusd = ((overdraft_pusd % 1000000000000) + 1000000000000) % 1000000000000
"""

_JOIN = """
UPDATE credit_overdrafts
SET overdraft_pusd = overdraft_whole_usd * 1000000000000 + overdraft_pusd
"""


def upgrade() -> None:
    op.add_column(
        "credit_overdrafts",
        sa.Column(
            "overdraft_whole_usd", sa.BigInteger(), server_default=sa.text("0"), nullable=False
        ),
    )
    op.execute(_SPLIT)


def downgrade() -> None:
    # Past 2**63 picodollars the one column cannot hold an overdraft: PostgreSQL refuses it.
    op.execute(_JOIN)
    op.execute("ALTER TABLE credit_overdrafts DROP COLUMN overdraft_whole_usd")
