"""The drift's "ours" on PostgreSQL (``billing.drift.repository``).

A month is read from ``drift_rollups`` (a row per day and group; the hours around whole days),
the calls it does not hold from the two partial indexes of the reconciler's due queries (the
calls not settled) and ``usage_rollup_keyless`` (the settled ones without ``stream.started``),
and the ragged part of an hour at either end from calls by start. The slot is written as the
``OursRow`` text here, for the few groups.
"""

from __future__ import annotations

from typing import Any

from billing.drift.rows import Grain, OursRow, Span
from billing.drift.sql.common import SqlDrift
from billing.rollups.rows import PICO

#: The ``OursRow`` text of a slot, per grain.
_SLOT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d %H"}
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


class PostgresDrift(SqlDrift):
    """``DriftRepository`` on PostgreSQL: the grain written into the statements."""

    def read_rollup(
        self, conn: Any, grain: Grain, level: int, span: Span, provider: str | None
    ) -> list[OursRow]:
        params = {"since": span[0], "until": span[1], "provider": provider, "level": level}
        return _ours(conn.exec_driver_sql(FROM_ROLLUP.replace("{grain}", grain), params), grain)

    def read_calls(
        self, conn: Any, grain: Grain, unrolled: bool, span: Span, provider: str | None
    ) -> list[OursRow]:
        statement = (UNROLLED if unrolled else EVERY_CALL).replace("{grain}", grain)
        params = {"since": span[0], "until": span[1], "provider": provider}
        return _ours(conn.exec_driver_sql(statement, params), grain)
