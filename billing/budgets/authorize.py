"""Authorizations and holds (CONTRACT "Authorizations and holds (v3)"): ``POST
/v1/authorizations`` reserves an estimate against every budget over the call before the gateway
calls the upstream; ``DELETE /v1/authorizations/{request_id}`` gives it back.

An authorization runs in a write transaction: it takes the admission lock of each budget it is
under (``BudgetsRepository.lock_budgets``: PostgreSQL advisory locks in row order, SQLite's one
writer), reads their spend and live holds (``billing.budgets.spent``) and stores the hold when
it allows, before its transaction ends. So concurrent authorizations under one budget decide
one after the other, each seeing the holds of those before: their sum never exceeds the
headroom. A hold is stored once per ``request_id`` with its first answer, which a repeated
authorization with the same body gets again (another body: 409).

The hold of a token estimate is priced at the model's price in force now: input at the
(long-context, when the input crosses it) input rate, all of ``max_output_tokens`` at the
output rate; that cost is then charged under the key's plan in force now as the reconciler
will charge the call, and the hold is the larger of the two (``billing.budgets.held``: one
stored amount counts in budgets of either measure and against credit, which draws the charge,
so it is never below what the call counts in any of them; issue #39). An amount estimate holds
the amount given.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from billing.budgets import cache
from billing.budgets.held import held_pusd
from billing.budgets.repository import BudgetsRepository, repository
from billing.budgets.rows import BudgetDef, LiveHold, StoredHold
from billing.budgets.schemas import AmountEstimate, AuthorizationIn
from billing.budgets.service import counters_of, statuses
from billing.budgets.spent import Spent, over, spent
from billing.errors import BillingError, NotFound
from billing.money import format_usd, pusd_to_decimal, usd_to_pusd
from billing.pricing.cache import price_book
from billing.timefmt import rfc3339

#: ``retry_after_s`` is at most this (holds may end sooner: released, converted).
MAX_RETRY_AFTER_S = 60


class AuthorizationConflict(BillingError):
    """409: the ``request_id`` was authorized with another body."""

    status = 409


#: The prepaid-credit check an authorization also passes (``billing.credits.service.credit_gate``,
#: given by the API so that budgets need not know credits): ``(session, api_key_id, customer_id,
#: hold_pusd, now, credit_required)`` → whether the owner's available credit covers the hold;
#: ``credit_required``: the customer's, read by the spend check's statement (no statement more).
CreditGate = Callable[[Session, str, "str | None", int, datetime, bool], bool]


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str | None = None
    retryable: bool = False
    retry_after_s: int | None = None
    binding: str | None = None


def _repo(session: Session) -> BudgetsRepository:
    repo: BudgetsRepository = repository(session)
    return repo


def body_hash(body: AuthorizationIn) -> str:
    """SHA-256 of the body's canonical JSON (the same content: the same hash)."""
    text = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def estimate_pusd(
    session: Session,
    body: AuthorizationIn,
    now: datetime,
    versions: dict[str, tuple[int, int]] | None,
    customer_id: str | None,
    plan: tuple[str, int, int] | None,
) -> int | None:
    """The hold the estimate asks for, picodollars; None for a token estimate of a model
    without a price in force now. ``versions``: the model's price rows' numbers read already
    (``billing.pricing.cache.price_book``). A token estimate holds the larger of its cost and
    its charge under the key's plan in force now (``customer_id`` and ``plan``: the key's
    assignment now, as ``SpendCheckRows`` read it; ``billing.budgets.held.held_pusd``: no
    statement more while the process's copy of the plan holds)."""
    estimate = body.estimate
    if isinstance(estimate, AmountEstimate):
        return usd_to_pusd(estimate.amount_usd)
    price = price_book(session, [body.model], versions).at(
        body.model, now, body.service_tier, estimate.input_tokens
    )
    if price is None:
        return None
    # A rate in micro-USD per million tokens is a token's price in picodollars.
    cost = estimate.input_tokens * price.input + estimate.max_output_tokens * price.output
    return held_pusd(
        session,
        customer_id,
        plan,
        body.model,
        body.service_tier,
        estimate.input_tokens,
        estimate.max_output_tokens,
        cost,
        now,
    )


