"""credit entries: no index by grant; the owner's index in booking order

Revision ID: 0022_credit_entries_indexes
Revises: 0021_rollups_by_key
Create Date: 2026-12-06 00:22:00

A reconciliation step books a ``credit_entries`` row for every call it draws (issue #40: the
reconcile throughput with credits in force). Since migration 0020 a grant's remainder is kept on
``credit_grants.remaining_pusd``: no statement looks entries up by ``grant_id`` any more (the
credits export's remainders group the entries of a time range, read by ``booked_at``), yet every
draw paid an insert into ``ix_credit_entries_grant_id`` (about 1.6 µs of CPU a draw on SQLite).

The owner's index becomes two partial ones in booking order, a customer's entries
(``customer_id, booked_at, entry_id`` where ``customer_id`` is set) and a key's own (``api_key_id,
booked_at, entry_id`` where it is not): an owner's latest entries (the console's Credits page of
a customer, ``billing credits list``) are then an index's last rows, not a sort of every entry the
owner has (109,509 draws for the busiest customer of the 1,000,000-call bench seed: 112 ms on
SQLite), and each entry is still in one owner index.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_credit_entries_indexes"
down_revision: str | None = "0021_rollups_by_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OWNER = ["customer_id", "api_key_id"]


def upgrade() -> None:
    op.drop_index("ix_credit_entries_grant_id", table_name="credit_entries")
    op.drop_index("ix_credit_entries_customer_id_api_key_id", table_name="credit_entries")
    for name, column, where in (
        ("ix_credit_entries_customer_booked", "customer_id", "customer_id IS NOT NULL"),
        ("ix_credit_entries_key_booked", "api_key_id", "customer_id IS NULL"),
    ):
        op.create_index(
            name,
            "credit_entries",
            [column, "booked_at", "entry_id"],
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )


def downgrade() -> None:
    op.drop_index("ix_credit_entries_key_booked", table_name="credit_entries")
    op.drop_index("ix_credit_entries_customer_booked", table_name="credit_entries")
    op.create_index("ix_credit_entries_customer_id_api_key_id", "credit_entries", _OWNER)
    op.create_index("ix_credit_entries_grant_id", "credit_entries", ["grant_id"])
