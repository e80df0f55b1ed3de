"""drift rollup: drift_rollups, ours per UTC hour and day (billing.drift.rollup), backfilled

Revision ID: 0005_drift_rollup
Revises: 0004
Create Date: 2026-12-02 00:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_drift_rollup"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A UTC instant: ``timestamptz`` on PostgreSQL, naive UTC text on SQLite (the ORM's UTCDateTime).
UTC_DATETIME = sa.DateTime(timezone=True)
PICO = 10**12
_COLUMNS = (
    "level, bucket_start, provider, model, upstream_account, service_tier, calls, requests, "
    "input_tokens, cache_read_input_tokens, cache_creation_input_tokens, output_tokens, "
    "cost_whole_usd, cost_frac_pusd, unpriced_calls"
)
_SUMMED = ", ".join(f"sum({name})" for name in _COLUMNS.split(", ")[6:])
#: The settled calls with a start and a stream.started (no "started_missing" among their
#: anomalies, a JSON list of codes) by hour (level 0), then the hours by day (level 1), as
#: billing.storage.{sqlite,postgres}.drift.REBUILD and REBUILD_DAYS sum them.
BACKFILL = {
    "sqlite": (
        f"INSERT INTO drift_rollups ({_COLUMNS}) "
        "SELECT 0, substr(started_at, 1, 13) || ':00:00.000000', coalesce(provider, ''), "
        "coalesce(model, ''), coalesce(upstream_account, ''), coalesce(service_tier, ''), "
        "count(*), sum(max(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
        "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
        f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(coalesce(cost_pusd, 0) % {PICO}), "
        "sum(cost_pusd IS NULL) FROM calls WHERE settled = 1 AND started_at IS NOT NULL "
        "AND instr(anomalies, '\"started_missing\"') = 0 GROUP BY 2, 3, 4, 5, 6",
        f"INSERT INTO drift_rollups ({_COLUMNS}) SELECT 1, "
        "substr(bucket_start, 1, 10) || ' 00:00:00.000000', provider, model, upstream_account, "
        f"service_tier, {_SUMMED} FROM drift_rollups WHERE level = 0 GROUP BY 2, 3, 4, 5, 6",
    ),
    "postgresql": (
        f"INSERT INTO drift_rollups ({_COLUMNS}) "
        "SELECT 0, date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', "
        "coalesce(provider, ''), coalesce(model, ''), coalesce(upstream_account, ''), "
        "coalesce(service_tier, ''), count(*), sum(greatest(attempts, 1)), sum(input_tokens), "
        "sum(cache_read_input_tokens), sum(cache_creation_input_tokens), "
        f"sum(output_tokens_billed), sum(coalesce(cost_pusd, 0) / {PICO}), "
        f"sum(mod(coalesce(cost_pusd, 0), {PICO})), count(*) FILTER (WHERE cost_pusd IS NULL) "
        "FROM calls WHERE settled AND started_at IS NOT NULL "
        "AND strpos(anomalies::text, '\"started_missing\"') = 0 GROUP BY 2, 3, 4, 5, 6",
        f"INSERT INTO drift_rollups ({_COLUMNS}) SELECT 1, "
        "date_trunc('day', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', provider, model, "
        f"upstream_account, service_tier, {_SUMMED} FROM drift_rollups WHERE level = 0 "
        "GROUP BY 2, 3, 4, 5, 6",
    ),
}


def _counter(name: str) -> sa.Column:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "drift_rollups",
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("upstream_account", sa.String(length=128), nullable=False),
        sa.Column("service_tier", sa.String(length=32), nullable=False),
        *(
            _counter(name)
            for name in (
                "calls",
                "requests",
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
                "output_tokens",
                "cost_whole_usd",
                "cost_frac_pusd",
                "unpriced_calls",
            )
        ),
        sa.PrimaryKeyConstraint(
            "level",
            "bucket_start",
            "provider",
            "model",
            "upstream_account",
            "service_tier",
            name="pk_drift_rollups",
        ),
    )
    for statement in BACKFILL[op.get_bind().dialect.name]:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("drift_rollups")
