"""The fast path's statements on SQLite (``billing.reconcile.common`` says what they compute and
``billing.reconcile.common.HANDLED`` which events and fields they read).

A step's common calls are gathered in ``scratch.reconcile_common`` (a table in the connection's
in-memory ``scratch`` database, see ``billing.storage.db``), then the ledger entries and the
``calls`` rows are written from it and its rollup contributions summed.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.ingest.schemas import MAX_TOKENS
from billing.reconcile.ledger import ENTRY_COLUMNS, RATE_COLUMNS
from billing.reconcile.repository import Reasons, Settled
from billing.reconcile.rule import USAGE_MISSING
from billing.rollups.repository import PICO
from billing.storage.types import sqlite_text

#: ``UPDATE … FROM`` needs SQLite 3.33 (2020); with an older library every call goes to the rule.
SQLITE_SUPPORTED = sqlite3.sqlite_version_info >= (3, 33, 0)

#: Calls per statement (one parameter each; SQLite takes up to 32,766).
CHUNK = 4000

#: Rates at or above this (micro-USD per million tokens) go to the rule: with token counts at most
#: ``MAX_TOKENS``, four products below 2.15 * 10**18 each cannot overflow a signed 64-bit sum.
RATE_LIMIT = 2**31


@functools.lru_cache(maxsize=64)
def with_ids(statement: str, count: int) -> str:
    """``statement`` with its ``{ids}`` list of ``count`` parameters (one per request id)."""
    return statement.replace("{ids}", ", ".join("?" * count))


_TOKENS = ", ".join(TOKEN_FIELDS)
_RATES = ", ".join(RATE_COLUMNS)

SCRATCH_TABLE = f"""
CREATE TABLE IF NOT EXISTS scratch.reconcile_common (
    request_id TEXT PRIMARY KEY, api_key_id, model, protocol, status, started_at, ended_at,
    arrival, usage_source, {_TOKENS}, stop_reason, price_id, {_RATES}, cost_pusd,
    call_rowid INTEGER
)"""

CLEAR_SCRATCH = "DELETE FROM scratch.reconcile_common"

# Per call (s), the aggregates of its events, for the calls of the common shape only: one
# attempt, one stream.started, one stream.usage, at most one stream.client_disconnected, the rest
# stream.tokens. The usage (u) and the disconnect (d) are named by their seq and read once, by
# key; g adds their fields as typed columns, with ok false for any value the rule would not take
# as ingest writes it (a JSON null anywhere in the usage body sends the call to the rule:
# ingest's bodies are compact JSON, so a null is written ":null"). The price (p) is the one in
# force at the call's start; the call settles now with upstream usage (and nothing delivered
# beyond it: an anomaly, the rule's), or with an estimate whose last event arrived settle_after
# ago (the one parameter after the ids).
GATHER = f"""
INSERT INTO scratch.reconcile_common
SELECT g.request_id AS request_id, c.api_key_id AS api_key_id, c.model AS model,
    c.protocol AS protocol,
    CASE WHEN g.disconnect_seq IS NULL THEN 'completed' ELSE 'client_disconnected' END AS status,
    g.started_at AS started_at, g.ended_at AS ended_at,
    max(g.arrival, c.last_received_at) AS arrival,
    g.source AS usage_source,
    g.input_tokens AS input_tokens,
    g.cache_read_input_tokens AS cache_read_input_tokens,
    g.cache_creation_input_tokens AS cache_creation_input_tokens,
    CASE WHEN g.source = 'upstream' THEN g.output_tokens
        ELSE max(g.output_tokens, g.progress_generated, coalesce(g.disconnect_generated, 0),
            CASE WHEN g.disconnect_delivered > g.progress_delivered THEN g.disconnect_delivered
                ELSE g.progress_delivered END)
    END AS output_tokens_billed,
    CASE WHEN g.disconnect_delivered > g.progress_delivered THEN g.disconnect_delivered
        ELSE g.progress_delivered END AS output_tokens_delivered,
    (CASE WHEN g.source = 'upstream' THEN g.output_tokens
        ELSE max(g.output_tokens, g.progress_generated, coalesce(g.disconnect_generated, 0),
            CASE WHEN g.disconnect_delivered > g.progress_delivered THEN g.disconnect_delivered
                ELSE g.progress_delivered END)
    END) - (CASE WHEN g.disconnect_delivered > g.progress_delivered THEN g.disconnect_delivered
        ELSE g.progress_delivered END) AS output_tokens_undelivered,
    g.reasoning_tokens AS reasoning_tokens,
    g.stop_reason AS stop_reason,
    p.id AS price_id,
    p.input_uusd_per_mtok AS input_uusd_per_mtok,
    p.output_uusd_per_mtok AS output_uusd_per_mtok,
    p.cache_read_uusd_per_mtok AS cache_read_uusd_per_mtok,
    p.cache_creation_uusd_per_mtok AS cache_creation_uusd_per_mtok,
    g.input_tokens * p.input_uusd_per_mtok
        + g.cache_read_input_tokens * p.cache_read_uusd_per_mtok
        + g.cache_creation_input_tokens * p.cache_creation_uusd_per_mtok
        + (CASE WHEN g.source = 'upstream' THEN g.output_tokens
            ELSE max(g.output_tokens, g.progress_generated, coalesce(g.disconnect_generated, 0),
                CASE WHEN g.disconnect_delivered > g.progress_delivered
                    THEN g.disconnect_delivered ELSE g.progress_delivered END)
        END) * p.output_uusd_per_mtok AS cost_pusd,
    c.rowid
