"""Turning a call's target figures into ledger entries: settle once, then adjust by differences.

Source: CONTRACT "Reconciliation". Entries are only ever added. A call's booked figures are the
sum of its entries per *line* (api key, model, price); the next entries are the difference between
the target lines and what is booked: an adjustment when a line's tokens change; a reversal of the
old line plus a new settlement when the key or model changed; a reversal plus a re-post at the new
rates when the price changed (for example a model that was priced after it was settled).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple

from billing.dimensions import TOKEN_FIELDS, Tokens
from billing.money import MAX_PUSD, pusd_to_str
from billing.plans.charges import policy_charge, priced_pusd
from billing.pricing.prices import PriceRow
from billing.rates import PLAN_RATE_COLUMNS, RATE_COLUMNS


class LineKey(NamedTuple):
    """What a ledger line is booked under: the key, the model and the price id (None: unpriced);
    (v2) the customer and plan it is charged to, the plan price id or else the markup text it is
    charged at (CONTRACT "Keys, customers and plans (v2)"): a change of any of them re-books the
    line (a reversal and a re-rated line), so that every entry's charge follows from its own
    columns."""

    api_key_id: str | None
    model: str | None
    price_id: int | None
    customer_id: str | None = None
    plan_id: str | None = None
    plan_price_id: int | None = None
    markup_pct: str | None = None
    #: (v3) The plan's charge policy for a failed call the line is charged under
    #: (``bill_delivered`` or ``void``; None: ``bill``), CONTRACT "Charge policy for failed
    #: calls (v3)".
    failure_charge: str | None = None

    def sort_key(self) -> tuple[str, str, int, str, str, int, str, str]:
        return (
            self.api_key_id or "",
            self.model or "",
            self.price_id or 0,
            self.customer_id or "",
            self.plan_id or "",
            self.plan_price_id or 0,
            self.markup_pct or "",
            self.failure_charge or "",
        )


@dataclass(slots=True)
class Line:
    """Target tokens and units (name → count) of one line and the price that applies to it
    (None: unpriced)."""

    key: LineKey
    tokens: Tokens
    price: PriceRow | None
    units: dict[str, int] = field(default_factory=dict)
    #: (v2) The plan's own price the line is charged at (``key.plan_price_id``), else None.
    plan_price: PriceRow | None = None
    #: (v3) The cost the provider reported itself for the line's attempts, in picodollars
    #: (None: none reported).
    provider_cost_pusd: int | None = None


@dataclass(slots=True)
class NewEntry:
    """A ledger entry to write: ``kind`` settlement|adjustment, signed token deltas, its price;
    (v2) the plan price it is charged at and its charge in picodollars."""

    kind: str
    reason: str
    key: LineKey
    tokens: Tokens
    price: PriceRow | None
    cost_pusd: int | None
    units: dict[str, int] = field(default_factory=dict)
    plan_price: PriceRow | None = None
    charge_pusd: int | None = None
    #: (v3) The cost the failure policy left uncharged, and the provider's own cost (deltas).
    leakage_pusd: int | None = None
    provider_cost_pusd: int | None = None


def line_cost(
    tokens: Tokens, price: PriceRow | None, units: Mapping[str, int] | None = None
) -> int | None:
    """The exact cost in picodollars of ``tokens`` and ``units`` at ``price``; None when
    unpriced (no price, a unit of non-zero count without a price, or a cost beyond
    ``MAX_PUSD``, which no entry can hold)."""
    if price is None:
        return None
    cost = priced_pusd(tokens, units, price)
    return cost if cost is not None and -MAX_PUSD <= cost <= MAX_PUSD else None


def _provider_cost_delta(now: int | None, was: int | None) -> int | None:
    """The provider's own cost to book: ``now − was``, None when neither was reported."""
    if now is None and was is None:
        return None
    return (now or 0) - (was or 0)


def _units_delta(now: Mapping[str, int], was: Mapping[str, int]) -> dict[str, int]:
    """``now − was`` per unit, without the zeros, sorted by name."""
    delta = {n: now.get(n, 0) - was.get(n, 0) for n in {*now, *was}}
    return {n: d for n, d in sorted(delta.items()) if d}


