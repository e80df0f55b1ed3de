"""provider reports and drift: calls.provider, calls.upstream_account, provider report tables

Revision ID: 0004
Revises: 0001
Create Date: 2026-12-02 00:04:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)
#: An auto-numbered key: SQLite only makes an INTEGER PRIMARY KEY auto-increment.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # Nullable, no default: calls stored before this revision have no provider or upstream
    # account (the drift then compares them under none).
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("provider", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("upstream_account", sa.String(length=128), nullable=True))

    op.create_table(
        "provider_report_versions",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("bucket_end", UTC_DATETIME, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("imported_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_provider_report_versions"),
        sa.UniqueConstraint(
            "provider",
            "kind",
            "bucket_start",
            "bucket_end",
            "version",
            name="uq_provider_report_versions_bucket_version",
        ),
    )
    op.create_index(
        "ix_provider_report_versions_bucket_start_provider_kind",
        "provider_report_versions",
        ["bucket_start", "provider", "kind"],
    )
    op.create_table(
        "provider_report_lines",
        sa.Column("version_id", sa.BigInteger(), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column("upstream_account", sa.String(length=128), nullable=True),
        sa.Column("service_tier", sa.String(length=32), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cache_read_input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cache_creation_input_tokens", sa.BigInteger(), nullable=True),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cost_usd", sa.String(length=64), nullable=True),
        sa.Column("result", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["provider_report_versions.id"],
            name="fk_provider_report_lines_version_id_provider_report_versions",
        ),
        sa.PrimaryKeyConstraint("version_id", "line_no", name="pk_provider_report_lines"),
    )


def downgrade() -> None:
    op.drop_table("provider_report_lines")
    op.drop_index(
        "ix_provider_report_versions_bucket_start_provider_kind", "provider_report_versions"
    )
    op.drop_table("provider_report_versions")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("upstream_account")
        batch.drop_column("provider")
