"""The rollups on SQLite (``billing.rollups.repository``): the usage rollups and the drift's.

SQLite keeps a UTC instant as text ``YYYY-MM-DD HH:MM:SS.ffffff`` (``billing.storage.types``):
a bucket's start is a prefix of that text completed with zeros, and statements on the raw driver
bind instants as that text.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import ColumnElement, String, case, cast, func, literal_column
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from billing.rollups.buckets import DAY, HOUR, QUARTER
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
from billing.storage.lists import CHUNK, with_ids
from billing.storage.types import cached_sqlite_text

_SUMMED = ", ".join(ROLLUP_SUMMED)


def _add(table: str, key: str) -> str:
    marks = ", ".join("?" * (key.count(",") + 1 + len(ROLLUP_SUMMED)))
    return (
        f"INSERT INTO {table} ({key}, {_SUMMED}) VALUES ({marks}) "
        f"ON CONFLICT ({key}) DO UPDATE SET {added_on_conflict(table, '%')}"
    )


ADD_KEYED = _add("usage_rollups", "basis, api_key_id, level, bucket_start, model, customer_id")
ADD_ALL_KEYS = _add("usage_rollups_all_keys", "basis, level, bucket_start, model")
ADD_BY_KEY = _add("usage_rollups_by_key", "basis, api_key_id, level, bucket_start, customer_id")
ADD_BY_CUSTOMER = _add("usage_rollups_by_customer", "basis, level, bucket_start, customer_id")
ADD_STATUSES = (
    "INSERT INTO call_status_rollups (level, bucket_start, status, calls) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (level, bucket_start, status) DO UPDATE SET calls = calls + excluded.calls"
)

KEYLESS_STARTS = (
    "SELECT request_id, started_at FROM usage_rollup_keyless "
    "WHERE request_id IN (SELECT value FROM json_each(?))"
)
FORGET_KEYLESS = (
    "DELETE FROM usage_rollup_keyless WHERE request_id IN (SELECT value FROM json_each(?))"
)
KEEP_KEYLESS = (
    "INSERT INTO usage_rollup_keyless (request_id, started_at) VALUES (?, ?) "
    "ON CONFLICT (request_id) DO UPDATE SET started_at = excluded.started_at"
)


def floor_sql(level: int, column: Any) -> ColumnElement[Any]:
    """SQL for ``billing.rollups.buckets.floor(level, column)``: the stored text's prefix."""
    text = cast(column, String)
    if level == QUARTER:
        minute = func.substr(text, 15, 2)
        quarter = case(
            (minute < "15", "00"), (minute < "30", "15"), (minute < "45", "30"), else_="45"
        )
        return func.substr(text, 1, 14) + quarter + ":00.000000"
    if level == HOUR:
        return func.substr(text, 1, 13) + ":00:00.000000"
    if level == DAY:
        return func.substr(text, 1, 10) + " 00:00:00.000000"
    return func.substr(text, 1, 7) + "-01 00:00:00.000000"


def _text(expression: ColumnElement[Any]) -> str:
    return str(expression.compile(dialect=_DIALECT, compile_kwargs={"literal_binds": True}))


_DIALECT = sqlite.dialect()


def _json_list(values: Sequence[str]) -> str:
    return orjson.dumps(list(values)).decode()


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _floor(level: int, column: str) -> str:
    return _text(floor_sql(level, literal_column(column)))


#: ``rebuild``: empty the rollup tables, then fill them again from the calls and the ledger.
REBUILD = rebuild_statements("%", "1", _floor)


# -- the drift's rollup (``billing.rollups.drift``) ------------------------------------------

#: The ``drift_rollups`` columns a call adds to, after its key.
_DRIFT_SUMS = (
    "count(*), sum(max(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(coalesce(cost_pusd, 0) % {PICO}), "
    "sum(cost_pusd IS NULL)"
)
_DRIFT_KEY = (
    "substr(started_at, 1, 13) || ':00:00.000000', coalesce(provider, ''), coalesce(model, ''), "
    "coalesce(upstream_account, ''), coalesce(service_tier, '')"
)
_DRIFT_COLUMNS = (
    "level, bucket_start, provider, model, upstream_account, service_tier, calls, requests, "
    "input_tokens, cache_read_input_tokens, cache_creation_input_tokens, output_tokens, "
    "cost_whole_usd, cost_frac_pusd, unpriced_calls"
)
_DRIFT_SUMMED = _DRIFT_COLUMNS.split(", ")[6:]