def _describe(delta: Tokens) -> str:
    changes = [
        f"{name} {value:+d}"
        for name, value in delta.as_dict().items()
        if value and name in TOKEN_FIELDS
    ]
    return ", ".join(changes)


#: The longest reason the ledger stores (``ledger_entries.reason`` is a VARCHAR(200)).
MAX_REASON = 200


def _late(
    delta: Tokens, units: Mapping[str, int] | None = None, provider_cost: int | None = None
) -> str:
    # With every bucket changed by large amounts the text would not fit; the entry's own columns
    # hold the exact deltas, so the reason may be cut.
    changes = ", ".join(
        part
        for part in (_describe(delta), *(f"{n} {c:+d}" for n, c in (units or {}).items()))
        if part
    )
    # (v3) A later usage may change only the provider's own cost of the line.
    cost = (
        f"provider_cost_usd {'-' if provider_cost < 0 else '+'}{pusd_to_str(abs(provider_cost))}"
        if provider_cost
        else ""
    )
    if not changes and cost:
        return f"late events changed the provider-reported cost: {cost}"
    if not changes:
        return "late events added a line with no tokens yet"
    reason = f"late events changed the usage: {changes}" + (f", {cost}" if cost else "")
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"


#: The reason of a settlement when every attempt has upstream usage (CONTRACT "Reconciliation").
SETTLED_COMPLETE = "settled: upstream usage for every attempt"


def settled_timed_out(settle_after_s: float) -> str:
    """The reason of a settlement on the clock: no event for ``settle_after_s`` seconds (CONTRACT
    "Reconciliation")."""
    return f"settled: no event for {settle_after_s:g} s"


#: The columns a new ledger entry is written with (``entry_id`` is the database's), in order.
ENTRY_COLUMNS = (
    "request_id",
    "seq",
    "kind",
    "reason",
    "booked_at",
    "api_key_id",
    "model",
    "protocol",
    "status",
    "call_started_at",
    *TOKEN_FIELDS,
    "price_id",
    *RATE_COLUMNS,
    "cost_pusd",
    "units",
    "unit_prices",
    "customer_id",
    "plan_id",
    "plan_price_id",
    *PLAN_RATE_COLUMNS,
    "plan_unit_prices",
    "markup_pct",
    "charge_pusd",
    "provider_cost_pusd",
    "failure_charge",
    "leakage_pusd",
)

#: The reason of an entry that reverses a line in full; a line whose latest entry has it is closed.
REVERSAL_REASON = "reversal: the call's api key, model, price, customer or plan changed"
#: What every reversal's reason starts with (``LIKE 'reversal:%'`` finds them in the ledger).
REVERSAL_PREFIX = "reversal:"


#: The reason of a line booked again at the same key, model and price for another customer or
#: plan (or plan price, or markup) in force at the call's start (v2).
RERATED_REASON = "re-rated: the key's customer or plan in force at the call's start changed"


def _entry(
    kind: str,
    reason: str,
    key: LineKey,
    tokens: Tokens,
    price: PriceRow | None,
    units: dict[str, int],
    plan_price: PriceRow | None,
    provider_cost: int | None = None,
) -> NewEntry:
    """A new entry of ``tokens`` and ``units`` on line ``key``, its cost at ``price`` and its
    charge and leakage by ``billing.plans.charges.policy_charge`` (at ``plan_price``, else the
    key's markup, else the cost; v3: under the line's failure policy)."""
    cost = line_cost(tokens, price, units)
    charge, leakage = line_charge_and_leakage(key, tokens, units, cost, price, plan_price)
    return NewEntry(
        kind, reason, key, tokens, price, cost, units, plan_price, charge, leakage, provider_cost
    )


def line_charge_and_leakage(
    key: LineKey,
    tokens: Tokens,
    units: Mapping[str, int] | None,
    cost: int | None,
    price: PriceRow | None,
    plan_price: PriceRow | None,
) -> tuple[int | None, int | None]:
    """The charge and leakage in picodollars of ``tokens`` and ``units`` on line ``key``
    (``billing.plans.charges.policy_charge``)."""
    return policy_charge(tokens, units, cost, price, plan_price, key.markup_pct, key.failure_charge)


