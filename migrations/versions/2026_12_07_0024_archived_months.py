"""archive: the months archived and the calls parked while their events are away

Revision ID: 0024_archived_months
Revises: 0023_credit_dedupe_partial
Create Date: 2026-12-07 05:30:00

A late event (or a re-rating) of a call whose events were archived made the reconciler rebuild
the call from the events still stored: its key, model, tokens and cost were reversed away. The
database now records the months archived (``archived_months``, written and removed with the
events) and the calls the reconciler left as they were meanwhile (``parked_calls``), made
pending again by the restore. Months archived before this revision are not known to it: archive
them again (nothing is left to move) or restore them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024_archived_months"
down_revision: str | None = "0023_credit_dedupe_partial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "archived_months",
        sa.Column("month_start", UTC_DATETIME, nullable=False),
        sa.Column("month_end", UTC_DATETIME, nullable=False),
        sa.Column("archived_at", UTC_DATETIME, nullable=False),
        sa.Column("file", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("month_start", name="pk_archived_months"),
    )
    op.create_table(
        "parked_calls",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("parked_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_parked_calls"),
    )


def downgrade() -> None:
    op.drop_table("parked_calls")
    op.drop_table("archived_months")
