"""The fast path's statement on PostgreSQL (``billing.reconcile.common`` says what it computes and
``billing.reconcile.common.HANDLED`` which events and fields it reads).

One statement: the step's common calls are gathered in a materialized CTE (f), from which the
ledger entries are inserted and the ``calls`` rows updated (data-modifying CTEs) and the rollup
contributions summed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.ingest.schemas import MAX_TOKENS
from billing.reconcile.ledger import ENTRY_COLUMNS, RATE_COLUMNS
from billing.reconcile.repository import Reasons, Settled
from billing.reconcile.rule import USAGE_MISSING
from billing.rollups.repository import PICO

#: Rates at or above this (micro-USD per million tokens) go to the rule: with token counts at most
#: ``MAX_TOKENS``, four products below 2.15 * 10**18 each cannot overflow a signed 64-bit sum.
RATE_LIMIT = 2**31

# Room to group the step's events in a hash table (with the default 4 MB PostgreSQL sorts them
# first); for this transaction only.
WORK_MEM = "SET LOCAL work_mem = '32MB'"

_F_TOKENS = ", ".join(f"f.{name}" for name in TOKEN_FIELDS)
_F_RATES = ", ".join(f"f.{name}" for name in RATE_COLUMNS)
_SET_TOKENS = ", ".join(f"{name} = f.{name}" for name in TOKEN_FIELDS)
_SUM_TOKENS = ", ".join(f"sum({name})" for name in TOKEN_FIELDS)
_USAGE_MISSING = json.dumps([USAGE_MISSING])

# g: per call, the aggregates of its events, for the calls of the common shape only (one
# attempt, one stream.started, one stream.usage, at most one stream.client_disconnected, the rest
# stream.tokens); the usage (ue) and the disconnect (de) are named by their seq and read once,
# by key. u: their fields as typed columns, with ok false for any value the rule would not take
# as ingest writes it (a JSON null anywhere in the usage body sends the call to the rule:
# ingest's bodies are compact JSON, so a null is written ":null"). p: the price in force at the
# call's start (a LATERAL subquery run once per call). The call settles now with upstream usage
# (and nothing delivered beyond it: an anomaly, the rule's), or with an estimate whose last event
# arrived settle_after ago (cutoff). The ledger entries are inserted in code-point order of
# request_id (a step's entries: these first, then the rule's). A call's metadata as the rule
# gives it: none for an absent or empty object (ingest wrote the stream.started's as JSON text,
# null or {} included). The rollup groups: per key, model and 15-minute bucket of the start; the
# cost summed as whole dollars and picodollars.
SETTLE = f"""
WITH f AS MATERIALIZED (
    SELECT g.request_id AS request_id, c.api_key_id AS api_key_id, c.model AS model,
        c.protocol AS protocol,
        CASE WHEN g.disconnect_seq IS NULL THEN 'completed' ELSE 'client_disconnected' END
            AS status,
        g.started_at AS started_at, g.ended_at AS ended_at,
        GREATEST(g.arrival, c.last_received_at) AS arrival,
        u.source AS usage_source,
        u.input_tokens AS input_tokens,
        u.cache_read_input_tokens AS cache_read_input_tokens,
        u.cache_creation_input_tokens AS cache_creation_input_tokens,
        CASE WHEN u.source = 'upstream' THEN u.output_tokens
            ELSE GREATEST(u.output_tokens, g.progress_generated,
                coalesce(u.disconnect_generated, 0),
                CASE WHEN u.disconnect_delivered > g.progress_delivered
                    THEN u.disconnect_delivered ELSE g.progress_delivered END)
        END AS output_tokens_billed,
        CASE WHEN u.disconnect_delivered > g.progress_delivered THEN u.disconnect_delivered
            ELSE g.progress_delivered END AS output_tokens_delivered,
        (CASE WHEN u.source = 'upstream' THEN u.output_tokens
            ELSE GREATEST(u.output_tokens, g.progress_generated,
                coalesce(u.disconnect_generated, 0),
                CASE WHEN u.disconnect_delivered > g.progress_delivered
                    THEN u.disconnect_delivered ELSE g.progress_delivered END)
        END) - (CASE WHEN u.disconnect_delivered > g.progress_delivered
            THEN u.disconnect_delivered ELSE g.progress_delivered END)
            AS output_tokens_undelivered,
        u.reasoning_tokens AS reasoning_tokens,
        u.stop_reason AS stop_reason,
        p.id AS price_id,
        p.input_uusd_per_mtok AS input_uusd_per_mtok,
        p.output_uusd_per_mtok AS output_uusd_per_mtok,
        p.cache_read_uusd_per_mtok AS cache_read_uusd_per_mtok,
        p.cache_creation_uusd_per_mtok AS cache_creation_uusd_per_mtok,
        u.input_tokens * p.input_uusd_per_mtok
            + u.cache_read_input_tokens * p.cache_read_uusd_per_mtok
            + u.cache_creation_input_tokens * p.cache_creation_uusd_per_mtok
            + (CASE WHEN u.source = 'upstream' THEN u.output_tokens
                ELSE GREATEST(u.output_tokens, g.progress_generated,
                    coalesce(u.disconnect_generated, 0),
                    CASE WHEN u.disconnect_delivered > g.progress_delivered
                        THEN u.disconnect_delivered ELSE g.progress_delivered END)
            END) * p.output_uusd_per_mtok AS cost_pusd
    FROM (
        SELECT min(request_id) AS request_id,
            max(CASE WHEN type = 'stream.started' THEN occurred_at END) AS started_at,
            max(occurred_at) AS ended_at, max(received_at) AS arrival,
            coalesce(max(output_tokens_delivered), 0) AS progress_delivered,
            coalesce(max(output_tokens_generated), 0) AS progress_generated,
            max(CASE WHEN type = 'stream.usage' THEN seq END) AS usage_seq,
            max(CASE WHEN type = 'stream.client_disconnected' THEN seq END) AS disconnect_seq
        FROM events
        WHERE call_no IN (
            SELECT call_no FROM calls WHERE request_id = ANY(%(ids)s::varchar[]))
        GROUP BY call_no
        HAVING min(attempt) = max(attempt)
            AND sum(CASE WHEN type = 'stream.started' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type = 'stream.usage' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type IN ('stream.tokens', 'stream.client_disconnected') THEN 1
                ELSE 0 END) = count(*) - 2
            AND sum(CASE WHEN type = 'stream.client_disconnected' THEN 1 ELSE 0 END) <= 1
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
            (ue.body NOT LIKE '%%:null%%'
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
    CROSS JOIN LATERAL (
        SELECT * FROM prices p WHERE p.model = c.model AND p.effective_from <= g.started_at
        ORDER BY p.effective_from DESC LIMIT 1
    ) AS p
    WHERE c.settled = false AND c.api_key_id IS NOT NULL AND c.model IS NOT NULL
        AND c.started_at = g.started_at AND u.ok
        AND u.input_tokens BETWEEN 0 AND {MAX_TOKENS}
        AND u.output_tokens BETWEEN 0 AND {MAX_TOKENS}
        AND u.cache_read_input_tokens BETWEEN 0 AND {MAX_TOKENS}
        AND u.cache_creation_input_tokens BETWEEN 0 AND {MAX_TOKENS}
        AND u.reasoning_tokens BETWEEN 0 AND {MAX_TOKENS}
        AND g.progress_delivered <= {MAX_TOKENS} AND g.progress_generated <= {MAX_TOKENS}
        AND coalesce(u.disconnect_delivered, 0) <= {MAX_TOKENS}
        AND coalesce(u.disconnect_generated, 0) <= {MAX_TOKENS}
        AND ((u.source = 'upstream' AND u.output_tokens >=
                CASE WHEN u.disconnect_delivered > g.progress_delivered
                    THEN u.disconnect_delivered ELSE g.progress_delivered END)
            OR (u.source = 'estimate'
                AND GREATEST(g.arrival, c.last_received_at) <= %(cutoff)s))
        AND p.input_uusd_per_mtok < {RATE_LIMIT} AND p.output_uusd_per_mtok < {RATE_LIMIT}
        AND p.cache_read_uusd_per_mtok < {RATE_LIMIT}
        AND p.cache_creation_uusd_per_mtok < {RATE_LIMIT}
),
ledger AS (
    INSERT INTO ledger_entries ({", ".join(ENTRY_COLUMNS)})
    SELECT f.request_id, 1, 'settlement',
        CASE WHEN f.usage_source = 'upstream' THEN %(complete)s ELSE %(timed_out)s END,
        %(now)s, f.api_key_id, f.model, f.protocol, f.status, f.started_at, {_F_TOKENS},
        f.price_id, {_F_RATES}, f.cost_pusd
    FROM f ORDER BY f.request_id COLLATE "C"
),
updated AS (
    UPDATE calls SET
        metadata = CASE WHEN calls.metadata::text IN ('null', '{{}}') THEN NULL
            ELSE calls.metadata END,
        ended_at = f.ended_at, status = f.status, settled = true,
        settled_at = COALESCE(calls.settled_at, %(now)s), usage_source = f.usage_source,
        attempts = 1, {_SET_TOKENS}, cost_pusd = f.cost_pusd,
        anomalies = CASE WHEN f.usage_source = 'upstream' THEN '[]'::json
            ELSE '{_USAGE_MISSING}'::json END,
        error_type = NULL, stop_reason = f.stop_reason, last_received_at = f.arrival,
        pending = false
    FROM f WHERE calls.request_id = f.request_id
)
SELECT api_key_id, model,
    date_bin(interval '15 minutes', started_at, timestamptz '2000-01-01 00:00:00+00')
        AS quarter,
    count(*), {_SUM_TOKENS},
    sum(cost_pusd / {PICO}), sum(cost_pusd - cost_pusd / {PICO} * {PICO}),
    array_agg(request_id)
FROM f GROUP BY api_key_id, model, quarter
"""


class PostgresSettleCommon:
    """``ReconcileRepository.settle_common`` on PostgreSQL."""

    def settle_common(
        self, session: Session, ids: Sequence[str], now: datetime, cutoff: datetime, why: Reasons
    ) -> Settled:
        if not ids:
            return [], []
        conn = session.connection()
        conn.exec_driver_sql(WORK_MEM)
        rows = conn.exec_driver_sql(
            SETTLE,
            {
                "ids": list(ids),
                "now": now,
                "cutoff": cutoff,
                "complete": why[0],
                "timed_out": why[1],
            },
        ).all()
        settled: list[str] = []
        groups: list[Any] = []
        for key, model, quarter, *sums, members in rows:
            settled.extend(members)
            if quarter.tzinfo is not UTC:
                quarter = quarter.astimezone(UTC)
            groups.append((key, model, quarter, *sums))
        return settled, groups
