"""reconciler due-call indexes: one ordered range per due query

``billing.reconcile.service.due_calls`` asks for pending calls, and for open calls that are not
pending and quiet since a cutoff, each oldest first (``last_received_at, request_id``). The old
indexes ``(pending, last_received_at)`` and ``(settled, last_received_at)`` left a sort (or a scan
over every pending call) at every step; these serve each query as one range read in order.

Revision ID: 8d2f4b6a1c3e
Revises: 5c1e0f3a9b27
Create Date: 2026-11-30 03:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "8d2f4b6a1c3e"
down_revision: str | None = "5c1e0f3a9b27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calls_pending_last_received_at"))
        batch_op.drop_index(batch_op.f("ix_calls_settled_last_received_at"))
        batch_op.create_index(
            batch_op.f("ix_calls_pending_last_received_at_request_id"),
            ["pending", "last_received_at", "request_id"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_calls_settled_pending_last_received_at_request_id"),
            ["settled", "pending", "last_received_at", "request_id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calls_settled_pending_last_received_at_request_id"))
        batch_op.drop_index(batch_op.f("ix_calls_pending_last_received_at_request_id"))
        batch_op.create_index(
            batch_op.f("ix_calls_settled_last_received_at"),
            ["settled", "last_received_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_calls_pending_last_received_at"),
            ["pending", "last_received_at"],
            unique=False,
        )
