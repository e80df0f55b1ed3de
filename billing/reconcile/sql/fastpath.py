"""The SQL text the fast path's statements share on both databases
(``billing.reconcile.sql.postgres_fastpath``, ``billing.reconcile.sql.sqlite_fastpath``; what they
compute: ``billing.reconcile.fastpath``), built once at import.

A template here differs between the dialects only by names, given as ``str.format`` fields that
each dialect's module fills once at import: ``{u}``, the alias of the relation with the usage's
fields as typed columns (``u`` on PostgreSQL, ``g`` on SQLite, where one relation holds them and
the events' aggregates); ``{greatest}``, the function of the largest of its arguments
(``GREATEST``, ``max``; its arguments are never null here); ``{cutoff}``, the parameter of the
settle_after cutoff; ``{calls}``, the condition on ``calls`` that names the step's calls. Every
other relation has the same alias in both: ``g`` the events' aggregates per call, ``c`` the
call's row, ``p`` its price, ``f`` the gathered calls. The fragments hold no literal brace and no
``%`` (PostgreSQL's statement is run with ``%(name)s`` parameters).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from billing.anomalies import USAGE_MISSING
from billing.dimensions import BUCKETS, TOKEN_FIELDS, USAGE_FIELDS, Bucket
from billing.fields import MAX_TOKENS
from billing.ingest.plain import PLAIN_USAGE_FIELDS, V2_USAGE_KEYS
from billing.rates import PART_OF, PLAN_RATE_COLUMNS, RATE_COLUMNS, RATES, Rate
from billing.reconcile.ledger import ENTRY_COLUMNS
from billing.rollups.rows import PICO

#: The ``stream.usage`` fields the statements read (or, ``model``, ignore as the rule does for a
#: call of this shape): a plain usage's (``billing.ingest.plain``). A usage body that carries any
#: other field (the v2 dimensions: one-hour cache writes, a service tier, units, other models,
#: reported anomalies) goes to the rule: ingest flags a plain body in ``events.plain_usage``,
#: and the statements take only the usages flagged plain.
USAGE_READ = PLAIN_USAGE_FIELDS
DECLINED_USAGE_FIELDS = V2_USAGE_KEYS

#: Rates at or above this (micro-USD per million tokens) go to the rule: with token counts at most
#: ``MAX_TOKENS``, four products below 2.15 * 10**18 each cannot overflow a signed 64-bit sum.
RATE_LIMIT = 2**31

#: Template (``{calls}``): per call, the aggregates of its events, for the calls of the common
#: shape only (one attempt, one stream.started, one stream.usage, at most one
#: stream.client_disconnected, the rest stream.tokens); the usage and the disconnect named by
#: their seq.
CALL_AGGREGATES = """SELECT min(request_id) AS request_id,
            max(CASE WHEN type = 'stream.started' THEN occurred_at END) AS started_at,
            max(occurred_at) AS ended_at, max(received_at) AS arrival,
            coalesce(max(output_tokens_delivered), 0) AS progress_delivered,
            coalesce(max(output_tokens_generated), 0) AS progress_generated,
            sum(CASE WHEN type = 'stream.tokens' THEN 1 ELSE 0 END) AS progress_records,
            max(CASE WHEN type = 'stream.usage' THEN seq END) AS usage_seq,
            max(CASE WHEN type = 'stream.client_disconnected' THEN seq END) AS disconnect_seq
        FROM events
        WHERE call_no IN (SELECT call_no FROM calls WHERE {calls})
        GROUP BY call_no
        HAVING min(attempt) = max(attempt)
            AND sum(CASE WHEN type = 'stream.started' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type = 'stream.usage' THEN 1 ELSE 0 END) = 1
            AND sum(CASE WHEN type IN ('stream.tokens', 'stream.client_disconnected') THEN 1
                ELSE 0 END) = count(*) - 2
            AND sum(CASE WHEN type = 'stream.client_disconnected' THEN 1 ELSE 0 END) <= 1"""

#: What follows ``FROM prices p`` to pick the price in force at the call's start (the latest
#: ``effective_from`` at or before it) for a usage that names no served tier: the price without
#: a tier, not its long-context prices (``NOT_LONG_CONTEXT``).
PRICE_IN_FORCE = """WHERE p.model = c.model AND p.service_tier = '' AND p.inference_geo = ''
            AND p.above_input_tokens = 0
            AND p.effective_from <= g.started_at
        ORDER BY p.effective_from DESC LIMIT 1"""

# Template fragments ({u}, {greatest}): the delivered output (the largest of the progress
# records' and the disconnect's), the billed output (the upstream usage's, or for an estimate the
# largest of its count, the generated counters and delivered) and the last arrival of the call.
# A call with no delivered count at all and no disconnect delivered what it generated (v2):
# its delivered output is its billed output.
_SEEN_DELIVERED = """CASE WHEN {u}.disconnect_delivered > g.progress_delivered
            THEN {u}.disconnect_delivered ELSE g.progress_delivered END"""
_BILLED = f"""CASE WHEN {{u}}.source = 'upstream' THEN {{u}}.output_tokens
            ELSE {{greatest}}({{u}}.output_tokens, g.progress_generated,
                coalesce({{u}}.disconnect_generated, 0), {_SEEN_DELIVERED})
        END"""
_DELIVERED = f"""CASE WHEN g.progress_records = 0 AND g.disconnect_seq IS NULL THEN {_BILLED}
            ELSE {_SEEN_DELIVERED} END"""
_ARRIVAL = "{greatest}(g.arrival, c.last_received_at)"
_P_RATES = ",\n        ".join(f"p.{name} AS {name}" for name in RATE_COLUMNS)
#: Template (``{u}``, ``{greatest}``): each token bucket of ``billing.dimensions`` as the
#: statements compute it for a call of the common shape: the three output buckets from the
#: usage and the counters (above), every other bucket from its ``stream.usage`` field, and 0 for
#: a bucket whose field the statements decline (``DECLINED_USAGE_FIELDS``: such a call is the
#: rule's). A bucket that is none of these has no SQL: adding one fails here, at import.
_OUTPUT = {
    "output_tokens_billed": _BILLED,
    "output_tokens_delivered": _DELIVERED,
    "output_tokens_undelivered": f"({_BILLED}) - ({_DELIVERED})",
}


def _bucket_sql(bucket: Bucket) -> str:
    if bucket.name in _OUTPUT:
        return _OUTPUT[bucket.name]
    if bucket.usage in USAGE_READ:
        return f"{{u}}.{bucket.usage}"
    if bucket.usage is not None:
        return "0"
    raise AssertionError(f"the fast path has no SQL for the bucket {bucket.name!r}")


BUCKET_SQL: dict[str, str] = {bucket.name: _bucket_sql(bucket) for bucket in BUCKETS}


def cost_sql(rates: Sequence[Rate] = RATES) -> str:
    """Template (``{u}``, ``{greatest}``): the cost in exact integer picodollars of the rates
    ``rates`` (every rate of ``billing.rates`` in the statements; tests leave one out), as
    ``PriceRow.cost_pusd`` computes it: Σ bucket × its rate (micro-USD per million tokens is
    picodollars per token), less each part of a bucket (``PART_OF``) at its whole's rate. A
    bucket that is 0 in every call of the common shape adds no term."""
    terms = [
        f"({BUCKET_SQL[r.bucket.name]}) * p.{r.column}"
        for r in rates
        if BUCKET_SQL[r.bucket.name] != "0"
    ]
    for part, whole in PART_OF:
        if RATES[part] in rates and BUCKET_SQL[RATES[part].bucket.name] != "0":
            terms.append(f"- ({BUCKET_SQL[RATES[part].bucket.name]}) * p.{RATES[whole].column}")
    return "\n            + ".join(terms).replace("+ -", "-")


_TOKEN_COLUMNS = ",\n        ".join(f"{BUCKET_SQL[name]} AS {name}" for name in TOKEN_FIELDS)

#: Template (``{u}``, ``{greatest}``): a gathered call's columns, in the order of SQLite's
#: ``scratch.reconcile_common`` (``TOKEN_FIELDS`` and ``RATE_COLUMNS`` among them); the cost in
#: exact integer picodollars (micro-USD per million tokens times tokens).
SETTLE_COLUMNS = f"""g.request_id AS request_id, c.api_key_id AS api_key_id, c.model AS model,
        c.protocol AS protocol,
        CASE WHEN g.disconnect_seq IS NULL THEN 'completed' ELSE 'client_disconnected' END
            AS status,
        g.started_at AS started_at, g.ended_at AS ended_at,
        {_ARRIVAL} AS arrival,
        {{u}}.source AS usage_source,
        {_TOKEN_COLUMNS},
        {{u}}.stop_reason AS stop_reason,
        p.id AS price_id,
        {_P_RATES},
        {cost_sql()} AS cost_pusd"""


#: Template (``{u}``): every ``stream.usage`` token count (``USAGE_FIELDS``) in range.
TOKEN_RANGES = "\n        AND ".join(
    f"{{u}}.{name} BETWEEN 0 AND {MAX_TOKENS}" for name in USAGE_FIELDS if name in USAGE_READ
)

#: Template (``{u}``): the progress records' and the disconnect's counters in range.
COUNTER_BOUNDS = f"""g.progress_delivered <= {MAX_TOKENS} AND g.progress_generated <= {MAX_TOKENS}
        AND coalesce({{u}}.disconnect_delivered, 0) <= {MAX_TOKENS}
        AND coalesce({{u}}.disconnect_generated, 0) <= {MAX_TOKENS}"""

#: Template (``{u}``, ``{greatest}``, ``{cutoff}``): the call settles now, with upstream usage
#: (and nothing delivered beyond it: an anomaly, the rule's), or with an estimate whose last event
#: arrived settle_after ago (the cutoff).
SETTLES_NOW = f"""(({{u}}.source = 'upstream' AND {{u}}.output_tokens >= {_SEEN_DELIVERED})
            OR ({{u}}.source = 'estimate' AND {_ARRIVAL} <= {{cutoff}}))"""

#: Template (``{u}``): (v3) not an estimate with an input of 0, which is "not known" when the
#: ``stream.started`` has a count (CONTRACT "Non-streaming calls, hosted-tool fees,
#: provider-reported cost (v3)"): the rule reads the ``stream.started``.
ESTIMATE_INPUT_KNOWN = "({u}.source = 'upstream' OR {u}.input_tokens <> 0)"

#: Every rate of the price below ``RATE_LIMIT``.
RATES_BELOW_LIMIT = "\n        AND ".join(f"p.{name} < {RATE_LIMIT}" for name in RATE_COLUMNS)

#: Template (``{u}``): the price in force has no long-context prices that this call's input
#: (input + cache read + cache creation) exceeds: such a call is the rule's (v2).
NOT_LONG_CONTEXT = """NOT EXISTS (SELECT 1 FROM prices q
            WHERE q.model = p.model AND q.service_tier = p.service_tier
                AND q.inference_geo = p.inference_geo
                AND q.effective_from = p.effective_from AND q.above_input_tokens > 0
                AND q.above_input_tokens < {u}.input_tokens + {u}.cache_read_input_tokens
                    + {u}.cache_creation_input_tokens)"""

#: (v2) The call's key has no assignment (``key_assignments``): a key with a customer or a
#: plan is the rule's (``billing.reconcile.entries.target_lines`` charges it); the statements
#: charge the others their cost, with no customer and no plan. (v3) A key with prepaid credit
#: of its own is settled here too: the step then draws its grants for the calls settled here
#: as for the rule's (``billing.credits.draws.after_step``, in the same transaction).
NO_KEY_ASSIGNMENT = """NOT EXISTS (SELECT 1 FROM key_assignments k
            WHERE k.api_key_id = c.api_key_id)"""

#: (v2) The call's row has none of the v2 figures the statements leave as they are (a served
#: tier, units, other models, a customer, a plan: ``SET_TOKENS_AND_COST`` does not write them, so
#: that the settling ``UPDATE calls`` leaves the partial indexes over them alone). A row that has
#: one was reconciled open by the rule before (with a v2 usage, or a key that had an assignment
#: then): the rule settles it.
NO_V2_FIGURES = """c.service_tier IS NULL AND c.units IS NULL AND c.other_models IS NULL
        AND c.customer_id IS NULL AND c.plan_id IS NULL"""

#: Whether the database holds what ``NOT_LONG_CONTEXT`` and ``NO_KEY_ASSIGNMENT`` look for: a
#: long-context price or a key assignment. A step asks once, in its
#: transaction, and runs the statements without the probes that cannot find anything (index
#: searches a call saved, for a gateway with none). A long-context price or an assignment
#: written meanwhile marks the calls it concerns pending (``mark_model_pending``,
#: ``mark_key_pending``), which waits for the step's row locks: the rule then settles those
#: calls again.
PROBES_NEEDED = """SELECT EXISTS (SELECT 1 FROM prices WHERE above_input_tokens > 0),
    EXISTS (SELECT 1 FROM key_assignments)"""


def settle_conditions(long_context: bool, assignments: bool) -> str:
    """Template (``{u}``, ``{greatest}``, ``{cutoff}``): the conditions on a call of the common
    shape (after its usage's ``ok``, the dialect's) for the fast path to settle it, with the
    probes of ``PROBES_NEEDED``'s answers (``long_context``, ``assignments``)."""
    probes = (NOT_LONG_CONTEXT,) * long_context + (NO_KEY_ASSIGNMENT,) * assignments
    return "\n        AND ".join(
        (
            TOKEN_RANGES,
            COUNTER_BOUNDS,
            SETTLES_NOW,
            ESTIMATE_INPUT_KNOWN,
            RATES_BELOW_LIMIT,
            *probes,
            NO_V2_FIGURES,
        )
    )


