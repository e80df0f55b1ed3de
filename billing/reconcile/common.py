"""The common call settled by the database: the billing rule's result for its most frequent shape.

Most calls are one attempt: one ``stream.started``, progress records (``stream.tokens``),
perhaps one ``stream.client_disconnected``, and one ``stream.usage`` (the provider's,
``source: upstream``, or the gateway's ``estimate`` when the provider sent none); nothing else,
not settled before, on a priced model. For such a call the rule (``billing.reconcile.rule``,
CONTRACT "Reconciliation" and "Cost") comes down to a few columns:

- input, cache read, cache creation and reasoning tokens = the usage's (0 when absent);
  delivered = the largest ``output_tokens_delivered`` of the progress records and the disconnect
  (0 without any); billed output = the upstream usage's ``output_tokens``, or for an estimate
  the largest of its ``output_tokens``, the ``output_tokens_generated`` counters and delivered;
  undelivered = billed − delivered;
- status ``client_disconnected`` with a disconnect, else ``completed``; usage source = the
  usage's; stop reason = the usage's; no error; anomalies none for upstream usage (a call whose
  delivered exceeds its upstream billed count has one, and is left to the rule), and
  ``usage_missing`` for an estimate;
- it settles now when the usage is upstream (``stream.started`` arrived and every attempt has
  upstream usage), and an estimate's call once its last event arrived ``settle_after`` ago; one
  ``settlement`` ledger entry at the price in force at the call's start (the latest
  ``effective_from`` at or before it), cost = Σ tokens × rate in exact integer picodollars;
- started at the ``stream.started``'s ``occurred_at``, ended at the latest ``occurred_at`` of its
  events; key, model, protocol and metadata from that ``stream.started``, as ingest wrote them on
  the ``calls`` row from the validated event (checked: the row's start must be the event's). Its
  body is not read again: a hand edit of a stored ``stream.started`` body is not seen here (the
  rule reads the body), as a ``stream.tokens`` body is not since migration 0005.

``settle_common`` books the calls of a step that have this shape and settle now with a few
set-based statements (no event crosses into Python); the reconciler
(``billing.reconcile.service``) then gives every other call to the rule. Anything outside the
shape goes to the rule: several attempts, a failure, two usages, two ``stream.started`` or two
disconnects, an unpriced model, a rate of 2,147 USD per million tokens or more (the products
could overflow 64 bits), a call settled before, a progress record stored before migration 0005,
an estimate's call that is not due yet (it is reconciled open), a usage or disconnect body that
is not what ingest writes (not JSON, a value of another type, a count out of range, a JSON
``null`` in the usage) — where the rule decides (and refuses what it refuses) — and every call
with SQLite older than 3.33 (no ``UPDATE … FROM``). ``tests/test_reconcile_common.py``
settles the same random calls both ways and requires the same rows.

Why: the rule's path costs ≈ 80-150 µs of CPU per call on a 2-core machine (reading bodies, the
rule, building rows in Python); a call settled here costs ≈ 45 µs in all on SQLite and ≈ 85 µs on
PostgreSQL (nearly all of it the server's), which is what the reconcile target (≥ 20,000 calls/s
on 2 cores, issue #8) needs; bench/README.md has the figures.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import literal_column
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.ingest.schemas import MAX_TOKENS
from billing.reconcile.ledger import (
    ENTRY_COLUMNS,
    RATE_COLUMNS,
    SETTLED_COMPLETE,
    settled_timed_out,
)
from billing.reconcile.rule import USAGE_MISSING
from billing.rollups.buckets import QUARTER
from billing.rollups.repository import BOOKED, CALL_START, PICO
from billing.rollups.service import Deltas, Placed, Totals
from billing.storage.store import store_for
from billing.storage.types import sqlite_text

#: Rates at or above this (micro-USD per million tokens) go to the rule: with token counts at most
#: ``MAX_TOKENS`` (10**9, as ingest accepts; a larger one in a hand-edited body goes to the rule
#: too), four products below 2.15 * 10**18 each cannot overflow a signed 64-bit sum.
_RATE_LIMIT = 2**31

#: The usage fields read from its body: required ones, then those that default to 0.
_USAGE_REQUIRED = ("input_tokens", "output_tokens")
_USAGE_OPTIONAL = ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")


def _shape(in_list: str) -> str:
    """Per call, the aggregates of its events, for the calls of the common shape only;
    ``in_list`` is the dialect's ``IN (…)`` / ``= ANY(…)`` for the step's calls. The usage and
    the disconnect are named by their ``seq`` (their bodies are read once, by key, not carried
    through the grouping). A call's events are found by its number (``events(call_no, seq)``)."""
    return (
        "SELECT min(request_id) AS request_id, "
        "max(CASE WHEN type = 'stream.started' THEN occurred_at END) AS started_at, "
        "max(occurred_at) AS ended_at, max(received_at) AS arrival, "
        "coalesce(max(output_tokens_delivered), 0) AS progress_delivered, "
        "coalesce(max(output_tokens_generated), 0) AS progress_generated, "
        "max(CASE WHEN type = 'stream.usage' THEN seq END) AS usage_seq, "
        "max(CASE WHEN type = 'stream.client_disconnected' THEN seq END) AS disconnect_seq "
        f"FROM events WHERE call_no IN (SELECT call_no FROM calls WHERE request_id {in_list}) "
        "GROUP BY call_no "
        "HAVING min(attempt) = max(attempt) "
        "AND sum(CASE WHEN type = 'stream.started' THEN 1 ELSE 0 END) = 1 "
        "AND sum(CASE WHEN type = 'stream.usage' THEN 1 ELSE 0 END) = 1 "
        "AND sum(CASE WHEN type = 'stream.tokens' AND output_tokens_delivered IS NOT NULL "
        "AND output_tokens_generated IS NOT NULL THEN 1 "
        "WHEN type = 'stream.client_disconnected' THEN 1 ELSE 0 END) = count(*) - 2 "
        "AND sum(CASE WHEN type = 'stream.client_disconnected' THEN 1 ELSE 0 END) <= 1"
    )


