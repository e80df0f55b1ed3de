"""The rollups on PostgreSQL (``billing.rollups.repository``): the usage rollups and the
drift's.

Statements run on the raw driver (psycopg: ``%s``/``%b`` placeholders, ``%%`` for a literal
``%``); rows are added as one array per column, unnested into a single upsert.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, func, literal_column
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from billing.rollups.buckets import DAY, HOUR, MONTH, QUARTER
from billing.rollups.rows import (
    DAY as DRIFT_DAY,
)
from billing.rollups.rows import (
    HOUR as DRIFT_HOUR,
)
from billing.rollups.rows import (
    PICO,
    ROLLUP_SUMMED,
    RollupKey,
    RollupSums,
    Rows,
)
from billing.rollups.sql.common import DriftCore, added_on_conflict, rebuild_statements

_SUMMED = ROLLUP_SUMMED
_KEY_TYPES = {"level": "int2", "bucket_start": "timestamptz"}


def _add(table: str, key: tuple[str, ...]) -> str:
    columns = ", ".join((*key, *_SUMMED))
    types = [_KEY_TYPES.get(name, "varchar") for name in key] + ["int8"] * len(_SUMMED)
    arrays = ", ".join(f"%b::{name}[]" for name in types)
    return (
        f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {added_on_conflict(table, '%%')}"
    )


ADD_KEYED = _add(
    "usage_rollups", ("basis", "api_key_id", "level", "bucket_start", "model", "customer_id")
)
ADD_ALL_KEYS = _add("usage_rollups_all_keys", ("basis", "level", "bucket_start", "model"))
ADD_BY_KEY = _add(
    "usage_rollups_by_key", ("basis", "api_key_id", "level", "bucket_start", "customer_id")
)
ADD_BY_CUSTOMER = _add(
    "usage_rollups_by_customer", ("basis", "level", "bucket_start", "customer_id")
)
ADD_STATUSES = (
    "INSERT INTO call_status_rollups (level, bucket_start, status, calls) "
    "SELECT * FROM unnest(%s::int2[], %s::timestamptz[], %s::varchar[], %s::int8[]) "
    "ON CONFLICT (level, bucket_start, status) "
    "DO UPDATE SET calls = call_status_rollups.calls + excluded.calls"
)

KEYLESS_STARTS = (
    "SELECT request_id, started_at FROM usage_rollup_keyless WHERE request_id = ANY(%s)"
)
FORGET_KEYLESS = "DELETE FROM usage_rollup_keyless WHERE request_id = ANY(%s)"
KEEP_KEYLESS = (
    "INSERT INTO usage_rollup_keyless (request_id, started_at) "
    "SELECT * FROM unnest(%s::varchar[], %s::timestamptz[]) "
    "ON CONFLICT (request_id) DO UPDATE SET started_at = excluded.started_at"
)


def floor_sql(level: int, column: Any) -> ColumnElement[Any]:
    """SQL for ``billing.rollups.buckets.floor(level, column)``: ``date_bin`` for 15 minutes,
    ``date_trunc`` in UTC for the others."""
    if level == QUARTER:
        return func.date_bin(
            literal_column("interval '15 minutes'"),
            column,
            literal_column("timestamptz '2000-01-01 00:00:00+00'"),
        )
    unit = {HOUR: "'hour'", DAY: "'day'", MONTH: "'month'"}[level]
    return func.date_trunc(literal_column(unit), column, literal_column("'UTC'"))


_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]  # untyped in SQLAlchemy


def _text(expression: ColumnElement[Any]) -> str:
    return str(expression.compile(dialect=_DIALECT, compile_kwargs={"literal_binds": True}))


def _columns(rows: Sequence[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    return tuple(list(column) for column in zip(*rows, strict=True))


#: ``rebuild``: empty the rollup tables, then fill them again from the calls and the ledger.
def _floor(level: int, column: str) -> str:
    return _text(floor_sql(level, literal_column(column)))


#: ``rebuild``: empty the rollup tables, then fill them again from the calls and the ledger.
REBUILD = rebuild_statements("%%", "true", _floor)


# -- the drift's rollup (``billing.rollups.drift``) ------------------------------------------

#: The ``drift_rollups`` columns a call adds to, after its key.
_DRIFT_SUMS = (
    "count(*), sum(greatest(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(mod(coalesce(cost_pusd, 0), {PICO})), "
    "count(*) FILTER (WHERE cost_pusd IS NULL)"
)
_DRIFT_KEY = (
    "date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', "
    "coalesce(provider, ''), coalesce(model, ''), coalesce(upstream_account, ''), "
    "coalesce(service_tier, '')"
)
_DRIFT_COLUMNS = (
    "level, bucket_start, provider, model, upstream_account, service_tier, calls, requests, "
    "input_tokens, cache_read_input_tokens, cache_creation_input_tokens, output_tokens, "
    "cost_whole_usd, cost_frac_pusd, unpriced_calls"
)
_DRIFT_SUMMED = _DRIFT_COLUMNS.split(", ")[6:]

DRIFT_CONTRIBUTIONS = (
    f"SELECT {_DRIFT_KEY}, {_DRIFT_SUMS} FROM calls WHERE request_id = ANY(%(ids)s::varchar[]) "
    "GROUP BY 1, 2, 3, 4, 5"
)
ADD_DRIFT = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) VALUES ({', '.join(['%s'] * 15)}) "
    "ON CONFLICT (level, bucket_start, provider, model, upstream_account, service_tier) "
    "DO UPDATE SET "
    + ", ".join(f"{name} = drift_rollups.{name} + excluded.{name}" for name in _DRIFT_SUMMED)
)
CLEAR_DRIFT = "DELETE FROM drift_rollups"
#: Every settled call with a start and a ``stream.started`` (anomalies are a JSON list of codes).
REBUILD_DRIFT = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) "
    f"SELECT {DRIFT_HOUR}, {_DRIFT_KEY}, {_DRIFT_SUMS} FROM calls "
    "WHERE settled AND started_at IS NOT NULL "
    "AND strpos(anomalies::text, '\"started_missing\"') = 0 GROUP BY 2, 3, 4, 5, 6"
)
#: The days from their hours.
REBUILD_DRIFT_DAYS = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) SELECT {DRIFT_DAY}, "
    "date_trunc('day', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', provider, model, "
    f"upstream_account, service_tier, {', '.join(f'sum({name})' for name in _DRIFT_SUMMED)} "
    f"FROM drift_rollups WHERE level = {DRIFT_HOUR} GROUP BY 2, 3, 4, 5, 6"
)


class PostgresRollups(DriftCore):
    """``RollupsRepository`` on PostgreSQL."""

    ADD_DRIFT, CLEAR_DRIFT = ADD_DRIFT, CLEAR_DRIFT
    REBUILD_DRIFT, REBUILD_DRIFT_DAYS = REBUILD_DRIFT, REBUILD_DRIFT_DAYS

    def floor_sql(self, level: int, column: Any) -> ColumnElement[Any]:
        return floor_sql(level, column)

    def add(
        self,
        session: Session,
        keyed: Rows,
        all_keys: Rows,
        by_key: Rows,
        by_customer: Rows,
        statuses: Rows,
    ) -> None:
        conn = session.connection()
        for statement, rows in (
            (ADD_KEYED, keyed),
            (ADD_ALL_KEYS, all_keys),
            (ADD_BY_KEY, by_key),
            (ADD_BY_CUSTOMER, by_customer),
            (ADD_STATUSES, statuses),
        ):
            if rows:
                conn.exec_driver_sql(statement, _columns(rows))

    def keyless_starts(self, session: Session, request_ids: Sequence[str]) -> dict[str, datetime]:
        rows = session.connection().exec_driver_sql(KEYLESS_STARTS, (list(request_ids),))
        return {request_id: started_at.astimezone(UTC) for request_id, started_at in rows}

    def keep_keyless(self, session: Session, rows: Sequence[tuple[str, datetime]]) -> None:
        session.connection().exec_driver_sql(KEEP_KEYLESS, _columns(rows))

    def forget_keyless(self, session: Session, request_ids: Sequence[str]) -> None:
        session.connection().exec_driver_sql(FORGET_KEYLESS, (list(request_ids),))

    def rebuild(self, session: Session) -> None:
        conn = session.connection()
        for statement in REBUILD:
            conn.exec_driver_sql(statement)

    def drift_contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        rows = session.connection().exec_driver_sql(DRIFT_CONTRIBUTIONS, {"ids": list(request_ids)})
        return {tuple(row[:5]): [int(value) for value in row[5:]] for row in rows}

    def drift_day_of(self, hour: Any) -> Any:
        return hour.astimezone(UTC).replace(hour=0)
