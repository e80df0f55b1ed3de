"""The drift's "ours" and its rollup on PostgreSQL (``billing.drift.repository.DriftRepository``).

A month is read from ``drift_rollups`` (a row per hour and group), the calls it does not hold
from the two partial indexes of the reconciler's due queries (the calls not settled) and
``usage_rollup_keyless`` (the settled ones without ``stream.started``), and the ragged hours at
either end from calls by start. The slot is written as the ``OursRow`` text here, for the few
groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow, RollupKey, RollupSums, whole_hours
from billing.rollups.repository import PICO

#: The ``OursRow`` text of a slot, per grain.
_SLOT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d %H"}
#: The ``drift_rollups`` columns a call adds to, after its key.
_SUMS = (
    "count(*), sum(greatest(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(mod(coalesce(cost_pusd, 0), {PICO}))"
)
_KEY = (
    "date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', "
    "coalesce(provider, ''), coalesce(model, ''), coalesce(upstream_account, ''), "
    "coalesce(service_tier, '')"
)
_COLUMNS = (
    "hour, provider, model, upstream_account, service_tier, calls, requests, input_tokens, "
    "cache_read_input_tokens, cache_creation_input_tokens, output_tokens, cost_whole_usd, "
    "cost_frac_pusd"
)
_SUMMED = _COLUMNS.split(", ")[5:]

#: Parameters: the first whole hour, the end of the last, the provider or null.
FROM_ROLLUP = (
    "SELECT date_trunc('{grain}', hour AT TIME ZONE 'UTC') AS slot, nullif(provider, ''), "
    "nullif(model, ''), nullif(upstream_account, ''), nullif(service_tier, ''), "
    "sum(requests), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens), sum(cost_whole_usd), "
    "sum(cost_frac_pusd) FROM drift_rollups "
    "WHERE hour >= %(since)s AND hour < %(until)s "
    "AND (%(provider)s::text IS NULL OR provider = %(provider)s::text) AND calls != 0 "
    "GROUP BY slot, provider, model, upstream_account, service_tier"
)
_CALL_COLUMNS = (
    "started_at, provider, model, upstream_account, service_tier, attempts, input_tokens, "
    "cache_read_input_tokens, cache_creation_input_tokens, output_tokens_billed, cost_pusd"
)
_FROM_CALLS = (
    "SELECT date_trunc('{grain}', started_at AT TIME ZONE 'UTC') AS slot, provider, model, "
    "upstream_account, service_tier, sum(greatest(attempts, 1)), sum(input_tokens), "
    "sum(cache_read_input_tokens), sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(mod(coalesce(cost_pusd, 0), {PICO})) "
    "FROM {calls} AS c "
    "WHERE started_at >= %(since)s AND started_at < %(until)s "
    "AND (%(provider)s::text IS NULL OR provider = %(provider)s::text) "
    "GROUP BY slot, provider, model, upstream_account, service_tier"
)
#: The calls ``drift_rollups`` does not hold (``DriftRollup``): not settled (the reconciler's
#: two due indexes hold every one: open, or pending), or settled without ``stream.started``.
UNROLLED = _FROM_CALLS.replace(
    "{calls}",
    f"(SELECT {_CALL_COLUMNS} FROM calls WHERE NOT settled AND NOT pending "
    f"UNION ALL SELECT {_CALL_COLUMNS} FROM calls WHERE pending AND NOT settled "
    f"UNION ALL SELECT {', '.join('c.' + name for name in _CALL_COLUMNS.split(', '))} "
    "FROM usage_rollup_keyless k JOIN calls c ON c.request_id = k.request_id)",
)
EVERY_CALL = _FROM_CALLS.replace("{calls}", "calls")

CONTRIBUTIONS = (
    f"SELECT {_KEY}, {_SUMS} FROM calls WHERE request_id = ANY(%(ids)s::varchar[]) "
    "GROUP BY 1, 2, 3, 4, 5"
)
ADD = (
    f"INSERT INTO drift_rollups ({_COLUMNS}) VALUES ({', '.join(['%s'] * 13)}) "
    "ON CONFLICT (hour, provider, model, upstream_account, service_tier) DO UPDATE SET "
    + ", ".join(f"{name} = drift_rollups.{name} + excluded.{name}" for name in _SUMMED)
)
CLEAR = "DELETE FROM drift_rollups"
#: Every settled call with a start and a ``stream.started`` (anomalies are a JSON list of codes).
REBUILD = (
    f"INSERT INTO drift_rollups ({_COLUMNS}) SELECT {_KEY}, {_SUMS} FROM calls "
    "WHERE settled AND started_at IS NOT NULL "
    "AND strpos(anomalies::text, '\"started_missing\"') = 0 GROUP BY 1, 2, 3, 4, 5"
)


def _ours(rows: Any, grain: Grain) -> list[OursRow]:
    pattern = _SLOT[grain]
    return [
        OursRow._make(
            (
                row[0].strftime(pattern),
                *row[1:5],
                *(int(value) for value in row[5:10]),
                int(row[10]) * PICO + int(row[11]),
            )
        )
        for row in rows
    ]


class PostgresDrift:
    """``DriftRepository`` on PostgreSQL."""

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        conn = session.connection()
        first, end = whole_hours(since, until)
        rows: list[OursRow] = []
        if first >= end:
            ragged = [(since, until)]
        else:
            ragged = [(since, first), (end, until)]
            whole = {"since": first, "until": end, "provider": provider}
            for statement in (FROM_ROLLUP, UNROLLED):
                sql = statement.replace("{grain}", grain)
                rows += _ours(conn.exec_driver_sql(sql, whole), grain)
        for start, stop in ragged:
            if start < stop:
                params = {"since": start, "until": stop, "provider": provider}
                sql = EVERY_CALL.replace("{grain}", grain)
                rows += _ours(conn.exec_driver_sql(sql, params), grain)
        return rows

    def contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        rows = session.connection().exec_driver_sql(CONTRIBUTIONS, {"ids": list(request_ids)})
        return {tuple(row[:5]): [int(value) for value in row[5:]] for row in rows}

    def add(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            session.connection().exec_driver_sql(ADD, list(rows))

    def rebuild(self, session: Session) -> None:
        conn = session.connection()
        conn.exec_driver_sql(CLEAR)
        conn.exec_driver_sql(REBUILD)


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresDrift()