# The usage (u) and the disconnect (d) as typed columns, with ``ok`` false for any value the
# rule would not take as ingest writes it. A JSON null anywhere in the usage body sends the call
# to the rule (ingest's bodies are compact JSON, so a null is written ``:null``).
_SQLITE_BODIES = (
    "SELECT s.*, json_extract(u.body, '$.source') AS source, "
    + ", ".join(f"json_extract(u.body, '$.{name}') AS {name}" for name in _USAGE_REQUIRED)
    + ", "
    + ", ".join(
        f"coalesce(json_extract(u.body, '$.{name}'), 0) AS {name}" for name in _USAGE_OPTIONAL
    )
    + ", json_extract(u.body, '$.stop_reason') AS stop_reason, "
    "json_extract(d.body, '$.output_tokens_delivered') AS disconnect_delivered, "
    "coalesce(json_extract(d.body, '$.output_tokens_generated'), 0) AS disconnect_generated, "
    "(u.body NOT LIKE '%:null%' AND "
    + " AND ".join(
        f"typeof(json_extract(u.body, '$.{name}')) = 'integer'" for name in _USAGE_REQUIRED
    )
    + " AND "
    + " AND ".join(
        f"typeof(coalesce(json_extract(u.body, '$.{name}'), 0)) = 'integer'"
        for name in _USAGE_OPTIONAL
    )
    + " AND typeof(coalesce(json_extract(u.body, '$.stop_reason'), '')) = 'text' "
    "AND (s.disconnect_seq IS NULL OR (d.seq IS NOT NULL "
    "AND typeof(json_extract(d.body, '$.output_tokens_delivered')) = 'integer' "
    "AND typeof(coalesce(json_extract(d.body, '$.output_tokens_generated'), 0)) = 'integer'))"
    ") AS ok FROM ({shape}) AS s JOIN events u ON u.seq = s.usage_seq AND json_valid(u.body) "
    "LEFT JOIN events d ON d.seq = s.disconnect_seq AND json_valid(d.body)"
)


