"""credit entries: a draw's call found by the call's number, not its request_id

Revision ID: 0026_credit_entries_call_no
Revises: 0025_hold_settled
Create Date: 2026-12-07 11:30:00

A redraw reads what a call drew (its draws, reversals and overdrafts), so the entries were
indexed by ``request_id``: a step's thousands of draws each landed anywhere in that index, 1.6 µs
of a draw's 4 on SQLite (issue #40), and every page they touched was written again at the commit.
Entries of a call now carry its ``calls.call_no`` (given in arrival order: a step's draws land at
the index's end) and are indexed by it instead; the entries booked already take their call's.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026_credit_entries_call_no"
down_revision: str | None = "0025_hold_settled"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NUMBER = """
UPDATE credit_entries SET call_no = (
    SELECT calls.call_no FROM calls WHERE calls.request_id = credit_entries.request_id
)
WHERE request_id IS NOT NULL
"""


def upgrade() -> None:
    op.add_column("credit_entries", sa.Column("call_no", sa.BigInteger(), nullable=True))
    op.execute(_NUMBER)
    op.drop_index("ix_credit_entries_request_id", table_name="credit_entries")
    op.create_index("ix_credit_entries_call_no", "credit_entries", ["call_no"])


def downgrade() -> None:
    op.drop_index("ix_credit_entries_call_no", table_name="credit_entries")
    op.create_index("ix_credit_entries_request_id", "credit_entries", ["request_id"])
    # ALTER TABLE … DROP COLUMN on both (SQLite since 3.35): a batch copy of the table would
    # lose its partial indexes' predicates.
    op.execute("ALTER TABLE credit_entries DROP COLUMN call_no")
