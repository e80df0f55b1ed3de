"""credit entries: the dedupe key unique where set only

Revision ID: 0023_credit_dedupe_partial
Revises: 0022_credit_entries_indexes
Create Date: 2026-12-07 00:23:00

Only a grant's expiry or void has a ``dedupe_key`` (one of each, booked once under
concurrency); the draws, overdrafts and reversals a reconciliation step books by the thousand
have none (issue #40: the reconcile throughput with credits in force). The unique constraint
indexed every row all the same, null keys included: about 5,000 instructions a draw on SQLite,
where each insert also checked it. It becomes a unique index of the rows with a key
(``dedupe_key IS NOT NULL``); the lookups by key (``dedupe_key = …``, ``IN (…)``: whether a grant
was voided, which expiries are due) imply that condition, and both databases read them by it.
``INSERT … ON CONFLICT DO NOTHING`` without a target (``add_once``) names any unique index.

SQLite cannot drop a constraint: the table is copied (``batch_alter_table``) with its indexes,
the partial ones (0022) dropped before and made again after, so that the copy keeps their
``WHERE``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_credit_dedupe_partial"
down_revision: str | None = "0022_credit_entries_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHERE = "dedupe_key IS NOT NULL"
#: 0022's owner indexes in booking order (name, column, where).
_OWNER_INDEXES = (
    ("ix_credit_entries_customer_booked", "customer_id", "customer_id IS NOT NULL"),
    ("ix_credit_entries_key_booked", "api_key_id", "customer_id IS NULL"),
)


def _drop_owner_indexes() -> None:
    for name, _, _ in _OWNER_INDEXES:
        op.drop_index(name, table_name="credit_entries")


def _create_owner_indexes() -> None:
    for name, column, where in _OWNER_INDEXES:
        op.create_index(
            name,
            "credit_entries",
            [column, "booked_at", "entry_id"],
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        _drop_owner_indexes()
    with op.batch_alter_table("credit_entries") as batch:
        batch.drop_constraint("uq_credit_entries_dedupe_key", type_="unique")
    if sqlite:
        _create_owner_indexes()
    op.create_index(
        "uq_credit_entries_dedupe_key",
        "credit_entries",
        ["dedupe_key"],
        unique=True,
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.drop_index("uq_credit_entries_dedupe_key", table_name="credit_entries")
    if sqlite:
        _drop_owner_indexes()
    with op.batch_alter_table("credit_entries") as batch:
        batch.create_unique_constraint("uq_credit_entries_dedupe_key", ["dedupe_key"])
    if sqlite:
        _create_owner_indexes()
