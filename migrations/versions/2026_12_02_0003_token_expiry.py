"""api tokens that expire, and when each was last used

Revision ID: 0003
Revises: 0001
Create Date: 2026-12-02 00:03:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Both nullable: the tokens made before this revision never expire and were not seen since.
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires_at", UTC_DATETIME, nullable=True))
        batch.add_column(sa.Column("last_used_at", UTC_DATETIME, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("last_used_at")
        batch.drop_column("expires_at")