def _pg_number(column: str, default: str | None) -> str:
    absent = f"WHEN {column} IS NULL THEN {default} " if default is not None else ""
    return f"CASE {absent}WHEN json_typeof({column}) = 'number' THEN ({column}::text)::bigint END"


_PG_BODIES = (
    "json_to_record(ue.body::json) AS uj(source text, "
    + ", ".join(f"{name} json" for name in (*_USAGE_REQUIRED, *_USAGE_OPTIONAL))
    + ", stop_reason json) "
    "LEFT JOIN events de ON de.seq = g.disconnect_seq "
    "LEFT JOIN LATERAL json_to_record(de.body::json) AS dj(output_tokens_delivered json, "
    "output_tokens_generated json) ON true "
    "CROSS JOIN LATERAL (SELECT uj.source AS source, "
    + ", ".join(f"{_pg_number('uj.' + name, None)} AS {name}" for name in _USAGE_REQUIRED)
    + ", "
    + ", ".join(f"{_pg_number('uj.' + name, '0')} AS {name}" for name in _USAGE_OPTIONAL)
    + ", uj.stop_reason #>> '{}' AS stop_reason, "
    f"{_pg_number('dj.output_tokens_delivered', None)} AS disconnect_delivered, "
    f"{_pg_number('dj.output_tokens_generated', '0')} AS disconnect_generated, "
    "(ue.body NOT LIKE '%%:null%%' AND "
    + " AND ".join(f"json_typeof(uj.{name}) = 'number'" for name in _USAGE_REQUIRED)
    + " AND "
    + " AND ".join(
        f"coalesce(json_typeof(uj.{name}), 'number') = 'number'" for name in _USAGE_OPTIONAL
    )
    + " AND coalesce(json_typeof(uj.stop_reason), 'string') = 'string' AND (g.disconnect_seq "
    "IS NULL OR (json_typeof(dj.output_tokens_delivered) = 'number' AND "
    "coalesce(json_typeof(dj.output_tokens_generated), 'number') = 'number'))) AS ok) AS u"
)

# The price in force at the call's start for its model: the latest effective_from at or before
# (SQLite: its id, a scalar subquery; PostgreSQL: the row, a LATERAL subquery run once per call).
_PRICE_IN_FORCE = (
    "FROM prices p WHERE p.model = c.model AND p.effective_from <= g.started_at "
    "ORDER BY p.effective_from DESC LIMIT 1"
)

# {u}: where the usage columns are (PostgreSQL: u; SQLite: the same row as the aggregates, g).
_DELIVERED = (
    "CASE WHEN {u}.disconnect_delivered > g.progress_delivered THEN {u}.disconnect_delivered "
    "ELSE g.progress_delivered END"
)
# Billed output: the upstream count; for an estimate the largest of it, the counters and delivered.
_BILLED = (
    "CASE WHEN {u}.source = 'upstream' THEN {u}.output_tokens ELSE {greatest}({u}.output_tokens, "
    f"g.progress_generated, coalesce({{u}}.disconnect_generated, 0), {_DELIVERED}) END"
)
_ARRIVAL = "{greatest}(g.arrival, c.last_received_at)"
# The call settles now: upstream usage (and nothing delivered beyond it: an anomaly, the rule's),
# or an estimate whose last event arrived settle_after ago ({cutoff}).
_CONDITIONS = (
    "c.settled = {false} AND c.api_key_id IS NOT NULL AND c.model IS NOT NULL "
    "AND c.started_at = g.started_at AND {u}.ok AND "
    + " AND ".join(
        f"{{u}}.{name} BETWEEN 0 AND {MAX_TOKENS}" for name in (*_USAGE_REQUIRED, *_USAGE_OPTIONAL)
    )
    + f" AND g.progress_delivered <= {MAX_TOKENS} AND g.progress_generated <= {MAX_TOKENS} "
    f"AND coalesce({{u}}.disconnect_delivered, 0) <= {MAX_TOKENS} "
    f"AND coalesce({{u}}.disconnect_generated, 0) <= {MAX_TOKENS} "
    f"AND (({{u}}.source = 'upstream' AND {{u}}.output_tokens >= {_DELIVERED}) OR "
    f"({{u}}.source = 'estimate' AND {_ARRIVAL} <= {{cutoff}})) AND "
    + " AND ".join(f"p.{rate} < {_RATE_LIMIT}" for rate in RATE_COLUMNS)
)
_COST = (
    "{u}.input_tokens * p.input_uusd_per_mtok "
    "+ {u}.cache_read_input_tokens * p.cache_read_uusd_per_mtok "
    "+ {u}.cache_creation_input_tokens * p.cache_creation_uusd_per_mtok "
    f"+ ({_BILLED}) * p.output_uusd_per_mtok"
)

