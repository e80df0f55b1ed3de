"""holds: a hold whose call settled is marked so, and leaves the live holds' indexes

Revision ID: 0025_hold_settled
Revises: 0024_archived_months
Create Date: 2026-12-07 09:15:00

A hold counts nothing once its call settled (CONTRACT "Authorizations and holds (v3)": the call's
own figure replaced it), yet it stayed among the live holds until its TTL: every balance, spend
check and authorization of its owner read it and looked its call up, to leave it out. At a
customer's 10 calls a second and the default TTL, that is thousands of rows each time (460 of
them took the balance statement from 0.6 to 1.9 ms on PostgreSQL, issue #40). The reconciliation
step that settles a call now sets its hold's ``settled_at`` (a call never stops being settled),
and the live holds' partial indexes leave those out. Holds whose call is settled already are
marked here, at their call's ``settled_at``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_hold_settled"
down_revision: str | None = "0024_archived_months"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
WAS = "released_at IS NULL"
LIVE = "released_at IS NULL AND settled_at IS NULL"
_INDEXES = (
    ("ix_budget_holds_live", ["expires_at"], ""),
    ("ix_budget_holds_live_api_key_id", ["api_key_id", "expires_at"], ""),
    (
        "ix_budget_holds_live_customer_id",
        ["customer_id", "expires_at"],
        " AND customer_id IS NOT NULL",
    ),
)
_MARK = """
UPDATE budget_holds SET settled_at = (
    SELECT calls.settled_at FROM calls WHERE calls.request_id = budget_holds.request_id
)
WHERE released_at IS NULL AND EXISTS (
    SELECT 1 FROM calls
    WHERE calls.request_id = budget_holds.request_id AND calls.settled AND calls.settled_at IS NOT NULL
)
"""


def _drop_indexes() -> None:
    for name, _, _ in _INDEXES:
        op.drop_index(name, table_name="budget_holds")


def _create_indexes(where: str) -> None:
    for name, columns, more in _INDEXES:
        op.create_index(
            name,
            "budget_holds",
            columns,
            postgresql_where=sa.text(where + more),
            sqlite_where=sa.text(where + more),
        )


def upgrade() -> None:
    op.add_column("budget_holds", sa.Column("settled_at", UTC_DATETIME, nullable=True))
    op.execute(_MARK)
    _drop_indexes()
    _create_indexes(LIVE)


def downgrade() -> None:
    # The partial indexes away first: SQLite's batch copy of the table would not keep their
    # predicates.
    _drop_indexes()
    with op.batch_alter_table("budget_holds") as batch:
        batch.drop_column("settled_at")
    _create_indexes(WAS)
