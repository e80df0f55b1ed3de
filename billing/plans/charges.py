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
