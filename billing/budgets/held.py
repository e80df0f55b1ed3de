"""What an estimate holds in each measure (CONTRACT "Authorizations and holds (v3)", "Budgets and
alerts (v2)", "Plans (v2)", "Prepaid credits (v3)"; issue #39).

A hold is one stored amount (``budget_holds.hold_pusd``) counted in budgets of either measure
and, for a ``credit_required`` customer, against its credit (which the call's charge draws).
So it is the **larger** of the estimate's cost and its charge: the charge is what the
reconciler will charge the call under the key's plan in force (``billing.plans.charges.
line_charge``: the plan's own price for the model, else cost × (1 + markup), else the cost),
applied to the estimate's tokens and cost. Under a markup plan the hold is the charge (a charge
budget and the credit are not under-reserved by the markup); under a discount plan it stays
the cost (a cost budget is not under-reserved by the discount). A charge budget under a
discount plan then reserves a little more than the call will count in it: admission errs on
the side of the limit, and one amount keeps a hold's bookkeeping (release, ``beyond_call``,
the credit's ``held_usd``) as it is.

The plan is the one in force at ``now`` (the call starts now) for the key: its assignment in
force, read by the authorization's spend check statement with the plan's versions' count and
highest id, and the plan's versions from the process's copy (``billing.plans.cache``: loaded
again, two statements, only when a version was added since).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.dimensions import Tokens
from billing.plans.cache import terms_now
from billing.plans.charges import line_charge
from billing.plans.rating import Terms


def estimate_charge(
    terms: Terms,
    model: str | None,
    when: datetime,
    tier: str | None,
    input_tokens: int,
    output_tokens: int,
    cost_pusd: int,
) -> int:
    """The charge, picodollars, of a call estimated at ``input_tokens`` uncached input and
    ``output_tokens`` output of ``model`` (``tier``) costing ``cost_pusd``, under ``terms``
    (its key's plan at ``when``), by the reconciler's rule; the cost where that gives nothing
    (a charge beyond what an entry holds)."""
    tokens = Tokens(input_tokens=input_tokens, output_tokens_billed=output_tokens)
    plan_price = terms.plan_price(model, when, tier, input_tokens)
    charge = line_charge(tokens, None, cost_pusd, plan_price, terms.markup_pct)
    return cost_pusd if charge is None else charge


def held_pusd(
    session: Session,
    customer_id: str | None,
    plan: tuple[str, int, int] | None,
    model: str,
    tier: str | None,
    input_tokens: int,
    output_tokens: int,
    cost_pusd: int,
    now: datetime,
) -> int:
    """The hold of a token estimate costing ``cost_pusd`` (picodollars) for a call starting at
    ``now`` of a key assigned to ``customer_id`` and ``plan`` now (``SpendCheckRows.plan``:
    (plan id, its versions' count, highest id), None for none): the larger of its cost and its
    charge under the plan (see the module)."""
    if plan is None:
        return cost_pusd
    terms = terms_now(session, customer_id, plan, now)
    if terms.plan_id is None:
        return cost_pusd
    charge = estimate_charge(terms, model, now, tier, input_tokens, output_tokens, cost_pusd)
    return max(cost_pusd, charge)
