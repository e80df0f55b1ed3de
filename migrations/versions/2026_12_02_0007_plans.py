"""keys, customers and plans: key assignments, plan versions and their prices, the charge

Revision ID: 0007
Revises: 0006_console
Create Date: 2026-12-02 00:07:00

CONTRACT "Keys, customers and plans (v2)". ``key_assignments`` (a key's customer, plan and name
from ``effective_from`` on), ``plan_versions`` (a plan's markup from ``effective_from`` on) and
``plan_prices`` (a plan version's own prices, the shape of ``prices``); on ``calls`` the
customer, plan and charge; on ``ledger_entries`` the customer, plan, the plan price used (id,
rates, unit prices) or the markup, and the charge. Every new column of the big tables is
nullable and added with a plain ``ALTER TABLE ADD COLUMN`` (no batch rebuild on SQLite). Before
this revision no key had a plan, so every stored call and entry is charged its cost: the
migration fills ``charge_pusd`` in from ``cost_pusd`` (a new column's first value; no booked
figure changes).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006_console"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The rate columns of a price (``billing.pricing.rates.RATE_COLUMNS`` at this revision).
RATE_COLUMNS = (
    "input_uusd_per_mtok",
    "output_uusd_per_mtok",
    "cache_read_uusd_per_mtok",
    "cache_creation_uusd_per_mtok",
    "cache_creation_1h_uusd_per_mtok",
)


def _calls_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("plan_id", sa.String(128), nullable=True),
        sa.Column("charge_pusd", sa.BigInteger(), nullable=True),
    ]


def _entry_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("plan_id", sa.String(128), nullable=True),
        sa.Column("plan_price_id", sa.BigInteger(), nullable=True),
        *(sa.Column(f"plan_{name}", sa.BigInteger(), nullable=True) for name in RATE_COLUMNS),
        sa.Column("plan_unit_prices", sa.Text(), nullable=True),
        sa.Column("markup_pct", sa.String(32), nullable=True),
        sa.Column("charge_pusd", sa.BigInteger(), nullable=True),
    ]


ROLLUP_TABLES = ("usage_rollups", "usage_rollups_all_keys")
ROLLUP_KEY = ("basis", "api_key_id", "level", "bucket_start", "model")


def _rollup_columns() -> list[sa.Column[object]]:
    return [
        sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        for name in ("charge_whole_usd", "charge_frac_pusd", "uncharged")
    ]


def upgrade() -> None:
    op.create_table(
        "key_assignments",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("api_key_id", sa.String(128), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("customer_id", sa.String(128), nullable=True),
        sa.Column("plan_id", sa.String(128), nullable=True),
        sa.Column("name", sa.String(256), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_key_assignments"),
        sa.UniqueConstraint(
            "api_key_id", "effective_from", name="uq_key_assignments_api_key_id_effective_from"
        ),
    )
    op.create_index("ix_key_assignments_plan_id", "key_assignments", ["plan_id"])
    op.create_index("ix_key_assignments_customer_id", "key_assignments", ["customer_id"])
    op.create_table(
        "plan_versions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("plan_id", sa.String(128), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("markup_pct", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plan_versions"),
        sa.UniqueConstraint(
            "plan_id", "effective_from", name="uq_plan_versions_plan_id_effective_from"
        ),
    )
    op.create_table(
        "plan_prices",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("plan_version_id", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in RATE_COLUMNS),
        sa.Column("service_tier", sa.String(32), nullable=False),
        sa.Column("above_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("unit_prices", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["plan_version_id"],
            ["plan_versions.id"],
            name="fk_plan_prices_plan_version_id_plan_versions",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_plan_prices"),
        sa.UniqueConstraint(
            "plan_version_id",
            "model",
            "service_tier",
            "above_input_tokens",
            name="uq_plan_prices_identity",
        ),
    )
    for column in _calls_columns():
        op.add_column("calls", column)
    for column in _entry_columns():
        op.add_column("ledger_entries", column)
    op.create_index(
        "ix_calls_customer_id_started_at_request_id",
        "calls",
        ["customer_id", "started_at", "request_id"],
    )
    op.create_index(
        "ix_ledger_entries_customer_id_booked_at", "ledger_entries", ["customer_id", "booked_at"]
    )
    op.execute("UPDATE calls SET charge_pusd = cost_pusd WHERE cost_pusd IS NOT NULL")
    op.execute("UPDATE ledger_entries SET charge_pusd = cost_pusd WHERE cost_pusd IS NOT NULL")
    # The rollups: the charge beside the cost (so far the cost itself), and on usage_rollups the
    # customer in its key ('' so far). usage_rollups is rebuilt on SQLite (a new primary key).
    for table in ROLLUP_TABLES:
        for column in _rollup_columns():
            op.add_column(table, column)
        op.execute(
            f"UPDATE {table} SET charge_whole_usd = cost_whole_usd, "
            "charge_frac_pusd = cost_frac_pusd, uncharged = unpriced"
        )
    with op.batch_alter_table("usage_rollups") as batch:
        batch.add_column(
            sa.Column("customer_id", sa.String(128), server_default=sa.text("''"), nullable=False)
        )
        batch.drop_constraint("pk_usage_rollups", type_="primary")
        batch.create_primary_key("pk_usage_rollups", [*ROLLUP_KEY, "customer_id"])
    op.create_index(
        "ix_usage_rollups_basis_customer_id_level_bucket_start",
        "usage_rollups",
        ["basis", "customer_id", "level", "bucket_start"],
    )


def downgrade() -> None:
    op.drop_index("ix_usage_rollups_basis_customer_id_level_bucket_start", "usage_rollups")
    # A key's rows of several customers cannot share the old key: the rollups are emptied, to be
    # rebuilt from calls and the ledger (billing.rollups.service.rebuild) after the downgrade.
    for table in (*ROLLUP_TABLES, "usage_rollup_keyless"):
        op.execute(f"DELETE FROM {table}")
    with op.batch_alter_table("usage_rollups") as batch:
        batch.drop_constraint("pk_usage_rollups", type_="primary")
        batch.create_primary_key("pk_usage_rollups", list(ROLLUP_KEY))
        batch.drop_column("customer_id")
    for table in ROLLUP_TABLES:
        with op.batch_alter_table(table) as batch:
            for column in reversed(_rollup_columns()):
                batch.drop_column(column.name)
    op.drop_index("ix_ledger_entries_customer_id_booked_at", "ledger_entries")
    op.drop_index("ix_calls_customer_id_started_at_request_id", "calls")
    for table, columns in (("ledger_entries", _entry_columns()), ("calls", _calls_columns())):
        with op.batch_alter_table(table) as batch:
            for column in reversed(columns):
                batch.drop_column(column.name)
    op.drop_table("plan_prices")
    op.drop_table("plan_versions")
    op.drop_index("ix_key_assignments_customer_id", "key_assignments")
    op.drop_index("ix_key_assignments_plan_id", "key_assignments")
    op.drop_table("key_assignments")
