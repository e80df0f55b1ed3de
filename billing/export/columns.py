"""The CSV columns of the finance exports, in their fixed order (CONTRACT "Export").

``usage.csv`` — one row per group of ledger entries booked in ``[since, until)``:

1. the group columns, in the order given by ``group_by`` (default ``day,api_key_id,model``):
   ``api_key_id``, ``model``, (v2) ``customer_id`` (text), ``hour`` (RFC 3339 with the zone's
   offset, ``2026-10-15T08:00:00+02:00``), ``day`` (``YYYY-MM-DD``), ``month`` (``YYYY-MM``),
   the buckets starting where the ``tz`` zone's hours, days and months start;
2. ``calls`` (the number of ``settlement`` entries in the group), then the token totals
   ``input_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``,
   ``output_tokens_billed``, ``output_tokens_delivered``, ``output_tokens_undelivered``,
   ``reasoning_tokens`` (sums of the entries' signed deltas), then ``cost_usd``.

``calls.csv`` — one row per ledger entry booked in ``[since, until)``:

``entry_id``, ``kind`` (``settlement`` | ``adjustment``), ``reason``, ``booked_at`` (RFC 3339,
UTC), ``request_id``, ``api_key_id``, ``model``, ``protocol``, ``status``, the seven token
columns above (signed deltas: an adjustment can be negative), the prices used
``input_usd_per_mtok``, ``output_usd_per_mtok``, ``cache_read_usd_per_mtok``,
``cache_creation_usd_per_mtok`` (USD per million tokens; empty when the entry is unpriced), and
``cost_usd``. Each row's cost recomputes from its own columns::

``?format=v2`` adds, after these, the columns of ``V2_CALLS_ADDED`` / ``V2_USAGE_ADDED``
(the one-hour cache writes and their price, units and unit prices as one canonical JSON cell
each; docs/ARCHITECTURE.md "Usage dimensions (v2)"); a v2 row's cost adds
``(cache_creation_1h_usd_per_mtok − cache_creation_usd_per_mtok) × cache_creation_1h_input_tokens
/ 1,000,000`` and each unit's count × its unit price.

    cost_usd = (input_tokens × input_usd_per_mtok
                + cache_read_input_tokens × cache_read_usd_per_mtok
                + cache_creation_input_tokens × cache_creation_usd_per_mtok
                + output_tokens_billed × output_usd_per_mtok) / 1,000,000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from billing.calllog.buckets import TIME_DIMS
from billing.dimensions import V1_TOKEN_FIELDS, V2_TOKEN_FIELDS
from billing.rates import RATES, V1_RATES, V2_RATES

#: The token buckets of the v1 columns, in the contract's usage-totals order.
TOKEN_COLUMNS: Final[tuple[str, ...]] = tuple(V1_TOKEN_FIELDS)

#: The names ``group_by`` accepts; time buckets (as ``GET /v1/usage``) and text keys.
TIME_KEYS: Final[tuple[str, ...]] = TIME_DIMS
TEXT_KEYS: Final[tuple[str, ...]] = ("api_key_id", "model", "customer_id")
GROUP_KEYS: Final[tuple[str, ...]] = (*TEXT_KEYS, *TIME_KEYS)
DEFAULT_GROUP_BY: Final[tuple[str, ...]] = ("day", "api_key_id", "model")

#: The columns after the group columns in ``usage.csv``.
USAGE_TOTAL_COLUMNS: Final[tuple[str, ...]] = ("calls", *TOKEN_COLUMNS, "cost_usd")

#: The prices used, per entry, as in ``GET /v1/calls/{request_id}`` ``ledger_entries``.
PRICE_COLUMNS: Final[tuple[str, ...]] = tuple(r.field for r in V1_RATES)

#: Every column of ``calls.csv``, in order.
CALLS_COLUMNS: Final[tuple[str, ...]] = (
    "entry_id",
    "kind",
    "reason",
    "booked_at",
    "request_id",
    "api_key_id",
    "model",
    "protocol",
    "status",
    *TOKEN_COLUMNS,
    *PRICE_COLUMNS,
    "cost_usd",
)


#: The export formats: ``v1`` (the default; its columns never change) and ``v2`` (CONTRACT
#: "Keys, customers and plans (v2)", "Usage dimensions (v2)").
Format = Literal["v1", "v2", "v3"]
FORMATS: Final[tuple[Format, ...]] = ("v1", "v2", "v3")

#: How a v2 column's cell is made from its ledger value: ``count`` an integer (summed in
#: usage.csv), ``units`` the units JSON (name → count; merged by name in usage.csv), ``price``
#: micro-USD per million tokens as USD, ``unit_prices`` the unit prices JSON in USD per unit;
#: (v2, issue #24) ``money`` picodollars as USD (summed in usage.csv, empty when every entry's
#: is), ``text`` a text cell as stored (neutralised).
CellKind = Literal["count", "units", "price", "unit_prices", "money", "text"]


@dataclass(frozen=True, slots=True)
class V2Column:
    """A column the v2 format adds: its CSV ``name``, the ``ledger_entries`` column it is read
    from (``source``) and how its cell is made (``kind``)."""

    name: str
    source: str
    kind: CellKind


#: The columns ``?format=v2`` adds after ``cost_usd``, in order (CONTRACT: "adds, after
#: ``cost_usd``, ``charge_usd``, … the v2 token and unit columns"): first the charge (in
#: calls.csv with the plan's prices, ``markup_pct``, the customer and the plan); usage.csv's
#: ``customer_id``, ``plan_id`` go before the totals (``V2_USAGE_GROUPS``, ``usage_columns``).
V2_CALLS_ADDED: Final[tuple[V2Column, ...]] = (
    # The charge (CONTRACT "Keys, customers and plans (v2)"), recomputable from the row: at the
    # plan's prices when they are given (tokens × plan_*_usd_per_mtok / 1,000,000 + units ×
    # plan_unit_prices, one-hour writes as for the cost), else cost_usd × (1 + markup_pct /
    # 100) when markup_pct is given, else cost_usd.
    V2Column("charge_usd", "charge_pusd", "money"),
    *(V2Column(f"plan_{rate.field}", f"plan_{rate.column}", "price") for rate in RATES),
    V2Column("plan_unit_prices", "plan_unit_prices", "unit_prices"),
    V2Column("markup_pct", "markup_pct", "text"),
    V2Column("customer_id", "customer_id", "text"),
    V2Column("plan_id", "plan_id", "text"),
    *(V2Column(name, name, "count") for name in V2_TOKEN_FIELDS),
    V2Column("units", "units", "units"),
    *(V2Column(rate.field, rate.column, "price") for rate in V2_RATES),
    V2Column("unit_prices", "unit_prices", "unit_prices"),
)
V2_USAGE_ADDED: Final[tuple[V2Column, ...]] = (
    V2Column("charge_usd", "charge_pusd", "money"),
    *(V2Column(name, name, "count") for name in V2_TOKEN_FIELDS),
    V2Column("units", "units", "units"),
)


#: The ledger columns a v2 ``usage.csv`` groups by as well, written before the totals
#: (CONTRACT "Keys, customers and plans (v2)": "before the totals ``customer_id``,
#: ``plan_id``"); empty cells for entries without.
V2_USAGE_GROUPS: Final[tuple[str, ...]] = ("customer_id", "plan_id")


#: (v3) The columns ``?format=v3`` adds after v2's, whose order a release has fixed (CONTRACT
#: "Keys, customers and plans (v2)"): the failure policy an entry was charged under (so that its
#: charge can still be recomputed from its own columns: ``void`` charges 0, ``bill_delivered``
#: charges the output billed less the undelivered), the cost it left uncharged and the
#: provider's own cost (CONTRACT "Charge policy for failed calls (v3)", "Non-streaming calls,
#: hosted-tool fees, provider-reported cost (v3)").
V3_USAGE_ADDED: Final[tuple[V2Column, ...]] = (
    V2Column("leakage_usd", "leakage_pusd", "money"),
    V2Column("provider_cost_usd", "provider_cost_pusd", "money"),
)
V3_CALLS_ADDED: Final[tuple[V2Column, ...]] = (
    V2Column("failure_charge", "failure_charge", "text"),
    *V3_USAGE_ADDED,
)


def calls_added(format: Format) -> tuple[V2Column, ...]:
    """The columns ``format`` adds to ``calls.csv`` after v1's."""
    if format == "v1":
        return ()
    return (*V2_CALLS_ADDED, *(V3_CALLS_ADDED if format == "v3" else ()))


