"""The drift's "ours" and its rollup on PostgreSQL (``billing.drift.repository.DriftRepository``).

A month is read from ``drift_rollups`` (a row per day and group; the hours around whole days),
the calls it does not hold from the two partial indexes of the reconciler's due queries (the
calls not settled) and ``usage_rollup_keyless`` (the settled ones without ``stream.started``),
and the ragged part of an hour at either end from calls by start. The slot is written as the
``OursRow`` text here, for the few groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.drift.repository import DAY, HOUR, Grain, OursRow, RollupKey, RollupSums, spans
from billing.rollups.repository import PICO
from billing.storage.drift_core import DriftCore

#: The ``OursRow`` text of a slot, per grain.
_SLOT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d %H"}
#: The ``drift_rollups`` columns a call adds to, after its key.
_SUMS = (
    "count(*), sum(greatest(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(mod(coalesce(cost_pusd, 0), {PICO})), "
    "count(*) FILTER (WHERE cost_pusd IS NULL)"
)
_KEY = (
    "date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', "
    "coalesce(provider, ''), coalesce(model, ''), coalesce(upstream_account, ''), "
    "coalesce(service_tier, '')"
)
_COLUMNS = (
    "level, bucket_start, provider, model, upstream_account, service_tier, calls, requests, "
    "input_tokens, cache_read_input_tokens, cache_creation_input_tokens, output_tokens, "
    "cost_whole_usd, cost_frac_pusd, unpriced_calls"
)
_SUMMED = _COLUMNS.split(", ")[6:]

#: Parameters: the span, the provider or null, the level.
FROM_ROLLUP = (
    "SELECT date_trunc('{grain}', bucket_start AT TIME ZONE 'UTC') AS slot, nullif(provider, ''), "
    "nullif(model, ''), nullif(upstream_account, ''), nullif(service_tier, ''), "
    "sum(requests), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens), sum(cost_whole_usd), "
    "sum(cost_frac_pusd), sum(unpriced_calls) FROM drift_rollups "
    "WHERE level = %(level)s AND bucket_start >= %(since)s AND bucket_start < %(until)s "
    "AND (%(provider)s::text IS NULL OR provider = %(provider)s::text) AND calls != 0 "
    "GROUP BY slot, provider, model, upstream_account, service_tier"
)
_CALL_COLUMNS = (
    "started_at, provider, model, upstream_account, service_tier, attempts, input_tokens, "
    "cache_read_input_tokens, cache_creation_input_tokens, output_tokens_billed, cost_pusd, "
    "settled"
)
_FROM_CALLS = (
    "SELECT date_trunc('{grain}', started_at AT TIME ZONE 'UTC') AS slot, provider, model, "
    "upstream_account, service_tier, sum(greatest(attempts, 1)), sum(input_tokens), "
    "sum(cache_read_input_tokens), sum(cache_creation_input_tokens), sum(output_tokens_billed), "
    f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(mod(coalesce(cost_pusd, 0), {PICO})), "
    "count(*) FILTER (WHERE settled AND cost_pusd IS NULL) FROM {calls} AS c "
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
    f"INSERT INTO drift_rollups ({_COLUMNS}) VALUES ({', '.join(['%s'] * 15)}) "
    "ON CONFLICT (level, bucket_start, provider, model, upstream_account, service_tier) "
    "DO UPDATE SET "
    + ", ".join(f"{name} = drift_rollups.{name} + excluded.{name}" for name in _SUMMED)
)
CLEAR = "DELETE FROM drift_rollups"
#: Every settled call with a start and a ``stream.started`` (anomalies are a JSON list of codes).
REBUILD = (
    f"INSERT INTO drift_rollups ({_COLUMNS}) SELECT {HOUR}, {_KEY}, {_SUMS} FROM calls "
    "WHERE settled AND started_at IS NOT NULL "
    "AND strpos(anomalies::text, '\"started_missing\"') = 0 GROUP BY 2, 3, 4, 5, 6"
)
#: The days from their hours.
REBUILD_DAYS = (
    f"INSERT INTO drift_rollups ({_COLUMNS}) SELECT {DAY}, "
    "date_trunc('day', bucket_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', provider, model, "
    f"upstream_account, service_tier, {', '.join(f'sum({name})' for name in _SUMMED)} "
    f"FROM drift_rollups WHERE level = {HOUR} GROUP BY 2, 3, 4, 5, 6"
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
                int(row[12]),
            )
        )
        for row in rows
    ]


class PostgresDrift(DriftCore):
    """``DriftRepository`` on PostgreSQL."""

    ADD, CLEAR, REBUILD, REBUILD_DAYS = ADD, CLEAR, REBUILD, REBUILD_DAYS

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        conn = session.connection()
        ragged, whole, rolled = spans(since, until, grain)
        rows: list[OursRow] = []
        for level, (start, end) in rolled:
            params = {"since": start, "until": end, "provider": provider, "level": level}
            sql = FROM_ROLLUP.replace("{grain}", grain)
            rows += _ours(conn.exec_driver_sql(sql, params), grain)
        spans_of_calls = [(UNROLLED, whole)] if whole is not None else []
        spans_of_calls += [(EVERY_CALL, span) for span in ragged]
        for statement, (start, end) in spans_of_calls:
            params = {"since": start, "until": end, "provider": provider}
            sql = statement.replace("{grain}", grain)
            rows += _ours(conn.exec_driver_sql(sql, params), grain)
        return rows

    def contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        rows = session.connection().exec_driver_sql(CONTRIBUTIONS, {"ids": list(request_ids)})
        return {tuple(row[:5]): [int(value) for value in row[5:]] for row in rows}

    def day_of(self, hour: Any) -> Any:
        return hour.astimezone(UTC).replace(hour=0)


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresDrift()
