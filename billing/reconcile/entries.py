"""A call's billable lines and their cost, and the ledger entries a step writes (CONTRACT "Cost",
"Usage dimensions (v2)")."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from billing.anomalies import UNPRICED
from billing.dimensions import TOKEN_FIELDS, Tokens, set_tokens
from billing.money import MAX_PUSD
from billing.plans.charges import failure_categories, failure_charge
from billing.plans.rating import NO_TERMS, Rating, Terms
from billing.pricing.prices import PriceBook, PriceRow, unit_prices_text
from billing.rates import RATES
from billing.reconcile.ledger import Line, LineKey, NewEntry, line_charge_and_leakage, line_cost
from billing.reconcile.rule import CallFigures

#: The rates of an unpriced entry.
_NO_RATES: tuple[None, ...] = (None,) * len(RATES)


def target_lines(figures: CallFigures, book: PriceBook, rating: Rating | None = None) -> list[Line]:
    """The call's billable lines: per model and price, the tokens and units billed at it.

    Each attempt is priced at the call's start by its model, its served tier and its context
    (input + cache read + cache creation: long-context prices); the tokens it reports at other
    models' rates (``other_models``) are priced by those models, in lines of their own (CONTRACT
    "Usage dimensions (v2)"). A line with a unit of non-zero count that its price has no price
    for is unpriced (no price at all), as is one whose model has no price.

    (v2) With ``rating``, each line is charged under the customer and plan of the call's key in
    force at its start (``Rating.terms``): at the plan's own price for the attempt's model and
    served tier (long-context prices as for costs) when it prices every unit the line counts,
    else at the plan's markup; without a plan at cost (CONTRACT "Keys, customers and plans
    (v2)"). v3: prices are looked up by the attempt's inference geo too; every line of a call
    that failed is charged under the plan's policy for it (``failure_charge``), and the
    provider's own cost of an attempt is kept on its line (CONTRACT "Non-streaming calls,
    hosted-tool fees, provider-reported cost (v3)", "Charge policy for failed calls (v3)").
    """
    started = figures.started_at
    terms: Terms = rating.terms(figures.api_key_id, started) if rating else NO_TERMS
    failure = (
        failure_charge(
            dict(terms.failure_charges),
            failure_categories(figures.status, figures.error_type, figures.usage_source),
        )
        if terms.failure_charges
        else None
    )
    by_key: dict[tuple[str | None, int | None, int | None], Line] = {}

    def add(
        model: str | None,
        price: PriceRow | None,
        tokens: Tokens,
        units: dict[str, int],
        plan_price: PriceRow | None,
        provider_cost: int | None = None,
    ) -> None:
        if price is not None and units and price.units_cost_pusd(units) is None:
            price = None
        if plan_price is not None and units and plan_price.units_cost_pusd(units) is None:
            plan_price = None
        key = (model, price.id if price else None, plan_price.id if plan_price else None)
        line = by_key.get(key)
        if line is None:
            line_key = LineKey(
                figures.api_key_id,
                model,
                key[1],
                terms.customer_id,
                terms.plan_id,
                key[2],
                terms.markup_pct if plan_price is None else None,
                failure,
            )
            by_key[key] = Line(line_key, tokens, price, dict(units), plan_price, provider_cost)
            return
        line.tokens = line.tokens + tokens
        if provider_cost is not None:
            line.provider_cost_pusd = (line.provider_cost_pusd or 0) + provider_cost
        for name, count in units.items():
            line.units[name] = line.units.get(name, 0) + count
        if line.price is not None and line.units and line.price.units_cost_pusd(line.units) is None:
            line.price = None  # pragma: no cover - a price's unit prices are the same per id

    for attempt in figures.attempts:
        tier = attempt.service_tier
        geo = attempt.inference_geo
        context = attempt.context_tokens()
        price = book.at(attempt.model, started, tier, context, geo)
        plan_price = terms.plan_price(attempt.model, started, tier, context, geo)
        add(
            attempt.model,
            price,
            attempt.tokens,
            attempt.units,
            plan_price,
            attempt.provider_cost_pusd,
        )
        for model, tokens in attempt.other_models.items():
            context = (
                tokens.input_tokens + tokens.cache_read_input_tokens
                + tokens.cache_creation_input_tokens
            )  # fmt: skip
            add(
                model,
                book.at(model, started, tier, context, geo),
                tokens,
                {},
                terms.plan_price(model, started, tier, context, geo),
            )
    return list(by_key.values())


def call_cost(lines: Sequence[Line]) -> int | None:
    """The call's exact cost in picodollars, or None when any line is unpriced (or the sum is
    beyond ``MAX_PUSD``)."""
    total = 0
    for line in lines:
        cost = line_cost(line.tokens, line.price, line.units)
        if cost is None:
            return None
        total += cost
    return total if total <= MAX_PUSD else None


def call_charge(lines: Sequence[Line]) -> tuple[int | None, int | None]:
    """The call's charge and (v3) leakage in picodollars (``line_charge_and_leakage`` per
    line): the charge None when any line has no charge (no cost and no plan price), the leakage
    None when any line's cost is not known."""
    charge_total: int | None = 0
    leakage_total: int | None = 0
    for line in lines:
        cost = line_cost(line.tokens, line.price, line.units)
        charge, leakage = line_charge_and_leakage(
            line.key, line.tokens, line.units, cost, line.price, line.plan_price
        )
        charge_total = None if charge is None or charge_total is None else charge_total + charge
        leakage_total = (
            None if leakage is None or leakage_total is None else leakage_total + leakage
        )
    if charge_total is not None and charge_total > MAX_PUSD:
        charge_total = None
    return charge_total, leakage_total


