"""usage dimensions v2: one-hour cache writes, service tiers, units, other models, long context

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 00:02:00

CONTRACT "Usage dimensions (v2)". The token bucket ``cache_creation_1h_input_tokens`` on every
table with token columns; its rate ``cache_creation_1h_uusd_per_mtok`` on prices (the prices
stored before this revision bill one-hour cache writes at their cache creation rate, as a price
posted without it does) and on ledger entries; a price's served tier ('' for none), its
long-context threshold (0 for the price itself) and unit prices, identified by (model, tier,
effective_from, threshold); the call's served tier, units and other models; a ledger entry's
units and the unit prices used.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables with token columns.
TOKEN_TABLES = (
    "calls",
    "call_attempts",
    "ledger_entries",
    "usage_rollups",
    "usage_rollups_all_keys",
)
BUCKET = "cache_creation_1h_input_tokens"
RATE = "cache_creation_1h_uusd_per_mtok"


def upgrade() -> None:
    for table in TOKEN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column(BUCKET, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
            )
    with op.batch_alter_table("prices") as batch:
        batch.add_column(sa.Column(RATE, sa.BigInteger(), server_default="0", nullable=False))
        batch.add_column(
            sa.Column("service_tier", sa.String(32), server_default=sa.text("''"), nullable=False)
        )
        batch.add_column(
            sa.Column(
                "above_input_tokens", sa.BigInteger(), server_default=sa.text("0"), nullable=False
            )
        )
        batch.add_column(sa.Column("unit_prices", sa.Text(), nullable=True))
        batch.drop_constraint("uq_prices_model_effective_from", type_="unique")
        batch.create_unique_constraint(
            "uq_prices_model_service_tier_effective_from_above_input_tokens",
            ["model", "service_tier", "effective_from", "above_input_tokens"],
        )
    op.execute(f"UPDATE prices SET {RATE} = cache_creation_uusd_per_mtok")
    with op.batch_alter_table("prices") as batch:
        batch.alter_column(RATE, server_default=None)
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("service_tier", sa.String(32), nullable=True))
        batch.add_column(sa.Column("units", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("other_models", sa.JSON(), nullable=True))
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column(RATE, sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("units", sa.Text(), nullable=True))
        batch.add_column(sa.Column("unit_prices", sa.Text(), nullable=True))
    # The calls and entries with units, by time (GET /v1/usage sums their units).
    for table, column in (("calls", "started_at"), ("ledger_entries", "booked_at")):
        op.create_index(
            f"ix_{table}_{column}",
            table,
            [column],
            postgresql_where=sa.text("units IS NOT NULL"),
            sqlite_where=sa.text("units IS NOT NULL"),
        )


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_booked_at", "ledger_entries")
    op.drop_index("ix_calls_started_at", "calls")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("unit_prices")
        batch.drop_column("units")
        batch.drop_column(RATE)
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("other_models")
        batch.drop_column("units")
        batch.drop_column("service_tier")
    with op.batch_alter_table("prices") as batch:
        batch.drop_constraint(
            "uq_prices_model_service_tier_effective_from_above_input_tokens", type_="unique"
        )
        batch.create_unique_constraint(
            "uq_prices_model_effective_from", ["model", "effective_from"]
        )
        batch.drop_column("unit_prices")
        batch.drop_column("above_input_tokens")
        batch.drop_column("service_tier")
        batch.drop_column(RATE)
    for table in TOKEN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column(BUCKET)
