"""What budgets have spent now: settled, provisional and held (CONTRACT "Budgets and alerts
(v2)", "Authorizations and holds (v3)").

- **settled** and **provisional**: a budget kept by counters (``scopes.kept_by_counters``) reads
  its counter of the current period; any other (a tag, every call, a model, a rolling window)
  sums the amounts of the calls started in its span (``BudgetsRepository.call_amounts``: by
  the calls' key, customer, model and start indexes; a tag budget reads the span's calls).
- a call stored but not yet read by a reconciliation step counts from its ingest
  (provisional): at its hold when it has a live one, else at an estimate, its
  ``stream.started`` input and largest generated count at its model's price at its start
  (``ix_calls_unstepped``: few rows; the key's customer at the call's start from its
  assignments, ``billing.plans.rating``, as the step will write it), and in a ``charge``
  budget at that estimate's charge under the key's plan at the call's start
  (``billing.budgets.held.estimate_charge``, the reconciler's rule: an open call counts at its
  charge before the step as after it; issue #39).
- **held**: the live holds the budget is over (neither released nor expired), while their call
  has no event. A hold whose call is stored but not yet read by a reconciliation step stands
  for the call's figure (provisional); once a step read the call, the call's own figure counts
  (provisional), and while the call is open and its hold live, the part of the hold above that
  figure is still held: an open call counts at no less than its hold, since its figure grows
  as it streams (input, then output so far) up to what the hold bounds, and what it will still
  cost must not be admitted twice (sixteen gateways outran a $1 budget by 20–60 % when a
  stepped call counted at its figure alone). Never more than the larger of the two, never
  after release, expiry or settlement.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from billing.budgets.held import estimate_charge
from billing.budgets.repository import BudgetsRepository, repository
from billing.budgets.rows import LiveHold, Unstepped
from billing.budgets.scopes import Scoped, applies, kept_by_counters, span, tags_of
from billing.plans.rating import Rating
from billing.pricing.cache import price_book


class Budgeted(Scoped, Protocol):
    """A budget version as these reads take it (a ``budgets`` row or its cached copy)."""

    @property
    def id(self) -> int: ...
    @property
    def budget_id(self) -> str: ...
    @property
    def measure(self) -> str: ...


B = TypeVar("B", bound=Budgeted)


@dataclass
class Spent:
    """A budget's spend in its current period, picodollars; ``holds``: the live holds counted
    in ``held_pusd`` (their expiries say when headroom may come back)."""

    settled_pusd: int
    provisional_pusd: int
    held_pusd: int = 0
    holds: list[LiveHold] = field(default_factory=list)

    @property
    def total_pusd(self) -> int:
        return self.settled_pusd + self.provisional_pusd + self.held_pusd


def _repo(session: Session) -> BudgetsRepository:
    repo: BudgetsRepository = repository(session)
    return repo


def _hold_applies(budget: Budgeted, hold: LiveHold) -> bool:
    return applies(budget, hold.api_key_id, hold.customer_id, hold.tags, hold.model)


def summed_spend(
    session: Session, budget: Budgeted, start: datetime, end: datetime | None
) -> tuple[int, int]:
    """(settled, provisional) of a budget no counter keeps over the span ``start``, ``end``
    (``scopes.span``: a calendar period, or a rolling window, whose ``end`` is not read): the
    figures of its calls that reconciliation steps wrote; no holds, no estimates."""
    found = _repo(session).call_amounts(
        session,
        budget.measure,
        start,
        end,
        rolling=budget.period == "rolling",
        key=budget.api_key_id,
        customer=budget.customer_id,
        tag=budget.tag,
        model=budget.model,
    )
    sums = [0, 0]  # provisional, settled
    for call in found:
        if budget.tag is not None and not (
            budget.tag in tags_of(call.metadata_tags)
            or (call.hold_tags is not None and budget.tag in json.loads(call.hold_tags))
        ):
            continue
        sums[call.settled] += call.amount_pusd
    return sums[1], sums[0]


def _in_span(budget: Budgeted, started_at: datetime, now: datetime) -> bool:
    start, end = span(budget, now)
    if budget.period == "rolling":
        return started_at > start
    return started_at >= start and (end is None or started_at < end)


def _estimates(
    session: Session,
    unstepped: list[Unstepped],
    skip: Collection[str],
    customers: bool,
    charges: bool = False,
) -> list[tuple[Unstepped, str | None, dict[str, int]]]:
    """The calls not yet stepped of ``unstepped`` (but those in ``skip``: their holds stand for
    them), each with its key's customer at its start when ``customers`` (a customer budget
    asks; else None: no other scope reads it) and its estimate in picodollars per measure
    (unpriced: left out, as a step would price it at nothing): ``cost``, and ``charge`` under
    the key's plan at the call's start when ``charges`` (a charge budget asks; else the cost).
    The keys' assignments and plans are loaded only when either asks."""
    calls = [c for c in unstepped if c.request_id not in skip]
    if not calls:
        return []
    book = price_book(session, {c.model for c in calls if c.model is not None})
    wanted = customers or charges
    rating = Rating.load(session, (c.api_key_id for c in calls)) if wanted else None
    found = []
    for c in calls:
        price = book.at(c.model, c.started_at, None, c.input_tokens)
        if price is not None:
            customer = None
            estimate = c.input_tokens * price.input + c.output_tokens * price.output
            charge = estimate
            if rating is not None:
                terms = rating.terms(c.api_key_id, c.started_at)
                customer = terms.customer_id if customers else None
                if charges and terms.plan_id is not None:
                    tokens = (c.input_tokens, c.output_tokens)
                    charge = estimate_charge(terms, c.model, c.started_at, None, *tokens, estimate)
            found.append((c, customer, {"cost": estimate, "charge": charge}))
    return found


