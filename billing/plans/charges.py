"""The charge of a ledger line (CONTRACT "Keys, customers and plans (v2)"), pure and exact.

A line is charged, in this order: at its plan's own price (``plan_price``: its tokens and units
at the plan's rates), else at its cost × (1 + ``markup_pct`` / 100) when the key has a plan,
else at its cost. Without a cost and without a plan price the charge is unknown (None), never 0.

Exactness: costs are integer picodollars and a markup has at most 4 decimal places
(``billing.plans.schemas.MARKUP_DECIMALS``), so ``cost × (100 + markup) / 100`` is exact to
10⁻⁶ picodollar; it is a whole number of picodollars whenever the rates are whole multiples of
0.01 USD per million tokens (every published price list). Where it is not (a rate of, say,
0.000001 USD per million tokens with a 12.5 % markup), the line's charge is rounded half to even
to the picodollar (10⁻¹² USD), the only rounding of the pipeline, documented here and in the
charge's column: each ledger row's ``charge_pusd`` is still exactly what its own columns give
by this rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

from billing.dimensions import Tokens
from billing.money import MAX_PUSD
from billing.pricing.prices import PriceRow


def apply_markup(cost_pusd: int, markup_pct: str) -> int:
    """``cost_pusd`` × (1 + ``markup_pct`` / 100), in picodollars (``"20"`` on 11,316,000,000
    gives 13,579,200,000); a sub-picodollar remainder rounds half to even (see the module)."""
    factor = Fraction(Decimal(markup_pct)) / 100 + 1
    exact = cost_pusd * factor
    if exact.denominator == 1:
        return int(exact)
    return int(
        (Decimal(exact.numerator) / Decimal(exact.denominator)).quantize(
            Decimal(1), rounding=ROUND_HALF_EVEN
        )
    )


def priced_pusd(tokens: Tokens, units: Mapping[str, int] | None, price: PriceRow) -> int | None:
    """``tokens`` and ``units`` at ``price`` (a model's price or a plan's own), in picodollars,
    unbounded; None when a unit counted has no price there."""
    amount = price.cost_pusd(tokens)
    if units:
        unit_amount = price.units_cost_pusd(units)
        if unit_amount is None:
            return None
        amount += unit_amount
    return amount


def line_charge(
    tokens: Tokens,
    units: Mapping[str, int] | None,
    cost_pusd: int | None,
    plan_price: PriceRow | None,
    markup_pct: str | None,
) -> int | None:
    """The charge of a line (or of an entry's deltas) in picodollars, by the module's rule:
    ``plan_price`` (the plan's price that applies, else None), ``markup_pct`` (the plan's markup
    text; None: no plan). None also for a charge beyond ``MAX_PUSD`` (no entry can hold it)."""
    charge = _line_charge(tokens, units, cost_pusd, plan_price, markup_pct)
    return charge if charge is None or -MAX_PUSD <= charge <= MAX_PUSD else None


def _line_charge(
    tokens: Tokens,
    units: Mapping[str, int] | None,
    cost_pusd: int | None,
    plan_price: PriceRow | None,
    markup_pct: str | None,
) -> int | None:
    if plan_price is not None:
        # a unit without a plan price: the markup applies instead
        charge = priced_pusd(tokens, units, plan_price)
        if charge is not None:
            return charge
    if cost_pusd is None:
        return None
    if markup_pct is None:
        return cost_pusd
    return apply_markup(cost_pusd, markup_pct)


# --- (v3) the charge policy for failed calls (CONTRACT "Charge policy for failed calls (v3)") ---

#: The policies other than ``bill``: a line charged under one carries its name
#: (``ledger_entries.failure_charge``); ``bill`` is None there.
BILL_DELIVERED = "bill_delivered"
VOID = "void"
#: Least charged first: when a call falls in several categories, the policy that charges least
#: applies (a disconnect of an estimated call under ``estimated: void`` is void).
_LEAST_FIRST = (VOID, BILL_DELIVERED)
#: The error type of a stream that stalled (``stream.failed.error_type``); any other failure
#: is an upstream error.
STALLED = "stalled"


def failure_categories(status: str, error_type: str | None, usage_source: str) -> list[str]:
    """The categories of ``billing.plans.schemas.FailureCharges`` a call falls in: by its status
    (``failed``: ``stalled`` when its last attempt's error type is ``stalled``, else
    ``upstream_error``; ``client_disconnected``) and ``estimated`` when its usage is."""
    categories = []
    if status == "failed":
        categories.append(STALLED if error_type == STALLED else "upstream_error")
    elif status == "client_disconnected":
        categories.append("client_disconnected")
    if usage_source == "estimate":
        categories.append("estimated")
    return categories


def failure_charge(policy: Mapping[str, str], categories: list[str]) -> str | None:
    """The policy of ``policy`` (category → ``bill`` | ``bill_delivered`` | ``void``, the
    categories at ``bill`` may be left out) that applies to a call in ``categories``: the one
    that charges least; None for ``bill``."""
    chosen = {policy.get(category) for category in categories}
    return next((name for name in _LEAST_FIRST if name in chosen), None)


def _delivered_part(tokens: Tokens) -> Tokens:
    """``tokens`` with the output charged only as far as delivered (billed − undelivered)."""
    return replace(
        tokens,
        output_tokens_billed=tokens.output_tokens_billed - tokens.output_tokens_undelivered,
        output_tokens_undelivered=0,
    )


def policy_charge(
    tokens: Tokens,
    units: Mapping[str, int] | None,
    cost_pusd: int | None,
    price: PriceRow | None,
    plan_price: PriceRow | None,
    markup_pct: str | None,
    failure: str | None,
) -> tuple[int | None, int | None]:
    """The charge of a line under the failure policy ``failure`` (None: ``bill``) and its
    leakage (the cost the policy left uncharged), both in picodollars: ``bill`` charges it as
    ``line_charge`` does, leakage 0; ``void`` charges 0 and leaks the cost; ``bill_delivered``
    charges the line with its output as far as delivered, and leaks the cost of the rest
    (the undelivered output at the line's price). The leakage is None where the cost is."""
    if failure == VOID:
        return 0, cost_pusd
    if failure == BILL_DELIVERED:
        kept = _delivered_part(tokens)
        kept_cost = None if price is None else priced_pusd(kept, units, price)
        charge = line_charge(kept, units, kept_cost, plan_price, markup_pct)
        leakage = None if cost_pusd is None or kept_cost is None else cost_pusd - kept_cost
        return charge, leakage
    charge = line_charge(tokens, units, cost_pusd, plan_price, markup_pct)
    return charge, None if cost_pusd is None else 0