#: The columns of the common calls' working set (SQLite: a table in the connection's in-memory
#: ``scratch`` database, see ``billing.storage.db``; PostgreSQL: a CTE).
_COMMON_SELECT = (
    "g.request_id AS request_id, c.api_key_id AS api_key_id, "
    "c.model AS model, c.protocol AS protocol, "
    "CASE WHEN g.disconnect_seq IS NULL THEN 'completed' ELSE 'client_disconnected' END "
    f"AS status, g.started_at AS started_at, g.ended_at AS ended_at, {_ARRIVAL} AS arrival, "
    "{u}.source AS usage_source, "
    "{u}.input_tokens AS input_tokens, {u}.cache_read_input_tokens AS cache_read_input_tokens, "
    "{u}.cache_creation_input_tokens AS cache_creation_input_tokens, "
    f"{_BILLED} AS output_tokens_billed, {_DELIVERED} AS output_tokens_delivered, "
    f"({_BILLED}) - ({_DELIVERED}) AS output_tokens_undelivered, "
    "{u}.reasoning_tokens AS reasoning_tokens, {u}.stop_reason AS stop_reason, "
    "p.id AS price_id, "
    + ", ".join(f"p.{rate} AS {rate}" for rate in RATE_COLUMNS)
    + f", {_COST} AS cost_pusd"
)

_LEDGER_COLUMNS = ", ".join(ENTRY_COLUMNS)
_LEDGER_VALUES = (
    "f.request_id, 1, 'settlement', CASE WHEN f.usage_source = 'upstream' THEN {complete} "
    "ELSE {timed_out} END, {now}, f.api_key_id, f.model, f.protocol, "
    f"f.status, f.started_at, {', '.join('f.' + t for t in TOKEN_FIELDS)}, f.price_id, "
    f"{', '.join('f.' + r for r in RATE_COLUMNS)}, f.cost_pusd"
)
# A call's metadata as the rule gives it: none for an absent or empty object (ingest wrote the
# stream.started's as JSON text, ``null`` or ``{}`` included).
_CALL_SET = (
    "metadata = CASE WHEN {metadata_text} IN ('null', '{{}}') THEN NULL ELSE calls.metadata END, "
    "ended_at = f.ended_at, status = f.status, settled = {true}, "
    "settled_at = COALESCE(calls.settled_at, {now}), usage_source = f.usage_source, "
    "attempts = 1, "
    + ", ".join(f"{t} = f.{t}" for t in TOKEN_FIELDS)
    + ", cost_pusd = f.cost_pusd, anomalies = CASE WHEN f.usage_source = 'upstream' "
    "THEN {no_anomaly} ELSE {usage_missing} END, error_type = NULL, "
    "stop_reason = f.stop_reason, last_received_at = f.arrival, pending = {false}"
)
# Rollups: the calls' contributions summed per key, model and 15-minute bucket of their start. The
# cost is summed as whole dollars and picodollars (each call's cost < 2**63 picodollars; their
# sum may not be: SQLite's sum() raises on an overflow).
_ROLLUP_SUMS = (
    "count(*), "
    + ", ".join(f"sum({t})" for t in TOKEN_FIELDS)
    + f", sum(cost_pusd / {PICO}), sum(cost_pusd - cost_pusd / {PICO} * {PICO})"
)


