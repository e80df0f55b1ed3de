"""events: a stream.tokens event's counters as columns, for the reconciler's fold

``billing.reconcile.service.load_events`` reads a call's progress records (``stream.tokens``,
most of its events) only for the largest of each counter and the earliest and latest
``occurred_at`` per attempt. With the counters in columns the database folds them
(``GROUP BY request_id, attempt``) and the reconciler receives one row per attempt instead of
parsing every body. Ingest fills them in from the validated event; rows stored before this
migration keep nulls and are read from their bodies. Nullable columns without a default: no
table rewrite on either database.

Revision ID: 5a1c7e3d9b20
Revises: 3b7e9c2d5f14
Create Date: 2026-11-30 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5a1c7e3d9b20"
down_revision: str | None = "3b7e9c2d5f14"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("events", sa.Column("output_tokens_delivered", sa.BigInteger(), nullable=True))
    op.add_column("events", sa.Column("output_tokens_generated", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("output_tokens_generated")
        batch_op.drop_column("output_tokens_delivered")