def plan_entries(
    target: list[Line],
    booked: Mapping[LineKey, Tokens],
    booked_prices: Mapping[LineKey, PriceRow | None],
    has_entries: bool,
    settle_reason: str,
    closed: AbstractSet[LineKey],
    booked_units: Mapping[LineKey, Mapping[str, int]] | None = None,
    booked_plan_prices: Mapping[LineKey, PriceRow | None] | None = None,
    booked_provider_costs: Mapping[LineKey, int | None] | None = None,
) -> list[NewEntry]:
    """The entries that bring the booked lines to the target lines (empty when they agree).

    ``booked`` holds the summed token deltas per line so far, ``booked_units`` the summed unit
    deltas (name → count, lines without units left out), ``booked_prices`` the price each line
    was booked at and ``closed`` the lines whose latest entry reversed them; every other booked
    line is open, even at zero tokens (a call settled before any usage still has its line).
    ``booked_plan_prices`` the plan price each line was charged at (v2; lines without one left
    out), ``booked_provider_costs`` the provider's own cost booked per line (v3; lines without
    one left out). ``has_entries`` tells whether the call has any entry yet. An open line that
    is no longer a target is reversed in full, and a target line that is not open gets an
    entry, both even at zero tokens, so the ledger always names the call's key, model and price.
    Source: CONTRACT "Reconciliation", "Usage dimensions (v2)".
    """
    if not has_entries:
        return [
            _entry(
                "settlement",
                settle_reason,
                line.key,
                line.tokens,
                line.price,
                dict(line.units),
                line.plan_price,
                line.provider_cost_pusd,
            )
            for line in (
                target if len(target) == 1 else sorted(target, key=lambda line: line.key.sort_key())
            )
        ]
    units_booked = booked_units or {}
    plan_prices_booked = booked_plan_prices or {}
    provider_costs_booked = booked_provider_costs or {}
    live = {key: tokens for key, tokens in booked.items() if key not in closed}
    targets = {line.key: line for line in target}
    # A new line whose key and model stay, but at another price, is a re-pricing of the line that
    # is reversed; a new settlement follows only a reversal of another key or model; a line that
    # is merely new (say a late attempt on another model) is a change of the same settled call.
    reversed_pairs = {(key.api_key_id, key.model) for key in live if key not in targets}
    reversed_rated = {key[:3] for key in live if key not in targets}
    reversing = bool(reversed_pairs)
    entries: list[NewEntry] = []
    for key in sorted(set(live) | set(targets), key=LineKey.sort_key):
        was = live.get(key, Tokens())
        was_units = units_booked.get(key, {}) if key in live else {}
        line = targets.get(key)
        now = line.tokens if line else Tokens()
        delta = now - was
        units = _units_delta(line.units if line else {}, was_units)
        price = line.price if line is not None else booked_prices.get(key)
        plan_price = line.plan_price if line is not None else plan_prices_booked.get(key)
        provider_cost = _provider_cost_delta(
            line.provider_cost_pusd if line is not None else None,
            provider_costs_booked.get(key) if key in live else None,
        )
        kind = "adjustment"
        if key in live and line is not None:
            if delta.is_zero() and not units and not provider_cost:
                continue
            reason = _late(delta, units, provider_cost)
        elif line is None:
            reason = REVERSAL_REASON
        elif key[:3] in reversed_rated:
            reason = RERATED_REASON
        elif (key.api_key_id, key.model) in reversed_pairs:
            reason = (
                "re-priced: the model's price in force at the call's start changed"
                if line.price is not None
                else "re-booked without a price"
            )
        elif not reversing:
            reason = _late(delta, units)
        else:
            kind = "settlement"
            reason = "settled again after the call's api key or model changed"
        entries.append(_entry(kind, reason, key, delta, price, units, plan_price, provider_cost))
    # Reversals first, so the entries read in the order an accountant would book them.
    entries.sort(key=lambda e: 0 if e.reason.startswith(REVERSAL_PREFIX) else 1)
    return entries