def settle_common(
    session: Session,
    request_ids: Sequence[str],
    now: datetime,
    settle_after_s: float,
    deltas: Deltas,
) -> list[str]:
    """Settle, inside the caller's transaction, those of the (locked) ``request_ids`` that have
    the common shape (see the module docstring) and settle now: their ``calls`` row and
    settlement ledger entry are written by the database (a call of one attempt has no
    ``call_attempts`` row, see ``CallAttempt``), and their rollup contributions (both bases) are
    added to ``deltas`` for the step to write. Returns the calls settled (in no particular
    order); the others are untouched, for the rule. ``now`` (aware UTC) is the step's clock
    (``booked_at``, ``settled_at``); a call with an estimate settles once its last event arrived
    ``settle_after_s`` seconds before ``now`` or earlier. Raises the driver's error for a body
    PostgreSQL cannot read as JSON (as the rule raises for it: the caller's step fails)."""
    if not request_ids:
        return []
    conn = session.connection()
    cutoff = now - timedelta(seconds=settle_after_s)
    reasons = (SETTLED_COMPLETE, settled_timed_out(settle_after_s))
    if conn.dialect.name == "postgresql":
        settled, groups = _settle_postgres(conn, request_ids, now, cutoff, reasons)
    else:
        settled, groups = _settle_sqlite(conn, request_ids, now, cutoff, reasons)
    for api_key_id, model, quarter, calls, *sums in groups:
        if isinstance(quarter, str):  # SQLite: naive UTC text
            quarter = datetime.fromisoformat(quarter + "+00:00")
        elif quarter.tzinfo is not UTC:
            quarter = quarter.astimezone(UTC)
        *tokens, whole_usd, pico = (int(value) for value in sums)
        totals = Totals([calls, calls, *tokens, 0], whole_usd * PICO + pico)
        deltas.add(CALL_START, Placed(quarter, api_key_id, model, totals))
        deltas.add(BOOKED, Placed(now, api_key_id, model, totals))
    return settled


#: Calls per statement on SQLite (one parameter each; SQLite takes up to 32,766).
_CHUNK = 4000

_SQLITE_TABLE = (
    "CREATE TABLE IF NOT EXISTS scratch.reconcile_common (request_id TEXT PRIMARY KEY, "
    "api_key_id, model, protocol, status, started_at, ended_at, arrival, usage_source, "
    f"{', '.join(TOKEN_FIELDS)}, stop_reason, price_id, {', '.join(RATE_COLUMNS)}, cost_pusd, "
    "call_rowid INTEGER)"
)


def _quarter(conn: Any) -> str:
    """SQL for the 15-minute bucket of ``started_at`` (``rollups.floor_sql``, as text)."""
    expression = store_for(conn).rollups.floor_sql(QUARTER, literal_column("started_at"))
    return str(expression.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))


_USAGE_MISSING = json.dumps([USAGE_MISSING])


#: ``UPDATE … FROM`` needs SQLite 3.33 (2020); with an older library every call goes to the rule.
SQLITE_SUPPORTED = sqlite3.sqlite_version_info >= (3, 33, 0)