#: ``PROBES_NEEDED``'s possible answers.
PROBE_CASES = tuple((lc, ka) for lc in (False, True) for ka in (False, True))

#: The ledger entry's columns, as ``INSERT INTO ledger_entries (…)`` lists them.
ENTRY_COLUMN_LIST = ", ".join(ENTRY_COLUMNS)

#: The entry's values after its reason and booked_at (the parameters), from the gathered call f.
ENTRY_VALUES = ", ".join(
    (
        "f.api_key_id, f.model, f.protocol, f.status, f.started_at",
        *(f"f.{name}" for name in TOKEN_FIELDS),
        "f.price_id",
        *(f"f.{name}" for name in RATE_COLUMNS),
        "f.cost_pusd",
        "NULL, NULL",  # units, unit_prices: such a call has none
        # customer_id, plan_id, plan_price_id, the plan's rates, plan_unit_prices, markup_pct:
        # the key has no assignment (NO_KEY_ASSIGNMENT); its charge is its cost.
        ", ".join(["NULL"] * (3 + len(PLAN_RATE_COLUMNS) + 2)),
        "f.cost_pusd",
        # provider_cost_pusd, failure_charge (bill), leakage_pusd: a plain usage reports no
        # provider cost, and a key without a plan has no failure policy (v3).
        "NULL, NULL, 0",
    )
)

#: The call's buckets, cost and charge as the gathered call f has them (``UPDATE calls SET …``);
#: its served tier, units, other models, customer and plan are null already (``NO_V2_FIGURES``).
SET_TOKENS_AND_COST = ", ".join(
    (
        *(f"{name} = f.{name}" for name in TOKEN_FIELDS),
        "cost_pusd = f.cost_pusd",
        "charge_pusd = f.cost_pusd",
        "leakage_pusd = 0",
    )
)

#: The anomalies of an estimate's call, as JSON text.
USAGE_MISSING_JSON = json.dumps([USAGE_MISSING])

#: A rollup group's sums: the calls, their buckets, their cost as whole dollars and
#: picodollars, and (0021, ``call_status_rollups``) the calls the client disconnected from (the
#: others completed: the fast path settles no failed call).
ROLLUP_SUMS = ", ".join(
    (
        "count(*)",
        *(f"sum({name})" for name in TOKEN_FIELDS),
        f"sum(cost_pusd / {PICO}), sum(cost_pusd - cost_pusd / {PICO} * {PICO})",
        "sum(CASE WHEN status = 'client_disconnected' THEN 1 ELSE 0 END)",
    )
)