def _retry_after(holds: list[LiveHold], over_pusd: int, now: datetime) -> int:
    """Seconds until enough of ``holds`` expire to free ``over_pusd`` (capped)."""
    freed = 0
    for hold in sorted(holds, key=lambda h: h.expires_at):
        freed += hold.hold_pusd
        if freed >= over_pusd:
            wait = math.ceil((hold.expires_at - now).total_seconds())
            return max(1, min(wait, MAX_RETRY_AFTER_S))
    return MAX_RETRY_AFTER_S


def decide(
    budgets: list[BudgetDef], figures: dict[int, Spent], hold: int, unpriced: bool, now: datetime
) -> Decision:
    """The decision over ``budgets`` (by ``budget_id``) for a hold of ``hold`` picodollars: a
    final denial first (``budget_exceeded``: spent without holds reached the limit;
    ``estimate_exceeds_limit``; ``unpriced`` where a budget says deny), else one that holds in
    flight cause (``insufficient_headroom``, retryable when the hold fits once they end)."""
    retryable: Decision | None = None
    for budget in budgets:
        f = figures[budget.id]
        limit = usd_to_pusd(budget.limit_usd)
        used = f.settled_pusd + f.provisional_pusd
        if used >= limit:
            return Decision(False, "budget_exceeded", binding=budget.budget_id)
        if hold > limit:
            return Decision(False, "estimate_exceeds_limit", binding=budget.budget_id)
        if unpriced and budget.unpriced == "deny":
            return Decision(False, "unpriced", binding=budget.budget_id)
        if retryable is None and used + f.held_pusd + hold > limit:
            if used + hold <= limit:
                wait = _retry_after(f.holds, used + f.held_pusd + hold - limit, now)
                retryable = Decision(False, "insufficient_headroom", True, wait, budget.budget_id)
            else:
                return Decision(False, "insufficient_headroom", binding=budget.budget_id)
    if retryable is not None:
        return retryable
    tightest = min(
        budgets,
        key=lambda b: (usd_to_pusd(b.limit_usd) - figures[b.id].total_pusd, b.budget_id),
        default=None,
    )
    binding = None if tightest is None else tightest.budget_id
    return Decision(True, "unpriced" if unpriced else None, binding=binding)


def _again(stored: StoredHold, digest: str) -> dict[str, Any]:
    if stored.body_hash != digest:
        raise AuthorizationConflict(
            f"request_id {stored.request_id!r} was authorized with another body; "
            "send the same body again, or a new request_id"
        )
    answer: dict[str, Any] = json.loads(stored.answer)
    return answer


