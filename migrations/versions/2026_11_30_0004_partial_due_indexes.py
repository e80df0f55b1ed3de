"""reconciler due-call indexes: partial, only the calls each due query can return

``billing.reconcile.service.due_calls`` reads pending calls, and open calls that are not pending,
each from its own index. Every reconciliation step changes ``pending`` (and ``settled``) of the
calls it settles, so neither PostgreSQL nor SQLite can leave those indexes alone on that update;
restricted to the rows their query can return (``WHERE pending``; ``WHERE NOT settled AND NOT
pending``), a settled call leaves both and adds no entry to either, and ingest's new (pending)
calls add none to the second. Same columns and names, so the queries and plans stay as they were.

Revision ID: 3b7e9c2d5f14
Revises: 8d2f4b6a1c3e
Create Date: 2026-11-30 04:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3b7e9c2d5f14"
down_revision: str | None = "8d2f4b6a1c3e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = "ix_calls_pending_last_received_at_request_id"
OPEN = "ix_calls_settled_pending_last_received_at_request_id"


def upgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_index(PENDING)
        batch_op.drop_index(OPEN)
        batch_op.create_index(
            PENDING,
            ["pending", "last_received_at", "request_id"],
            unique=False,
            postgresql_where=sa.text("pending"),
            sqlite_where=sa.text("pending = 1"),
        )
        batch_op.create_index(
            OPEN,
            ["settled", "pending", "last_received_at", "request_id"],
            unique=False,
            postgresql_where=sa.text("NOT settled AND NOT pending"),
            sqlite_where=sa.text("settled = 0 AND pending = 0"),
        )


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_index(OPEN)
        batch_op.drop_index(PENDING)
        batch_op.create_index(PENDING, ["pending", "last_received_at", "request_id"], unique=False)
        batch_op.create_index(
            OPEN, ["settled", "pending", "last_received_at", "request_id"], unique=False
        )
