"""The fast path's statement on PostgreSQL (``billing.reconcile.fastpath`` says what it computes and
``billing.reconcile.fastpath.HANDLED`` which events and fields it reads).

One statement: the step's common calls are gathered in a materialized CTE (f), from which the
ledger entries are inserted and the ``calls`` rows updated (data-modifying CTEs) and the rollup
contributions summed. The text it shares with SQLite's statements is
``billing.reconcile.sql.fastpath``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.reconcile.rows import CommonCharge, Reasons, Settled
from billing.reconcile.sql import fastpath as shared

# Room to group the step's events in a hash table (with the default 4 MB PostgreSQL sorts them
# first); for this transaction only.
WORK_MEM = "SET LOCAL work_mem = '32MB'"

# The shared fragments (billing.storage.settle_common_sql) with this statement's names: the
# usage's typed columns are u's.
_CALL_AGGREGATES = shared.CALL_AGGREGATES.format(calls="request_id = ANY(%(ids)s::varchar[])")
_COLUMNS = shared.SETTLE_COLUMNS.format(u="u", greatest="GREATEST")

# g: per call, the aggregates of its events, for the calls of the common shape only (one
# attempt, one stream.started, one stream.usage, at most one stream.client_disconnected, the rest
# stream.tokens); the usage (ue) and the disconnect (de) are named by their seq and read once,
# by key. u: their fields as typed columns, with ok false for any value the rule would not take
# as ingest writes it (a usage that ingest did not flag plain, ``events.plain_usage``: a v2 field
# or a JSON null anywhere in its body, sends the call to the rule). p: the price in force at the
# call's start (a LATERAL subquery run once per call). The call settles now with upstream usage
# (and nothing delivered beyond it: an anomaly, the rule's), or with an estimate whose last event
# arrived settle_after ago (cutoff). The ledger entries are inserted in code-point order of
# request_id (a step's entries: these first, then the rule's). A call's metadata as the rule
# gives it: none for an absent or empty object (ingest wrote the stream.started's as JSON text,
# null or {} included). The rollup groups: per key, model and 15-minute bucket of the start, and
# within it per provider and upstream account with the hour as ``drift_rollups`` keys it
# (``billing.storage.postgres.drift``: the drift rollup's contributions come from these groups
# too); the cost summed as whole dollars and picodollars.
_SETTLE = f"""
WITH f AS MATERIALIZED (
    SELECT {_COLUMNS}, c.provider AS provider, c.upstream_account AS upstream_account,
        c.call_no AS call_no
    FROM (
        {_CALL_AGGREGATES}
    ) AS g
    JOIN events ue ON ue.seq = g.usage_seq
    CROSS JOIN LATERAL json_to_record(ue.body::json) AS uj(
        source text, input_tokens json, output_tokens json, cache_read_input_tokens json,
        cache_creation_input_tokens json, reasoning_tokens json, stop_reason json)
    LEFT JOIN events de ON de.seq = g.disconnect_seq
    LEFT JOIN LATERAL json_to_record(de.body::json)
        AS dj(output_tokens_delivered json, output_tokens_generated json) ON true
    CROSS JOIN LATERAL (
        SELECT uj.source AS source,
            CASE WHEN json_typeof(uj.input_tokens) = 'number'
                THEN (uj.input_tokens::text)::bigint END AS input_tokens,
            CASE WHEN json_typeof(uj.output_tokens) = 'number'
                THEN (uj.output_tokens::text)::bigint END AS output_tokens,
            CASE WHEN uj.cache_read_input_tokens IS NULL THEN 0
                WHEN json_typeof(uj.cache_read_input_tokens) = 'number'
                THEN (uj.cache_read_input_tokens::text)::bigint END AS cache_read_input_tokens,
            CASE WHEN uj.cache_creation_input_tokens IS NULL THEN 0
                WHEN json_typeof(uj.cache_creation_input_tokens) = 'number'
                THEN (uj.cache_creation_input_tokens::text)::bigint END
                AS cache_creation_input_tokens,
            CASE WHEN uj.reasoning_tokens IS NULL THEN 0
                WHEN json_typeof(uj.reasoning_tokens) = 'number'
                THEN (uj.reasoning_tokens::text)::bigint END AS reasoning_tokens,
            uj.stop_reason #>> '{{}}' AS stop_reason,
            CASE WHEN json_typeof(dj.output_tokens_delivered) = 'number'
                THEN (dj.output_tokens_delivered::text)::bigint END AS disconnect_delivered,
            CASE WHEN dj.output_tokens_generated IS NULL THEN 0
                WHEN json_typeof(dj.output_tokens_generated) = 'number'
                THEN (dj.output_tokens_generated::text)::bigint END AS disconnect_generated,
            (ue.plain_usage
                AND json_typeof(uj.input_tokens) = 'number'
                AND json_typeof(uj.output_tokens) = 'number'
                AND coalesce(json_typeof(uj.cache_read_input_tokens), 'number') = 'number'
                AND coalesce(json_typeof(uj.cache_creation_input_tokens), 'number') = 'number'
                AND coalesce(json_typeof(uj.reasoning_tokens), 'number') = 'number'
                AND coalesce(json_typeof(uj.stop_reason), 'string') = 'string'
                AND (g.disconnect_seq IS NULL OR (
                    json_typeof(dj.output_tokens_delivered) = 'number'
                    AND coalesce(json_typeof(dj.output_tokens_generated), 'number') = 'number'))
            ) AS ok
    ) AS u
    JOIN calls c ON c.request_id = g.request_id
    CROSS JOIN LATERAL (SELECT * FROM prices p {shared.PRICE_IN_FORCE}) AS p
    WHERE c.settled = false AND c.api_key_id IS NOT NULL AND c.model IS NOT NULL
        AND c.started_at = g.started_at AND u.ok
        AND {{conditions}}
),
ledger AS (
    INSERT INTO ledger_entries ({shared.ENTRY_COLUMN_LIST})
    SELECT f.request_id, 1, 'settlement',
        CASE WHEN f.usage_source = 'upstream' THEN %(complete)s ELSE %(timed_out)s END,
        %(now)s, {shared.ENTRY_VALUES}
    FROM f ORDER BY f.request_id COLLATE "C"
),
updated AS (
    UPDATE calls SET
        metadata = CASE WHEN calls.metadata::text IN ('null', '{{}}') THEN NULL
            ELSE calls.metadata END,
        ended_at = f.ended_at, status = f.status, settled = true,
        settled_at = COALESCE(calls.settled_at, %(now)s), usage_source = f.usage_source,
        attempts = 1, {shared.SET_TOKENS_AND_COST},
        anomalies = CASE WHEN f.usage_source = 'upstream' THEN '[]'::json
            ELSE '{shared.USAGE_MISSING_JSON}'::json END,
        error_type = NULL, stop_reason = f.stop_reason, last_received_at = f.arrival,
        pending = false
    FROM f WHERE calls.request_id = f.request_id
)
SELECT api_key_id, model,
    date_bin(interval '15 minutes', started_at, timestamptz '2000-01-01 00:00:00+00')
        AS quarter,
    date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
    coalesce(provider, '') AS provider_key, coalesce(upstream_account, '') AS account_key,
    {shared.ROLLUP_SUMS},
    array_agg(request_id ORDER BY request_id), array_agg(cost_pusd ORDER BY request_id),
    array_agg(call_no ORDER BY request_id)