def _settle_sqlite(
    conn: Any,
    request_ids: Sequence[str],
    now: datetime,
    cutoff: datetime,
    reasons: tuple[str, str],
) -> tuple[list[str], list[Any]]:
    if not SQLITE_SUPPORTED:
        return [], []
    now_text = sqlite_text(now)
    conn.exec_driver_sql(_SQLITE_TABLE)
    conn.exec_driver_sql("DELETE FROM scratch.reconcile_common")
    select = _COMMON_SELECT.format(greatest="max", u="g")
    conditions = _CONDITIONS.format(false=0, u="g", greatest="max", cutoff="?")
    for start in range(0, len(request_ids), _CHUNK):
        chunk = tuple(request_ids[start : start + _CHUNK])
        shape = _shape(f"IN ({', '.join('?' * len(chunk))})")
        conn.exec_driver_sql(
            f"INSERT INTO scratch.reconcile_common SELECT {select}, c.rowid "
            f"FROM ({_SQLITE_BODIES.format(shape=shape)}) AS g JOIN calls c "
            "ON c.request_id = g.request_id "
            f"JOIN prices p ON p.id = (SELECT p.id {_PRICE_IN_FORCE}) WHERE {conditions}",
            (*chunk, sqlite_text(cutoff)),
        )
    settled = list(
        conn.exec_driver_sql("SELECT request_id FROM scratch.reconcile_common").scalars()
    )
    if not settled:
        return [], []
    values = _LEDGER_VALUES.format(complete="?", timed_out="?", now="?")
    conn.exec_driver_sql(
        f"INSERT INTO ledger_entries ({_LEDGER_COLUMNS}) "
        f"SELECT {values} FROM scratch.reconcile_common f ORDER BY f.request_id",
        (*reasons, now_text),
    )
    sets = _CALL_SET.format(
        metadata_text="calls.metadata",
        true=1,
        false=0,
        now="?",
        no_anomaly="'[]'",
        usage_missing=f"'{_USAGE_MISSING}'",
    )
    # The IN (…) makes SQLite look the calls up by key (their rowid, kept from the join above:
    # no second search of the request_id index); with the join alone it scans calls.
    conn.exec_driver_sql(
        f"UPDATE calls SET {sets} FROM scratch.reconcile_common f "
        "WHERE calls.rowid = f.call_rowid "
        "AND calls.rowid IN (SELECT call_rowid FROM scratch.reconcile_common)",
        (now_text,),
    )
    groups = conn.exec_driver_sql(
        f"SELECT api_key_id, model, {_quarter(conn)} AS quarter, {_ROLLUP_SUMS} "
        "FROM scratch.reconcile_common GROUP BY api_key_id, model, quarter"
    ).all()
    return settled, list(groups)


def _settle_postgres(
    conn: Any,
    request_ids: Sequence[str],
    now: datetime,
    cutoff: datetime,
    reasons: tuple[str, str],
) -> tuple[list[str], list[Any]]:
    shape = _shape("= ANY(%(ids)s::varchar[])")
    select = _COMMON_SELECT.format(greatest="GREATEST", u="u")
    conditions = _CONDITIONS.format(false="false", u="u", greatest="GREATEST", cutoff="%(cutoff)s")
    common = (
        f"SELECT {select} FROM ({shape}) AS g JOIN events ue ON ue.seq = g.usage_seq "
        f"CROSS JOIN LATERAL {_PG_BODIES} "
        "JOIN calls c ON c.request_id = g.request_id "
        f"CROSS JOIN LATERAL (SELECT * {_PRICE_IN_FORCE}) AS p WHERE {conditions}"
    )
    sets = _CALL_SET.format(
        metadata_text="calls.metadata::text",
        true="true",
        false="false",
        now="%(now)s",
        no_anomaly="'[]'::json",
        usage_missing=f"'{_USAGE_MISSING}'::json",
    )
    values = _LEDGER_VALUES.format(
        complete="%(complete)s", timed_out="%(timed_out)s", now="%(now)s"
    )
    quarter = _quarter(conn)
    # Room to group the step's events in a hash table (with the default 4 MB PostgreSQL sorts
    # them first: ≈ 6 µs a call more); for this transaction only.
    conn.exec_driver_sql("SET LOCAL work_mem = '32MB'")
    # One statement: every write reads the same working set f (data-modifying CTEs); ledger
    # entries in code-point order of request_id (a step's entries: these first, then the rule's).
    rows = conn.exec_driver_sql(
        f"WITH f AS MATERIALIZED ({common}), "
        f"ledger AS (INSERT INTO ledger_entries ({_LEDGER_COLUMNS}) SELECT {values} FROM f "
        'ORDER BY f.request_id COLLATE "C"), '
        f"updated AS (UPDATE calls SET {sets} FROM f WHERE calls.request_id = f.request_id) "
        f"SELECT api_key_id, model, {quarter} AS quarter, {_ROLLUP_SUMS}, "
        "array_agg(request_id) FROM f GROUP BY api_key_id, model, quarter",
        {
            "ids": list(request_ids),
            "now": now,
            "cutoff": cutoff,
            "complete": reasons[0],
            "timed_out": reasons[1],
        },
    ).all()
    settled: list[str] = []
    groups = []
    for *group, members in rows:
        settled.extend(members)
        groups.append(group)
    return settled, groups