def spent(
    session: Session,
    budgets: Sequence[Budgeted],
    now: datetime,
    counters: dict[tuple[int, datetime], tuple[int, int]] | None = None,
) -> dict[int, Spent]:
    """Each budget's ``Spent`` now, by row id. ``counters``: the counters already read (the
    spend check's statement, in the same snapshot), else read here.

    In a transaction whose statements each see what committed before them (an authorization:
    read committed), the holds and the calls not yet stepped are read before the counters and
    the calls' sums: a step that commits in between then counts a call twice for a moment (its
    estimate and its figure), never not at all; admission errs on the side of the limit."""
    if not budgets:
        return {}
    repo = _repo(session)
    keys = {b.api_key_id for b in budgets if b.api_key_id is not None}
    customers = {b.customer_id for b in budgets if b.customer_id is not None}
    everything = any(b.api_key_id is None and b.customer_id is None for b in budgets)
    pairs = []
    if counters is None:
        pairs = [(b.id, span(b, now)[0]) for b in budgets if kept_by_counters(b)]
    # The holds, the calls not yet stepped (a customer's have no customer on their row: every
    # one is read) and the counters not read yet: one statement, one snapshot (a round trip
    # each before).
    holds, unstepped, read = repo.spend_reads(
        session, now, keys, customers, everything, everything or bool(customers), pairs
    )
    if counters is None:
        counters = repo.spend(session, pairs) if read is None else read
    standing = {h.request_id for h in holds if h.call == "unstepped"}
    charges = any(b.measure == "charge" for b in budgets)
    estimates = _estimates(session, unstepped, standing, bool(customers), charges)
    out: dict[int, Spent] = {}
    for budget in budgets:
        if kept_by_counters(budget):
            settled, provisional = counters.get((budget.id, span(budget, now)[0]), (0, 0))
        else:
            settled, provisional = summed_spend(session, budget, *span(budget, now))
        figures = Spent(settled, provisional)
        for hold in holds:
            if not _hold_applies(budget, hold):
                continue
            if hold.call is None:
                figures.held_pusd += hold.hold_pusd
                figures.holds.append(hold)
            elif hold.call == "unstepped":
                figures.provisional_pusd += hold.hold_pusd
            elif beyond := hold.beyond_call(budget.measure):
                figures.held_pusd += beyond
                figures.holds.append(hold)
        for call, customer, estimate in estimates:
            tags = tags_of(call.metadata_tags)
            if applies(budget, call.api_key_id, customer, tags, call.model) and _in_span(
                budget, call.started_at, now
            ):
                figures.provisional_pusd += estimate[budget.measure]
        out[budget.id] = figures
    return out


def over(
    budgets: Collection[B],
    key: str,
    customer: str | None,
    tags: Collection[str],
    model: str | None,
) -> list[B]:
    """The versions over a call of ``key`` (its ``customer`` now), ``tags`` and ``model`` (None:
    any model, the spend check), by ``budget_id``."""
    found = [b for b in budgets if applies(b, key, customer, tags, model, model is None)]
    return sorted(found, key=lambda b: b.budget_id)