def anomalies_of(fig: CallFigures, cost: int | None) -> list[str]:
    """The call's anomaly codes: the rule's, and ``unpriced`` when it has no cost."""
    if cost is None and UNPRICED not in fig.anomalies:
        return sorted({*fig.anomalies, UNPRICED})
    return list(fig.anomalies)


class Entry:
    """A new ledger entry (see ``LedgerEntry``; ``rollups.EntryLike``): one attribute per token
    bucket, named as in ``TOKEN_FIELDS``."""

    __slots__ = (
        "api_key_id",
        "booked_at",
        "call_started_at",
        "charge_pusd",
        "cost_pusd",
        "customer_id",
        "failure_charge",
        "kind",
        "leakage_pusd",
        "markup_pct",
        "model",
        "plan_id",
        "plan_price",
        "price",
        "protocol",
        "provider_cost_pusd",
        "reason",
        "request_id",
        "seq",
        "status",
        "tokens",
        "units",
        *TOKEN_FIELDS,
    )

    def __init__(
        self, request_id: str, seq: int, new: NewEntry, fig: CallFigures, now: datetime
    ) -> None:
        self.request_id = request_id
        self.seq = seq
        self.kind = new.kind
        self.reason = new.reason
        self.booked_at = now
        self.api_key_id = new.key.api_key_id
        self.model = new.key.model
        self.protocol = fig.protocol
        self.status = fig.status
        self.call_started_at = fig.started_at
        self.price = new.price
        self.cost_pusd = new.cost_pusd
        self.tokens = new.tokens
        self.units = new.units
        self.customer_id = new.key.customer_id
        self.plan_id = new.key.plan_id
        self.plan_price = new.plan_price
        self.markup_pct = new.key.markup_pct
        self.charge_pusd = new.charge_pusd
        self.failure_charge = new.key.failure_charge
        self.leakage_pusd = new.leakage_pusd
        self.provider_cost_pusd = new.provider_cost_pusd
        set_tokens(self, new.tokens)

    def __getattr__(self, name: str) -> int:
        # Only reached for a slot not set: mypy reads the token buckets through here.
        raise AttributeError(name)

    def row(self, booked_at: Any, time: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
        """The values of ``ENTRY_COLUMNS`` (``booked_at`` and times as the driver takes them)."""
        price = self.price
        plan = self.plan_price
        return (
            self.request_id,
            self.seq,
            self.kind,
            self.reason,
            booked_at,
            self.api_key_id,
            self.model,
            self.protocol,
            self.status,
            time(self.call_started_at),
            *self.tokens.values(),
            price.id if price else None,
            *(price.rates if price else _NO_RATES),
            self.cost_pusd,
            units_text(self.units),
            unit_prices_text(
                {n: price.unit_prices[n] for n in self.units if n in price.unit_prices}
                if price and self.units
                else None
            ),
            self.customer_id,
            self.plan_id,
            plan.id if plan else None,
            *(plan.rates if plan else _NO_RATES),
            unit_prices_text(
                {n: plan.unit_prices[n] for n in self.units if n in plan.unit_prices}
                if plan and self.units
                else None
            ),
            self.markup_pct,
            self.charge_pusd,
            self.provider_cost_pusd,
            self.failure_charge,
            self.leakage_pusd,
        )


def units_text(units: dict[str, int] | None) -> str | None:
    """Units (name → count) as the canonical JSON text of a ledger entry and the v2 CSV cell:
    sorted, compact (``{"web_search_requests":3}``); None for none."""
    if not units:
        return None
    return json.dumps(dict(sorted(units.items())), separators=(",", ":"))
