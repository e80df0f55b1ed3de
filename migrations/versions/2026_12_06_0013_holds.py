"""authorizations and holds; budgets by tag, over every call, by model, over a rolling window

Revision ID: 0013_holds
Revises: 0012
Create Date: 2026-12-06 00:13:00

CONTRACT "Authorizations and holds (v3)": ``budget_holds`` keeps each granted authorization
(its hold, its first answer, its expiry and release), so that a hold survives a restart; its
partial indexes read the holds not released by expiry (all of them, a key's, a customer's).
``budgets`` gains the v3 options: ``tag`` (a tag scope; a budget with neither a key, a customer
nor a tag counts every call), ``model`` (a name or a prefix ending in ``*``), ``window_s`` (a
rolling period's window) and ``unpriced`` (``allow`` | ``deny``; null for the budgets stored
before: ``allow``). ``ix_calls_unstepped``: the calls no reconciliation step has read yet
(``attempts = 0``), which the budgets count from their ingest.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_holds"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)
LIVE = "released_at IS NULL"


def upgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("tag", sa.String(64), nullable=True))
        batch.add_column(sa.Column("model", sa.String(256), nullable=True))
        batch.add_column(sa.Column("window_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("unpriced", sa.String(8), nullable=True))
    op.create_table(
        "budget_holds",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("api_key_id", sa.String(128), nullable=False),
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("hold_pusd", sa.BigInteger(), nullable=False),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
        sa.Column("released_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("request_id", name="pk_budget_holds"),
    )
    for name, columns, where in (
        ("ix_budget_holds_live", ["expires_at"], LIVE),
        ("ix_budget_holds_live_api_key_id", ["api_key_id", "expires_at"], LIVE),
        (
            "ix_budget_holds_live_customer_id",
            ["customer_id", "expires_at"],
            f"{LIVE} AND customer_id IS NOT NULL",
        ),
    ):
        op.create_index(
            name,
            "budget_holds",
            columns,
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )

    op.create_index(
        "ix_calls_unstepped",
        "calls",
        ["api_key_id", "started_at"],
        postgresql_where=sa.text("attempts = 0"),
        sqlite_where=sa.text("attempts = 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_calls_unstepped", table_name="calls")
    op.drop_table("budget_holds")
    with op.batch_alter_table("budgets") as batch:
        for column in ("unpriced", "window_s", "model", "tag"):
            batch.drop_column(column)
