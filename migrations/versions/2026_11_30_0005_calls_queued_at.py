"""calls.queued_at: the due-call indexes no longer hold last_received_at

Ingest touches a call for every new event (``last_received_at``, ``change_seq``); with
``last_received_at`` in the due-call indexes, every touch rewrote index entries, and PostgreSQL
wrote a new row version into all eight indexes of ``calls``. ``queued_at`` takes its place in
those indexes: set when a call becomes pending and left alone by later events, equal to
``last_received_at`` once the call is reconciled (billing.storage.models.Call). A touch of a
pending call then changes no indexed column, and PostgreSQL can update it in place (HOT) given
free space on the page: ``calls`` gets fillfactor 75.

Revision ID: 6f0a2d8c4e31
Revises: 3b7e9c2d5f14
Create Date: 2026-11-30 06:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from billing.storage.types import UTCDateTime

revision: str = "6f0a2d8c4e31"
down_revision: str | None = "3b7e9c2d5f14"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_PENDING = "ix_calls_pending_last_received_at_request_id"
OLD_OPEN = "ix_calls_settled_pending_last_received_at_request_id"
NEW_PENDING = "ix_calls_pending_queued_at_request_id"
NEW_OPEN = "ix_calls_settled_pending_queued_at_request_id"


def _create(pending: str, open_: str, column: str) -> None:
    op.create_index(
        pending,
        "calls",
        ["pending", column, "request_id"],
        unique=False,
        postgresql_where=sa.text("pending"),
        sqlite_where=sa.text("pending = 1"),
    )
    op.create_index(
        open_,
        "calls",
        ["settled", "pending", column, "request_id"],
        unique=False,
        postgresql_where=sa.text("NOT settled AND NOT pending"),
        sqlite_where=sa.text("settled = 0 AND pending = 0"),
    )


def upgrade() -> None:
    # The partial indexes go first: SQLite's batch mode copies the table and recreates the
    # indexes it reflects, and their WHERE clauses are not reflected.
    op.drop_index(OLD_OPEN, table_name="calls")
    op.drop_index(OLD_PENDING, table_name="calls")
    op.add_column("calls", sa.Column("queued_at", UTCDateTime(), nullable=True))
    op.execute("UPDATE calls SET queued_at = last_received_at")
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.alter_column("queued_at", existing_type=UTCDateTime(), nullable=False)
    _create(NEW_PENDING, NEW_OPEN, "queued_at")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE calls SET (fillfactor = 75)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE calls RESET (fillfactor)")
    op.drop_index(NEW_OPEN, table_name="calls")
    op.drop_index(NEW_PENDING, table_name="calls")
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_column("queued_at")
    _create(OLD_PENDING, OLD_OPEN, "last_received_at")
