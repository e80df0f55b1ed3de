"""v3: counters, provider-reported cost and inference geo; the charge policy for failed calls

Revision ID: 0014_failure_charges
Revises: 0013_holds
Create Date: 2026-12-06 00:14:00

CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)" and "Charge policy
for failed calls (v3)":

- ``calls``: ``counters`` (name → count, never priced), ``provider_cost_pusd`` (the provider's
  own cost), ``inference_geo`` and ``leakage_pusd`` (the cost the plan's policy left uncharged;
  0 for the calls stored before, whose cost is known);
- ``ledger_entries``: ``provider_cost_pusd``, ``failure_charge`` (the policy a line was charged
  under; null: ``bill``) and ``leakage_pusd`` (0 for the entries stored before, with a cost);
- ``prices`` and ``plan_prices``: ``inference_geo`` ('' for none) in their identity;
- ``plan_versions``: ``failure_charges`` (JSON text; null: ``bill`` for every category);
- ``usage_rollups`` and ``usage_rollups_all_keys``: ``leakage_whole_usd``, ``leakage_frac_pusd``
  (0: nothing was left uncharged before).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_failure_charges"
down_revision: str | None = "0013_holds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLLUPS = ("usage_rollups", "usage_rollups_all_keys")
_LEAKAGE = ("leakage_whole_usd", "leakage_frac_pusd")
_PRICE_IDENTITY = ["model", "service_tier", "effective_from", "above_input_tokens"]
_PLAN_PRICE_IDENTITY = ["plan_version_id", "model", "service_tier", "above_input_tokens"]


def _geo() -> sa.Column[str]:
    return sa.Column("inference_geo", sa.String(32), server_default=sa.text("''"), nullable=False)


def upgrade() -> None:
    op.add_column("calls", sa.Column("counters", sa.JSON(), nullable=True))
    op.add_column("calls", sa.Column("provider_cost_pusd", sa.BigInteger(), nullable=True))
    op.add_column("calls", sa.Column("inference_geo", sa.String(32), nullable=True))
    op.add_column("calls", sa.Column("leakage_pusd", sa.BigInteger(), nullable=True))
    op.add_column("ledger_entries", sa.Column("provider_cost_pusd", sa.BigInteger(), nullable=True))
    op.add_column("ledger_entries", sa.Column("failure_charge", sa.String(16), nullable=True))
    op.add_column("ledger_entries", sa.Column("leakage_pusd", sa.BigInteger(), nullable=True))
    op.execute("UPDATE calls SET leakage_pusd = 0 WHERE cost_pusd IS NOT NULL")
    op.execute("UPDATE ledger_entries SET leakage_pusd = 0 WHERE cost_pusd IS NOT NULL")
    op.add_column("plan_versions", sa.Column("failure_charges", sa.Text(), nullable=True))
    for table in _ROLLUPS:
        for column in _LEAKAGE:
            op.add_column(
                table,
                sa.Column(column, sa.BigInteger(), server_default=sa.text("0"), nullable=False),
            )
    with op.batch_alter_table("prices") as batch:
        batch.add_column(_geo())
        batch.drop_constraint(
            "uq_prices_model_service_tier_effective_from_above_input_tokens", type_="unique"
        )
        batch.create_unique_constraint(
            "uq_prices_identity",
            ["model", "service_tier", "inference_geo", "effective_from", "above_input_tokens"],
        )
    with op.batch_alter_table("plan_prices") as batch:
        batch.add_column(_geo())
        batch.drop_constraint("uq_plan_prices_identity", type_="unique")
        batch.create_unique_constraint(
            "uq_plan_prices_identity",
            ["plan_version_id", "model", "service_tier", "inference_geo", "above_input_tokens"],
        )


def downgrade() -> None:
    with op.batch_alter_table("plan_prices") as batch:
        batch.drop_constraint("uq_plan_prices_identity", type_="unique")
        batch.create_unique_constraint("uq_plan_prices_identity", _PLAN_PRICE_IDENTITY)
        batch.drop_column("inference_geo")
    with op.batch_alter_table("prices") as batch:
        batch.drop_constraint("uq_prices_identity", type_="unique")
        batch.create_unique_constraint(
            "uq_prices_model_service_tier_effective_from_above_input_tokens", _PRICE_IDENTITY
        )
        batch.drop_column("inference_geo")
    for table in _ROLLUPS:
        for column in _LEAKAGE:
            op.drop_column(table, column)
    op.drop_column("plan_versions", "failure_charges")
    for column in ("leakage_pusd", "failure_charge", "provider_cost_pusd"):
        op.drop_column("ledger_entries", column)
    for column in ("leakage_pusd", "inference_geo", "provider_cost_pusd", "counters"):
        op.drop_column("calls", column)
