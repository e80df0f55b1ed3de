"""The drift's "ours" on SQLite (``billing.drift.repository``).

``calls.started_at`` and ``drift_rollups.bucket_start`` are fixed-format UTC text
(``billing.storage.types.sqlite_text``), so a day is their first 10 characters and an hour
their first 13. A month is read from ``drift_rollups`` (a row per day and group; the hours
around whole days), the calls it does not hold from the two partial indexes of the reconciler's
due queries (the calls not settled) and ``usage_rollup_keyless`` (the settled ones without
``stream.started``), and the ragged part of an hour at either end from calls by start.
"""

from __future__ import annotations

from typing import Any

from billing.drift.rows import Grain, OursRow, Span
from billing.drift.sql.common import SqlDrift
from billing.rollups.rows import PICO
from billing.storage.types import sqlite_text

_WIDTH = {"day": 10, "hour": 13}

#: Per grain; parameters: the span's start and end (``sqlite_text``), the provider or null,
#: the level.
FROM_ROLLUP = {
    grain: (
        f"SELECT substr(bucket_start, 1, {width}) AS slot, nullif(provider, ''), "
        "nullif(model, ''), nullif(upstream_account, ''), nullif(service_tier, ''), "
        "sum(requests), sum(input_tokens), sum(cache_read_input_tokens), "
        "sum(cache_creation_input_tokens), sum(output_tokens), sum(cost_whole_usd), "
        "sum(cost_frac_pusd), sum(unpriced_calls) FROM drift_rollups "
        "WHERE level = ?4 AND bucket_start >= ?1 AND bucket_start < ?2 "
        "AND (?3 IS NULL OR provider = ?3) AND calls != 0 "
        "GROUP BY slot, provider, model, upstream_account, service_tier"
    )
    for grain, width in _WIDTH.items()
}
_CALL_COLUMNS = (
    "started_at, provider, model, upstream_account, service_tier, attempts, input_tokens, "
    "cache_read_input_tokens, cache_creation_input_tokens, output_tokens_billed, cost_pusd, "
    "settled"
)


def _from_calls(grain: Grain, calls: str) -> str:
    width = _WIDTH[grain]
    return (
        f"SELECT substr(started_at, 1, {width}) AS slot, provider, model, upstream_account, "
        "service_tier, sum(max(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
        "sum(cache_creation_input_tokens), sum(output_tokens_billed), "
        f"sum(coalesce(cost_pusd, 0) / {PICO}), sum(coalesce(cost_pusd, 0) % {PICO}), "
        f"sum(settled = 1 AND cost_pusd IS NULL) FROM {calls} "
        "WHERE started_at >= ?1 AND started_at < ?2 AND (?3 IS NULL OR provider = ?3) "
        "GROUP BY slot, provider, model, upstream_account, service_tier"
    )


#: The calls ``drift_rollups`` does not hold (``DriftRollup``): not settled (the reconciler's
#: two due indexes hold every one: open, or pending), or settled without ``stream.started``
#: (``usage_rollup_keyless``, read first: CROSS JOIN keeps SQLite from searching a month of
#: calls by start for them).
_UNROLLED = (
    f"(SELECT {_CALL_COLUMNS} FROM calls "
    "INDEXED BY ix_calls_settled_pending_last_received_at_request_id "
    "WHERE settled = 0 AND pending = 0 "
    f"UNION ALL SELECT {_CALL_COLUMNS} FROM calls "
    "INDEXED BY ix_calls_pending_last_received_at_request_id WHERE pending = 1 AND settled = 0 "
    f"UNION ALL SELECT {', '.join('c.' + name for name in _CALL_COLUMNS.split(', '))} "
    "FROM usage_rollup_keyless k CROSS JOIN calls c ON c.request_id = k.request_id)"
)
#: Per grain; parameters: since, until (``sqlite_text``), the provider or null.
UNROLLED: dict[Grain, str] = {
    "day": _from_calls("day", _UNROLLED),
    "hour": _from_calls("hour", _UNROLLED),
}
_BY_START = "calls INDEXED BY ix_calls_started_at_request_id"
EVERY_CALL: dict[Grain, str] = {
    "day": _from_calls("day", _BY_START),
    "hour": _from_calls("hour", _BY_START),
}


def _ours(rows: Any) -> list[OursRow]:
    return [OursRow._make((*row[:10], row[10] * PICO + row[11], row[12])) for row in rows]


class SqliteDrift(SqlDrift):
    """``DriftRepository`` on SQLite: spans bound as stored text."""

    def read_rollup(
        self, conn: Any, grain: Grain, level: int, span: Span, provider: str | None
    ) -> list[OursRow]:
        params = (sqlite_text(span[0]), sqlite_text(span[1]), provider, level)
        return _ours(conn.exec_driver_sql(FROM_ROLLUP[grain], params))

    def read_calls(
        self, conn: Any, grain: Grain, unrolled: bool, span: Span, provider: str | None
    ) -> list[OursRow]:
        statement = (UNROLLED if unrolled else EVERY_CALL)[grain]
        params = (sqlite_text(span[0]), sqlite_text(span[1]), provider)
        return _ours(conn.exec_driver_sql(statement, params))
