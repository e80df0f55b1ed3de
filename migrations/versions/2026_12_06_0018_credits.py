"""prepaid credits: customers, credit grants and credit entries

Revision ID: 0018_credits
Revises: 0017_event_partitions
Create Date: 2026-12-06 00:18:00

CONTRACT "Prepaid credits (v3)". ``customers`` (a customer's name, ``credit_required`` and
low-balance threshold), ``credit_grants`` (prepaid credit of a customer or of a key without a
customer; never updated) and ``credit_entries`` (grants, draws, reversals, expiries, voids and
overdrafts, only ever added). New tables only: nothing stored changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_credits"
down_revision: str | None = "0017_event_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "customers",
        sa.Column("customer_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=True),
        sa.Column("credit_required", sa.Boolean(), nullable=False),
        sa.Column("low_balance_pusd", sa.BigInteger(), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("customer_id", name="pk_customers"),
    )
    op.create_table(
        "credit_grants",
        sa.Column("grant_id", sa.String(128), nullable=False),
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("api_key_id", sa.String(128), nullable=True),
        sa.Column("amount_pusd", sa.BigInteger(), nullable=False),
        sa.Column("effective_at", UTC_DATETIME, nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("note", sa.String(1000), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("grant_id", name="pk_credit_grants"),
    )
    for column in ("customer_id", "api_key_id", "expires_at"):
        op.create_index(f"ix_credit_grants_{column}", "credit_grants", [column])
    op.create_table(
        "credit_entries",
        sa.Column("entry_id", BIG_ID, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("booked_at", UTC_DATETIME, nullable=False),
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("api_key_id", sa.String(128), nullable=True),
        sa.Column("grant_id", sa.String(128), nullable=True),
        sa.Column("amount_pusd", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("ledger_seq", sa.Integer(), nullable=True),
        sa.Column("dedupe_key", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("entry_id", name="pk_credit_entries"),
        sa.UniqueConstraint("dedupe_key", name="uq_credit_entries_dedupe_key"),
    )
    op.create_index(
        "ix_credit_entries_booked_at_entry_id", "credit_entries", ["booked_at", "entry_id"]
    )
    op.create_index("ix_credit_entries_grant_id", "credit_entries", ["grant_id"])
    op.create_index("ix_credit_entries_request_id", "credit_entries", ["request_id"])
    op.create_index(
        "ix_credit_entries_customer_id_api_key_id",
        "credit_entries",
        ["customer_id", "api_key_id"],
    )


def downgrade() -> None:
    op.drop_table("credit_entries")
    op.drop_table("credit_grants")
    op.drop_table("customers")