#: The ids are filled in by ``with_ids``.
DRIFT_CONTRIBUTIONS = (
    f"SELECT {_DRIFT_KEY}, {_DRIFT_SUMS} FROM calls WHERE request_id IN ({{ids}}) "
    "GROUP BY 1, 2, 3, 4, 5"
)
ADD_DRIFT = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) VALUES ({', '.join('?' * 15)}) "
    "ON CONFLICT (level, bucket_start, provider, model, upstream_account, service_tier) "
    "DO UPDATE SET " + ", ".join(f"{name} = {name} + excluded.{name}" for name in _DRIFT_SUMMED)
)
CLEAR_DRIFT = "DELETE FROM drift_rollups"
#: Every settled call with a start and a ``stream.started`` (anomalies are a JSON list of codes).
REBUILD_DRIFT = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) "
    f"SELECT {DRIFT_HOUR}, {_DRIFT_KEY}, {_DRIFT_SUMS} FROM calls "
    "WHERE settled = 1 AND started_at IS NOT NULL "
    "AND instr(anomalies, '\"started_missing\"') = 0 GROUP BY 2, 3, 4, 5, 6"
)
#: The days from their hours.
REBUILD_DRIFT_DAYS = (
    f"INSERT INTO drift_rollups ({_DRIFT_COLUMNS}) SELECT {DRIFT_DAY}, "
    "substr(bucket_start, 1, 10) || ' 00:00:00.000000', provider, model, upstream_account, "
    f"service_tier, {', '.join(f'sum({name})' for name in _DRIFT_SUMMED)} FROM drift_rollups "
    f"WHERE level = {DRIFT_HOUR} GROUP BY 2, 3, 4, 5, 6"
)


class SqliteRollups(DriftCore):
    """``RollupsRepository`` on SQLite."""

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
        # Each table's rows carry their bucket_start at their own position (``at``): SQLite's
        # text of it is put there, the rest of each row passed as it is.
        for statement, rows, at in (
            (ADD_KEYED, keyed, 3),
            (ADD_ALL_KEYS, all_keys, 2),
            (ADD_BY_KEY, by_key, 3),
            (ADD_BY_CUSTOMER, by_customer, 2),
            (ADD_STATUSES, statuses, 1),
        ):
            if rows:
                params = [(*r[:at], cached_sqlite_text(r[at]), *r[at + 1 :]) for r in rows]
                conn.exec_driver_sql(statement, params)

    def keyless_starts(self, session: Session, request_ids: Sequence[str]) -> dict[str, datetime]:
        rows = session.connection().exec_driver_sql(KEYLESS_STARTS, (_json_list(request_ids),))
        return {request_id: _instant(text) for request_id, text in rows}

    def keep_keyless(self, session: Session, rows: Sequence[tuple[str, datetime]]) -> None:
        params = [(request_id, cached_sqlite_text(at)) for request_id, at in rows]
        session.connection().exec_driver_sql(KEEP_KEYLESS, params)

    def forget_keyless(self, session: Session, request_ids: Sequence[str]) -> None:
        session.connection().exec_driver_sql(FORGET_KEYLESS, (_json_list(request_ids),))

    def rebuild(self, session: Session) -> None:
        conn = session.connection()
        for statement in REBUILD:
            conn.exec_driver_sql(statement)

    def drift_contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        conn = session.connection()
        found: dict[RollupKey, RollupSums] = {}
        for start in range(0, len(request_ids), CHUNK):
            chunk = tuple(request_ids[start : start + CHUNK])
            for row in conn.exec_driver_sql(with_ids(DRIFT_CONTRIBUTIONS, len(chunk)), chunk):
                key: RollupKey = tuple(row[:5])
                sums = list(row[5:])
                summed = found.get(key)
                found[key] = (
                    sums if summed is None else [a + b for a, b in zip(summed, sums, strict=True)]
                )
        return found

    def drift_day_of(self, hour: Any) -> Any:
        return hour[:10] + " 00:00:00.000000"
