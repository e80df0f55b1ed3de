"""rollups by key: usage per key and customer without the model, settled calls by status

Revision ID: 0021_rollups_by_key
Revises: 0020_credit_remainders
Create Date: 2026-12-06 00:21:00

The console's Overview and Customers pages (CONTRACT "Observability and standard exports (v3)")
read every day-level row of ``usage_rollups`` in their range (key × model × customer × day) and
the Overview counted the calls of the range by status from ``calls``: 0.5–1 s at 1,000,000
calls. ``usage_rollups_by_key`` holds ``usage_rollups`` summed over every model (per basis, key,
level, UTC bucket, customer), what a query that neither filters nor groups by model reads,
``usage_rollups_by_customer`` the same over every key (a query about customers only), and
``call_status_rollups`` the settled calls per level, UTC bucket of their start and status. Both
are kept by the reconciler with the other rollups (``billing.rollups.service.Deltas``); here they
are filled from what is stored, set-based: the first from ``usage_rollups`` (the cost's carry
moved), the second from the first, the third from ``calls`` per quarter hour, then the quarters into the coarser levels, as
``billing rollups rebuild`` does.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_rollups_by_key"
down_revision: str | None = "0020_credit_remainders"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime(timezone=True)
#: The summed columns of a usage rollup row at this revision.
SUMMED = (
    "members",
    "calls",
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "output_tokens_billed",
    "output_tokens_delivered",
    "output_tokens_undelivered",
    "reasoning_tokens",
    "cost_whole_usd",
    "cost_frac_pusd",
    "unpriced",
    "charge_whole_usd",
    "charge_frac_pusd",
    "uncharged",
    "leakage_whole_usd",
    "leakage_frac_pusd",
)
MONEY = ("cost", "charge", "leakage")
PICO = 10**12
#: The rollup levels: 15 minutes, hour, day, month.
QUARTER, HOUR, DAY, MONTH = 0, 1, 2, 3


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def _floor(postgres: bool, level: int, column: str) -> str:
    """The start of the UTC bucket of ``level`` holding the instant ``column``
    (``billing.rollups.sql``'s ``floor_sql``): PostgreSQL's ``date_bin``/``date_trunc``, or
    SQLite's stored text cut and completed with zeros."""
    if postgres:
        if level == QUARTER:
            return (
                f"date_bin(interval '15 minutes', {column}, timestamptz '2000-01-01 00:00:00+00')"
            )
        unit = {HOUR: "hour", DAY: "day", MONTH: "month"}[level]
        return f"date_trunc('{unit}', {column}, 'UTC')"
    text = f"CAST({column} AS VARCHAR)"
    if level == QUARTER:
        minute = f"substr({text}, 15, 2)"
        return (
            f"substr({text}, 1, 14) || CASE WHEN {minute} < '15' THEN '00' "
            f"WHEN {minute} < '30' THEN '15' WHEN {minute} < '45' THEN '30' ELSE '45' END "
            "|| ':00.000000'"
        )
    if level == HOUR:
        return f"substr({text}, 1, 13) || ':00:00.000000'"
    if level == DAY:
        return f"substr({text}, 1, 10) || ' 00:00:00.000000'"
    return f"substr({text}, 1, 7) || '-01 00:00:00.000000'"


def _run(statement: str) -> None:
    """Run ``statement`` as written: its colons are not bound parameters."""
    op.execute(sa.text(statement.replace(":", "\\:")))


def upgrade() -> None:
    key = ("basis", "level", "bucket_start", "api_key_id", "customer_id")
    op.create_table(
        "usage_rollups_by_key",
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        *(_counter(name) for name in SUMMED),
        sa.PrimaryKeyConstraint(*key, name="pk_usage_rollups_by_key"),
        # SQLite: the table is its key's b-tree, a period's rows one range of it.
        sqlite_with_rowid=False,
    )
    op.create_table(
        "usage_rollups_by_customer",
        sa.Column("basis", sa.String(length=16), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("customer_id", sa.String(length=128), nullable=False),
        *(_counter(name) for name in SUMMED),
        sa.PrimaryKeyConstraint(
            "basis", "level", "bucket_start", "customer_id", name="pk_usage_rollups_by_customer"
        ),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "call_status_rollups",
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket_start", UTC_DATETIME, nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        _counter("calls"),
        sa.PrimaryKeyConstraint("level", "bucket_start", "status", name="pk_call_status_rollups"),
    )
    postgres = op.get_bind().dialect.name == "postgresql"
    mod = "%"  # op.execute's text() doubles it for PostgreSQL's driver
    true = "true" if postgres else "1"
    counts = [name for name in SUMMED if not name.endswith(("_whole_usd", "_frac_pusd"))]
    money = []
    for name in MONEY:
        # The whole dollars and the picodollars summed, the picodollars' carry moved.
        frac = f"sum({name}_frac_pusd)"
        money.append(
            f"sum({name}_whole_usd) + ({frac} - {frac} {mod} {PICO}) / {PICO}, {frac} {mod} {PICO}"
        )
    columns = ", ".join((*counts, *(f"{n}_whole_usd, {n}_frac_pusd" for n in MONEY)))
    sums = ", ".join((*(f"sum({name})" for name in counts), *money))
    _run(
        f"INSERT INTO usage_rollups_by_key ({', '.join(key)}, {columns}) "
        f"SELECT {', '.join(key)}, {sums} FROM usage_rollups "
        f"GROUP BY {', '.join(key)}"
    )
    by_customer = ("basis", "level", "bucket_start", "customer_id")
    _run(
        f"INSERT INTO usage_rollups_by_customer ({', '.join(by_customer)}, {columns}) "
        f"SELECT {', '.join(by_customer)}, {sums} FROM usage_rollups_by_key "
        f"GROUP BY {', '.join(by_customer)}"
    )
    into = "INSERT INTO call_status_rollups (level, bucket_start, status, calls) "
    # A settled call with a start, at its start: where the call_start rollups hold it.
    _run(
        into + f"SELECT {QUARTER}, {_floor(postgres, QUARTER, 'started_at')}, status, count(*) "
        f"FROM calls WHERE settled IS {true} AND started_at IS NOT NULL GROUP BY 2, status"
    )
    for level in (HOUR, DAY, MONTH):
        _run(
            into + f"SELECT {level}, {_floor(postgres, level, 'bucket_start')}, status, "
            f"sum(calls) FROM call_status_rollups WHERE level = {QUARTER} GROUP BY 2, status"
        )
    op.create_index(
        "ix_usage_rollups_by_key_basis_api_key_id_level_bucket_start",
        "usage_rollups_by_key",
        ["basis", "api_key_id", "level", "bucket_start"],
    )
    op.create_index(
        "ix_usage_rollups_by_key_basis_customer_id_level_bucket_start",
        "usage_rollups_by_key",
        ["basis", "customer_id", "level", "bucket_start"],
    )
    op.create_index(
        "ix_usage_rollups_by_customer_customer_id",
        "usage_rollups_by_customer",
        ["basis", "customer_id", "level", "bucket_start"],
    )


def downgrade() -> None:
    op.drop_table("call_status_rollups")
    op.drop_table("usage_rollups_by_customer")
    op.drop_table("usage_rollups_by_key")
