"""The fast path's statements on SQLite (``billing.reconcile.fastpath`` says what they compute and
``billing.reconcile.fastpath.HANDLED`` which events and fields they read).

A step's common calls are gathered in ``scratch.reconcile_common`` (a table in the connection's
in-memory ``scratch`` database, see ``billing.storage.db``), then the ledger entries and the
``calls`` rows are written from it and its rollup contributions summed. The text they share with
PostgreSQL's statement is ``billing.reconcile.sql.fastpath``'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.rates import RATE_COLUMNS
from billing.reconcile.rows import Reasons, Settled
from billing.reconcile.sql import fastpath as shared
from billing.storage.lists import CHUNK, with_ids
from billing.storage.rawcursor import fetch_chunks
from billing.storage.types import sqlite_text

#: ``UPDATE … FROM`` needs SQLite 3.33 (2020); with an older library every call goes to the rule.
SQLITE_SUPPORTED = sqlite3.sqlite_version_info >= (3, 33, 0)

_TOKENS = ", ".join(TOKEN_FIELDS)
_RATES = ", ".join(RATE_COLUMNS)

#: The step's common calls, in the connection's in-memory ``scratch`` database: filled by
#: ``settle_common`` (cleared first), read by the step's credit draws
#: (``billing.credits.sql.common.SqliteCredits.insert_draws``) in the same transaction.
SCRATCH_COMMON = "scratch.reconcile_common"

SCRATCH_TABLE = f"""
CREATE TABLE IF NOT EXISTS {SCRATCH_COMMON} (
    request_id TEXT PRIMARY KEY, api_key_id, model, protocol, status, started_at, ended_at,
    arrival, usage_source, {_TOKENS}, stop_reason, price_id, {_RATES}, cost_pusd,
    provider, upstream_account, call_rowid INTEGER, call_no INTEGER
)"""

CLEAR_SCRATCH = "DELETE FROM scratch.reconcile_common"

# The shared fragments (billing.storage.settle_common_sql) with GATHER's names: the usage's typed
# columns are g's (with the events' aggregates); the ids are filled in by ``with_ids``.
_CALL_AGGREGATES = shared.CALL_AGGREGATES.format(calls="request_id IN ({ids})")
_COLUMNS = shared.SETTLE_COLUMNS.format(u="g", greatest="max")

# Per call (s), the aggregates of its events, for the calls of the common shape only: one
# attempt, one stream.started, one stream.usage, at most one stream.client_disconnected, the rest
# stream.tokens. The usage (u) and the disconnect (d) are named by their seq and read once, by
# key; g adds their fields as typed columns, with ok false for any value the rule would not take
# as ingest writes it (a usage that ingest did not flag plain, ``events.plain_usage``: a v2 field
# or a JSON null anywhere in its body, sends the call to the rule). The price (p) is the one in
# force at the call's start; the call settles now with upstream usage (and nothing delivered
# beyond it: an anomaly, the rule's), or with an estimate whose last event arrived settle_after
# ago (the one parameter after the ids).
_GATHER = f"""
INSERT INTO scratch.reconcile_common
SELECT {_COLUMNS},
    c.provider, c.upstream_account, c.rowid, c.call_no
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
        (u.plain_usage = 1
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
        {_CALL_AGGREGATES}
    ) AS s
    JOIN events u ON u.seq = s.usage_seq AND json_valid(u.body)
    LEFT JOIN events d ON d.seq = s.disconnect_seq AND json_valid(d.body)
) AS g
JOIN calls c ON c.request_id = g.request_id
JOIN prices p ON p.id = (SELECT p.id FROM prices p {shared.PRICE_IN_FORCE})
WHERE c.settled = 0 AND c.api_key_id IS NOT NULL AND c.model IS NOT NULL
    AND c.started_at = g.started_at AND g.ok
    AND {{conditions}}