FROM f GROUP BY api_key_id, model, quarter, hour, provider_key, account_key
"""

#: ``_SETTLE`` by the answers of ``shared.PROBES_NEEDED``.
SETTLE = {
    case: _SETTLE.replace(
        "{conditions}",
        shared.settle_conditions(*case).format(u="u", greatest="GREATEST", cutoff="%(cutoff)s"),
    )
    for case in shared.PROBE_CASES
}


class PostgresSettleCommon:
    """``ReconcileRepository.settle_common`` on PostgreSQL."""

    def settle_common(
        self, session: Session, ids: Sequence[str], now: datetime, cutoff: datetime, why: Reasons
    ) -> Settled:
        if not ids:
            return [], []
        conn = session.connection()
        conn.exec_driver_sql(WORK_MEM)
        long_context, assignments = conn.exec_driver_sql(shared.PROBES_NEEDED).one()
        rows = conn.exec_driver_sql(
            SETTLE[long_context, assignments],
            {
                "ids": list(ids),
                "now": now,
                "cutoff": cutoff,
                "complete": why[0],
                "timed_out": why[1],
            },
        ).all()
        settled: list[CommonCharge] = []
        groups: list[Any] = []
        for key, model, quarter, *sums, members, costs, numbers in rows:
            settled.extend(
                (rid, key, int(cost), number)
                for rid, cost, number in zip(members, costs, numbers, strict=True)
            )
            if quarter.tzinfo is not UTC:
                quarter = quarter.astimezone(UTC)
            groups.append((key, model, quarter, *sums))
        return settled, groups
