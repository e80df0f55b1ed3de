"""open calls by owner: the pending charges of a credit balance

Revision ID: 0019_open_calls_by_owner
Revises: 0018_credits
Create Date: 2026-12-06 00:19:00

CONTRACT "Prepaid credits (v3)": ``GET /v1/credits/balance`` reports ``pending_usd``, the sum of
the owner's open calls (``billing.credits.sql.common.CoreCredits.pending``), which every
balance, credit-required authorization and credit draw reads. Without an index of its own it read
every call of the customer (or key) through the call log's indexes: about 130,000 rows for the
busiest customer at 1,000,000 calls. ``ix_calls_open_owner`` holds only the calls not settled yet,
by customer then key (a key without a customer: ``customer_id IS NULL`` and the key), so a
settled call leaves it. Its predicate is written as the query states it (SQLite matches a
partial index's terms as written). A plain ``CREATE INDEX`` on both databases.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_open_calls_by_owner"
down_revision: str | None = "0018_credits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_calls_open_owner",
        "calls",
        ["customer_id", "api_key_id"],
        postgresql_where=sa.text("settled IS false"),
        sqlite_where=sa.text("settled IS 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_calls_open_owner", table_name="calls")