def usage_added(format: Format) -> tuple[V2Column, ...]:
    """The columns ``format`` adds to ``usage.csv`` after the totals."""
    if format == "v1":
        return ()
    return (*V2_USAGE_ADDED, *(V3_USAGE_ADDED if format == "v3" else ()))


def calls_columns(format: Format = "v1") -> tuple[str, ...]:
    """The header of ``calls.csv`` in ``format``."""
    return (*CALLS_COLUMNS, *(c.name for c in calls_added(format)))


def usage_columns(group_by: tuple[str, ...], format: Format = "v1") -> tuple[str, ...]:
    """The header of ``usage.csv`` for ``group_by`` in ``format``: group columns, then the
    totals (then, in v2, ``V2_USAGE_ADDED``)."""
    if format == "v1":
        return (*group_by, *USAGE_TOTAL_COLUMNS)
    return (
        *group_by,
        *v2_groups(group_by),
        *USAGE_TOTAL_COLUMNS,
        *(c.name for c in usage_added(format)),
    )


def v2_groups(group_by: tuple[str, ...]) -> tuple[str, ...]:
    """The ``V2_USAGE_GROUPS`` a v2 ``usage.csv`` adds after ``group_by`` (those not in it)."""
    return tuple(name for name in V2_USAGE_GROUPS if name not in group_by)