FROM (
    SELECT s.*,
        json_extract(u.body, '$.source') AS source,
        json_extract(u.body, '$.input_tokens') AS input_tokens,
        json_extract(u.body, '$.output_tokens') AS output_tokens,
        coalesce(json_extract(u.body, '$.cache_read_input_tokens'), 0) AS cache_read_input_tokens,
        coalesce(json_extract(u.body, '$.cache_creation_input_tokens'), 0)
            AS cache_creation_input_tokens,
        coalesce(json_extract(u.body, '$.reasoning_tokens'), 0) AS reasoning_tokens,
        json_extract(u.body, '$.stop_reason') AS stop_reason,
        json_extract(d.body, '$.output_tokens_delivered') AS disconnect_delivered,
        coalesce(json_extract(d.body, '$.output_tokens_generated'), 0) AS disconnect_generated,
        (u.body NOT LIKE '%:null%'
            AND typeof(json_extract(u.body, '$.input_tokens')) = 'integer'
            AND typeof(json_extract(u.body, '$.output_tokens')) = 'integer'
            AND typeof(coalesce(json_extract(u.body, '$.cache_read_input_tokens'), 0)) = 'integer'
            AND typeof(coalesce(json_extract(u.body, '$.cache_creation_input_tokens'), 0))
                = 'integer'
            AND typeof(coalesce(json_extract(u.body, '$.reasoning_tokens'), 0)) = 'integer'
            AND typeof(coalesce(json_extract(u.body, '$.stop_reason'), '')) = 'text'
            AND (s.disconnect_seq IS NULL OR (d.seq IS NOT NULL
                AND typeof(json_extract(d.body, '$.output_tokens_delivered')) = 'integer'
                AND typeof(coalesce(json_extract(d.body, '$.output_tokens_generated'), 0))
                    = 'integer'))
        ) AS ok
    FROM (
        SELECT min(request_id) AS request_id,
            max(CASE WHEN type = 'stream.started' THEN occurred_at END) AS started_at,
            max(occurred_at) AS ended_at, max(received_at) AS arrival,
            coalesce(max(output_tokens_delivered), 0) AS progress_delivered,
            coalesce(max(output_tokens_generated), 0) AS progress_generated,
            max(CASE WHEN type = 'stream.usage' THEN seq END) AS usage_seq,
            max(CASE WHEN type = 'stream.client_disconnected' THEN seq END) AS disconnect_seq
        FROM events
        WHERE call_no IN (SELECT call_no FROM calls WHERE request_id IN ({{ids}}))
        GROUP BY call_no
        HAVING min(attempt) = max(attempt)
            AND sum(CASE WHEN type = 'stream.started' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type = 'stream.usage' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type IN ('stream.tokens', 'stream.client_disconnected') THEN 1
                ELSE 0 END) = count(*) - 2
            AND sum(CASE WHEN type = 'stream.client_disconnected' THEN 1 ELSE 0 END) <= 1
    ) AS s
    JOIN events u ON u.seq = s.usage_seq AND json_valid(u.body)
    LEFT JOIN events d ON d.seq = s.disconnect_seq AND json_valid(d.body)
) AS g
JOIN calls c ON c.request_id = g.request_id
JOIN prices p ON p.id = (
    SELECT p.id FROM prices p WHERE p.model = c.model AND p.effective_from <= g.started_at
    ORDER BY p.effective_from DESC LIMIT 1
)
WHERE c.settled = 0 AND c.api_key_id IS NOT NULL AND c.model IS NOT NULL
    AND c.started_at = g.started_at AND g.ok
    AND g.input_tokens BETWEEN 0 AND {MAX_TOKENS}
    AND g.output_tokens BETWEEN 0 AND {MAX_TOKENS}
    AND g.cache_read_input_tokens BETWEEN 0 AND {MAX_TOKENS}
    AND g.cache_creation_input_tokens BETWEEN 0 AND {MAX_TOKENS}
    AND g.reasoning_tokens BETWEEN 0 AND {MAX_TOKENS}
    AND g.progress_delivered <= {MAX_TOKENS} AND g.progress_generated <= {MAX_TOKENS}
    AND coalesce(g.disconnect_delivered, 0) <= {MAX_TOKENS}
    AND coalesce(g.disconnect_generated, 0) <= {MAX_TOKENS}
    AND ((g.source = 'upstream' AND g.output_tokens >=
            CASE WHEN g.disconnect_delivered > g.progress_delivered THEN g.disconnect_delivered
                ELSE g.progress_delivered END)
        OR (g.source = 'estimate' AND max(g.arrival, c.last_received_at) <= ?))
    AND p.input_uusd_per_mtok < {RATE_LIMIT} AND p.output_uusd_per_mtok < {RATE_LIMIT}
    AND p.cache_read_uusd_per_mtok < {RATE_LIMIT} AND p.cache_creation_uusd_per_mtok < {RATE_LIMIT}