"""

#: ``_GATHER`` by the answers of ``shared.PROBES_NEEDED``.
GATHER = {
    case: _GATHER.replace(
        "{conditions}",
        shared.settle_conditions(*case).format(u="g", greatest="max", cutoff="?"),
    )
    for case in shared.PROBE_CASES
}

SETTLED = "SELECT request_id, api_key_id, cost_pusd, call_no FROM scratch.reconcile_common"

#: One settlement entry per call, in request_id order; parameters: the reasons of an upstream
#: and of an estimate's settlement, and booked_at.
INSERT_ENTRIES = f"""
INSERT INTO ledger_entries ({shared.ENTRY_COLUMN_LIST})
SELECT f.request_id, 1, 'settlement',
    CASE WHEN f.usage_source = 'upstream' THEN ? ELSE ? END, ?, {shared.ENTRY_VALUES}
FROM scratch.reconcile_common f ORDER BY f.request_id
"""

# A call's metadata as the rule gives it: none for an absent or empty object (ingest wrote the
# stream.started's as JSON text, null or {} included). The IN (…) makes SQLite look the calls up
# by key (their rowid, kept from GATHER: no second search of the request_id index); with the
# join alone it scans calls. Parameter: settled_at.
UPDATE_CALLS = f"""
UPDATE calls SET
    metadata = CASE WHEN calls.metadata IN ('null', '{{}}') THEN NULL ELSE calls.metadata END,
    ended_at = f.ended_at, status = f.status, settled = 1,
    settled_at = COALESCE(calls.settled_at, ?), usage_source = f.usage_source, attempts = 1,
    {shared.SET_TOKENS_AND_COST},
    anomalies = CASE WHEN f.usage_source = 'upstream' THEN '[]'
        ELSE '{shared.USAGE_MISSING_JSON}' END,
    error_type = NULL, stop_reason = f.stop_reason, last_received_at = f.arrival, pending = 0
FROM scratch.reconcile_common f
WHERE calls.rowid = f.call_rowid
    AND calls.rowid IN (SELECT call_rowid FROM scratch.reconcile_common)
"""

# The calls' contributions summed per key, model and 15-minute bucket of their start (the
# start's text cut to its quarter hour), and within it per provider and upstream account, with
# the hour as ``drift_rollups`` keys it (``billing.storage.sqlite.drift``): the drift rollup's
# contributions come from these groups too. The cost is summed as whole dollars and
# picodollars (each call's cost < 2**63 picodollars; their sum may not be: SQLite's sum()
# raises on an overflow).
ROLLUP_GROUPS = f"""
SELECT api_key_id, model,
    substr(CAST(started_at AS VARCHAR), 1, 14)
        || CASE WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '15') THEN '00'
            WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '30') THEN '15'
            WHEN (substr(CAST(started_at AS VARCHAR), 15, 2) < '45') THEN '30'
            ELSE '45' END
        || ':00.000000' AS quarter,
    substr(CAST(started_at AS VARCHAR), 1, 13) || ':00:00.000000' AS hour,
    coalesce(provider, '') AS provider_key, coalesce(upstream_account, '') AS account_key,
    {shared.ROLLUP_SUMS}
FROM scratch.reconcile_common
GROUP BY api_key_id, model, quarter, hour, provider_key, account_key
"""


def _cursor(connection: sqlite3.Connection) -> sqlite3.Cursor:
    return connection.cursor()


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
        long_context, assignments = conn.exec_driver_sql(shared.PROBES_NEEDED).one()
        gather = GATHER[bool(long_context), bool(assignments)]
        for start in range(0, len(ids), CHUNK):
            chunk = tuple(ids[start : start + CHUNK])
            conn.exec_driver_sql(with_ids(gather, len(chunk)), (*chunk, cutoff_text))
        # (the driver's cursor: SQLAlchemy's result would wrap each of thousands of rows)
        settled = [row for rows in fetch_chunks(conn, _cursor, SETTLED, (), CHUNK) for row in rows]
        if not settled:
            return [], []
        conn.exec_driver_sql(INSERT_ENTRIES, (*why, now_text))
        conn.exec_driver_sql(UPDATE_CALLS, (now_text,))
        groups = [
            (key, model, datetime.fromisoformat(quarter + "+00:00"), *rest)
            for key, model, quarter, *rest in conn.exec_driver_sql(ROLLUP_GROUPS)
        ]
        return settled, groups