def authorize(
    session: Session, body: AuthorizationIn, now: datetime, credit: CreditGate | None = None
) -> dict[str, Any]:
    """``POST /v1/authorizations`` in a write transaction: the decision, the hold stored when
    allowed (the first answer again for a repeated ``request_id``). With ``credit``, a hold the
    owner's prepaid credit cannot cover is denied ``insufficient_credit`` (final; CONTRACT
    "Prepaid credits (v3)")."""
    repo = _repo(session)
    digest = body_hash(body)
    # A repeated ``request_id`` is rare: its stored answer is read only when this one would
    # store nothing (a denial) or finds it stored (the insert), one statement less for the
    # others. Either way it gets the first answer, and nothing is stored again.
    # The spend check's statement reads the numbers of the model's price rows too (a token
    # estimate's): the price book's check costs no statement of its own.
    tokens = not isinstance(body.estimate, AmountEstimate)
    # And the key's plan now, with its versions' numbers: the plan's copy's check costs none.
    generation, customer, required, rows, prices, plan = repo.spend_check_rows(
        session, body.api_key_id, now, body.model if tokens else None
    )
    priced = estimate_pusd(session, body, now, prices, customer, plan)
    hold = priced or 0
    in_force = cache.in_force_at(session, generation)
    near = in_force.near(body.api_key_id, customer, body.tags)
    budgets = over(near, body.api_key_id, customer, body.tags, body.model)
    repo.lock_budgets(session, [b.id for b in budgets])
    # The counters the statement read are those after the lock too when the transaction is
    # the one writer (SQLite); under read committed (PostgreSQL) ``spent`` reads them after
    # the holds, once the budgets are locked.
    counters = counters_of(rows) if repo.one_writer else None
    figures = spent(session, budgets, now, counters)
    unpriced = priced is None
    if not tokens and any(budget.unpriced == "deny" for budget in budgets):
        # An amount estimate needs no price to hold, but its call would book no cost and never
        # count against a budget that denies unpriced models: the model's price is read then.
        book = price_book(session, [body.model])
        unpriced = book.at(body.model, now, body.service_tier, 0) is None
    decision = decide(budgets, figures, hold, unpriced, now)
    if (
        decision.allow
        and credit is not None
        and not credit(session, body.api_key_id, customer, hold, now, required)
    ):
        decision = Decision(False, "insufficient_credit")
    expires = now + timedelta(seconds=body.ttl_s)
    if decision.allow:
        for budget in budgets:
            figures[budget.id].held_pusd += hold
    answer = {
        "request_id": body.request_id,
        "decision": "allow" if decision.allow else "deny",
        "reason": decision.reason,
        "retryable": decision.retryable,
        "retry_after_s": decision.retry_after_s,
        "hold_usd": format_usd(pusd_to_decimal(hold if decision.allow else 0)),
        "expires_at": rfc3339(expires) if decision.allow else None,
        "binding_budget_id": decision.binding,
        "budgets": statuses(budgets, figures, now),
        "as_of": rfc3339(now),
    }
    if not decision.allow:
        stored = repo.hold(session, body.request_id)
        if stored is not None:  # allowed before: its first answer
            return _again(stored, digest)
        return answer  # nothing stored: a retry decides again
    values = {
        "request_id": body.request_id,
        "api_key_id": body.api_key_id,
        "customer_id": customer,
        "model": body.model,
        "tags": json.dumps(sorted(set(body.tags))),
        "hold_pusd": hold,
        "body_hash": digest,
        "answer": json.dumps(answer, separators=(",", ":")),
        "created_at": now,
        "expires_at": expires,
    }
    if not repo.insert_hold(session, values):  # a repeat, or the same one concurrently
        raced = repo.hold(session, body.request_id)
        assert raced is not None
        return _again(raced, digest)
    return answer


def release(session: Session, request_id: str, now: datetime) -> dict[str, Any]:
    """``DELETE /v1/authorizations/{request_id}``: the hold stops counting now (unless its call
    has an event already, ``converted``, or it expired); 404 for an unknown one. Releasing
    again answers the same."""
    repo = _repo(session)
    stored = repo.hold(session, request_id)
    if stored is None:
        raise NotFound(f"no authorization with request_id {request_id!r}")
    released = stored.released_at
    if released is not None:
        state = "released"
    elif repo.call_exists(session, request_id):
        state = "converted"
    elif stored.expires_at <= now:
        state = "expired"
    else:
        repo.release_hold(session, request_id, now)
        released = now
        state = "released"
    return {
        "request_id": request_id,
        "state": state,
        "hold_usd": format_usd(pusd_to_decimal(stored.hold_pusd)),
        "expires_at": rfc3339(stored.expires_at),
        "released_at": rfc3339(released),
    }


def settle_holds(session: Session, request_ids: Sequence[str], now: datetime) -> None:
    """The holds of the calls a reconciliation step (at ``now``) settled for the first time:
    marked settled, in the step's transaction. Their calls' own figures replaced them and a call
    never stops being settled: they count nothing from now on, and every later spend check,
    authorization and balance of their owners reads them no more (they stayed live until their
    TTL, each read and its call looked up to leave it out: thousands a busy owner)."""
    _repo(session).settle_holds(session, request_ids, now)


def holds_in_flight(session: Session, now: datetime) -> list[dict[str, Any]]:
    """The holds counted now (live, their call without an event), oldest first, each with its
    age in whole seconds (the console's Budgets page)."""
    found = _repo(session).live_holds(session, now, (), (), everything=True)
    return [
        {
            "request_id": h.request_id,
            "api_key_id": h.api_key_id,
            "customer_id": h.customer_id,
            "model": h.model,
            "tags": list(h.tags),
            "hold_usd": format_usd(pusd_to_decimal(h.hold_pusd)),
            "created_at": rfc3339(h.created_at),
            "expires_at": rfc3339(h.expires_at),
            "age_s": int((now - h.created_at).total_seconds()),
        }
        for h in sorted(found, key=lambda h: (h.created_at, h.request_id))
        if h.call is None
    ]