"""

SETTLED = "SELECT request_id FROM scratch.reconcile_common"

_F_TOKENS = ", ".join(f"f.{name}" for name in TOKEN_FIELDS)
_F_RATES = ", ".join(f"f.{name}" for name in RATE_COLUMNS)

#: One settlement entry per call, in request_id order; parameters: the reasons of an upstream
#: and of an estimate's settlement, and booked_at.
INSERT_ENTRIES = f"""
INSERT INTO ledger_entries ({", ".join(ENTRY_COLUMNS)})
SELECT f.request_id, 1, 'settlement',
    CASE WHEN f.usage_source = 'upstream' THEN ? ELSE ? END, ?,
    f.api_key_id, f.model, f.protocol, f.status, f.started_at, {_F_TOKENS}, f.price_id,
    {_F_RATES}, f.cost_pusd
FROM scratch.reconcile_common f ORDER BY f.request_id
"""

_SET_TOKENS = ", ".join(f"{name} = f.{name}" for name in TOKEN_FIELDS)
_USAGE_MISSING = json.dumps([USAGE_MISSING])

# A call's metadata as the rule gives it: none for an absent or empty object (ingest wrote the
# stream.started's as JSON text, null or {} included). The IN (…) makes SQLite look the calls up
# by key (their rowid, kept from GATHER: no second search of the request_id index); with the
# join alone it scans calls. Parameter: settled_at.
UPDATE_CALLS = f"""
UPDATE calls SET
    metadata = CASE WHEN calls.metadata IN ('null', '{{}}') THEN NULL ELSE calls.metadata END,
    ended_at = f.ended_at, status = f.status, settled = 1,
    settled_at = COALESCE(calls.settled_at, ?), usage_source = f.usage_source, attempts = 1,
    {_SET_TOKENS}, cost_pusd = f.cost_pusd,
    anomalies = CASE WHEN f.usage_source = 'upstream' THEN '[]' ELSE '{_USAGE_MISSING}' END,
    error_type = NULL, stop_reason = f.stop_reason, last_received_at = f.arrival, pending = 0
FROM scratch.reconcile_common f
WHERE calls.rowid = f.call_rowid
    AND calls.rowid IN (SELECT call_rowid FROM scratch.reconcile_common)
"""

_SUM_TOKENS = ", ".join(f"sum({name})" for name in TOKEN_FIELDS)

# The calls' contributions summed per key, model and 15-minute bucket of their start (the
# start's text cut to its quarter hour). The cost is summed as whole dollars and picodollars
# (each call's cost < 2**63 picodollars; their sum may not be: SQLite's sum() raises on an
# overflow).
ROLLUP_GROUPS = f"""
SELECT api_key_id, model,
    substr(CAST(started_at AS VARCHAR), 1, 14)
        || CASE WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '15') THEN '00'
            WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '30') THEN '15'
            WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '45') THEN '30'
            ELSE '45' END
        || ':00.000000' AS quarter,
    count(*), {_SUM_TOKENS},
    sum(cost_pusd / {PICO}), sum(cost_pusd - cost_pusd / {PICO} * {PICO})
FROM scratch.reconcile_common
GROUP BY api_key_id, model, quarter
"""


class SqliteSettleCommon:
    """``ReconcileRepository.settle_common`` on SQLite."""

    def settle_common(
        self, session: Session, ids: Sequence[str], now: datetime, cutoff: datetime, why: Reasons
    ) -> Settled:
        if not SQLITE_SUPPORTED or not ids:
            return [], []
        conn = session.connection()
        now_text = sqlite_text(now)
        cutoff_text = sqlite_text(cutoff)
        conn.exec_driver_sql(SCRATCH_TABLE)
        conn.exec_driver_sql(CLEAR_SCRATCH)
        for start in range(0, len(ids), CHUNK):
            chunk = tuple(ids[start : start + CHUNK])
            conn.exec_driver_sql(with_ids(GATHER, len(chunk)), (*chunk, cutoff_text))
        settled = list(conn.exec_driver_sql(SETTLED).scalars())
        if not settled:
            return [], []
        conn.exec_driver_sql(INSERT_ENTRIES, (*why, now_text))
        conn.exec_driver_sql(UPDATE_CALLS, (now_text,))
        groups = [
            (key, model, datetime.fromisoformat(quarter + "+00:00"), *sums)
            for key, model, quarter, *sums in conn.exec_driver_sql(ROLLUP_GROUPS)
        ]
        return settled, groups
