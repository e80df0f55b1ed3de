"""Budgets: define, change, end, list; their status, the spend check, alerts
(CONTRACT "Budgets and alerts (v2)").

A budget version keeps its spend in counters (``budget_spend``: settled and provisional
picodollars per period), kept by the reconciler (``billing.budgets.counters``); reading a status
is indexed lookups, never a scan of calls (the spend check: one statement over the versions kept
in memory, ``billing.budgets.cache``). A version fills its first counter (the period it
was created in) from the ledger and the open calls once, when created. Alerts are made where a
counter changes, in the same transaction, with their webhook in the outbox
(``billing.budgets.webhooks`` delivers it). (v3) A budget no counter keeps is summed from the
calls when asked; its alerts are made from that sum against the alerts stored
(``record_summed``, called by ``billing.budgets.summed``).
"""

from __future__ import annotations

import base64
import functools
import json
import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from billing.budgets import cache
from billing.budgets.periods import period_bounds
from billing.budgets.repository import BudgetsRepository, repository
from billing.budgets.rows import BudgetDef, CounterRow, Scope
from billing.budgets.schemas import BudgetChange, BudgetIn
from billing.budgets.scopes import kept_by_counters, scope_json, span
from billing.budgets.spent import Spent, over, spent, summed_spend
from billing.errors import BillingError, NotFound
from billing.money import PICO, format_usd
from billing.paging import cut_page
from billing.storage.models import Budget
from billing.timefmt import rfc3339

CROSSED = "budget.threshold_crossed"
RESOLVED = "budget.threshold_resolved"
#: ``fraction_used`` is shown with this many decimal places, rounded down.
FRACTION_PLACES = Decimal("0.000001")
MAX_ALERTS = 1000

#: A budget version: a row of ``budgets`` or its copy in ``billing.budgets.cache``.
AnyBudget = Budget | BudgetDef


class BudgetExists(BillingError):
    """409: a budget with this ``budget_id`` exists (or existed: its history keeps the id)."""

    status = 409


def _repo(session: Session) -> BudgetsRepository:
    repo: BudgetsRepository = repository(session)
    return repo


def new_alert_id() -> str:
    """``alert_`` + 16 hex digits of the clock (ns, so that a process's alerts sort in the order
    made) + 12 random ones: the webhook's ``webhook-id``."""
    return f"alert_{time.time_ns():016x}{secrets.token_hex(6)}"


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def thresholds_of(budget: AnyBudget) -> list[str]:
    value: list[str] = json.loads(budget.thresholds)
    return value


def budget_json(budget: Budget, secret: bool = False) -> dict[str, Any]:
    """A budget version as answered (``BudgetOut``); the secret only when ``secret``."""
    out: dict[str, Any] = {
        "budget_id": budget.budget_id,
        "version": budget.version,
        "scope": scope_json(budget),
        "limit_usd": budget.limit_usd,
        "measure": budget.measure,
        "period": budget.period,
        "window_s": budget.window_s,
        "model": budget.model,
        "unpriced": budget.unpriced or "allow",
        "tz": budget.tz,
        "thresholds": thresholds_of(budget),
        "webhook_url": budget.webhook_url,
        "created_at": rfc3339(budget.created_at),
        "ended_at": rfc3339(budget.ended_at),
    }
    if secret:
        out["webhook_secret"] = budget.webhook_secret
    return out


# -- definitions ----------------------------------------------------------------------------


def _live(session: Session, budget_id: str) -> Budget:
    versions = _repo(session).versions(session, budget_id)
    if not versions or versions[-1].ended_at is not None:
        state = "was deleted" if versions else "does not exist"
        raise NotFound(f"budget {budget_id!r} {state}")
    return versions[-1]


def create_budget(session: Session, body: BudgetIn, now: datetime) -> dict[str, Any]:
    """Store a new budget (version 1) and fill its current period's counter; the answer holds
    its ``webhook_secret`` (this once). 409 ``BudgetExists`` when the id is taken (or was)."""
    repo = _repo(session)
    versions = repo.versions(session, body.budget_id)
    if versions and versions[-1].ended_at is not None:  # PUT would answer 404: say so
        raise BudgetExists(
            f"budget {body.budget_id!r} was deleted and its id stays taken (its history keeps "
            "it); create the budget under a new budget_id"
        )
    if versions:
        raise BudgetExists(
            f"budget {body.budget_id!r} already exists; "
            "change it with PUT /v1/budgets/{budget_id}"
        )
    try:
        with session.begin_nested():
            budget = _add_version(session, body.budget_id, 1, body, new_secret(), now)
    except IntegrityError:  # a concurrent POST of the same id
        raise BudgetExists(f"budget {body.budget_id!r} already exists") from None
    return budget_json(budget, secret=True)


def update_budget(
    session: Session, budget_id: str, body: BudgetChange, now: datetime
) -> dict[str, Any]:
    """End the version in force and store the next one (its counter filled again). 404 for a
    budget that does not exist or was deleted."""
    old = _live(session, budget_id)
    repo = _repo(session)
    repo.end_budget(session, old.id, now)
    budget = _add_version(session, budget_id, old.version + 1, body, old.webhook_secret, now)
    return budget_json(budget)


def delete_budget(session: Session, budget_id: str, now: datetime) -> dict[str, Any]:
    """End the budget (its versions, counters and alerts stay). 404 as ``update_budget``."""
    old = _live(session, budget_id)
    _repo(session).end_budget(session, old.id, now)
    old.ended_at = now
    return budget_json(old)


def list_budgets(session: Session, include_ended: bool = False) -> list[dict[str, Any]]:
    """The budgets in force (and with ``include_ended`` the last version of ended ones), by id."""
    return [budget_json(b) for b in _repo(session).list_budgets(session, include_ended)]


def _add_version(
    session: Session, budget_id: str, version: int, body: BudgetChange, secret: str, now: datetime
) -> Budget:
    repo = _repo(session)
    # No reconciliation step updates counters while this version fills its first one.
    repo.lock_exclusive(session)
    budget = repo.insert_budget(
        session,
        {
            "budget_id": budget_id,
            "version": version,
            "api_key_id": body.scope.api_key_id,
            "customer_id": body.scope.customer_id,
            "tag": body.scope.tag,
            "model": body.model,
            "measure": body.measure,
            "period": body.period,
            "window_s": body.window_s,
            "unpriced": body.unpriced,
            "tz": body.tz,
            "limit_usd": body.limit_usd,
            "thresholds": json.dumps(body.thresholds),
            "webhook_url": body.webhook_url,
            "webhook_secret": secret,
            # (a rolling window has no counter: nothing is tracked from a period's start)
            "tracked_from": now
            if body.period == "rolling"
            else period_bounds(body.period, body.tz, now)[0],
            "created_at": now,
        },
    )
    if not kept_by_counters(budget):
        # Read from the calls when asked (billing.budgets.spent); its alerts as a step makes
        # them (billing.budgets.summed), for the span in force now.
        record_summed(session, [(budget, *span(budget, now))], now)
        return budget
    start, end = span(budget, now)
    scope: Scope = (
        ("api_key_id", body.scope.api_key_id)
        if body.scope.api_key_id is not None
        else ("customer_id", body.scope.customer_id or "")
    )
    repo.refresh_open(session, scope)
    settled = repo.settled_of(session, scope, body.measure, start, end)
    provisional = repo.provisional_of(session, scope, body.measure, start, end)
    repo.add_spend(session, budget.id, start, settled, provisional)
    record_crossings(session, budget, start, 0, settled, provisional, now)
    return budget


# -- status ---------------------------------------------------------------------------------


def status_json(
    budget: AnyBudget, start: datetime, end: datetime | None, spent: Spent, now: datetime
) -> dict[str, Any]:
    """The contract's budget status (``BudgetStatus``) from a counter's figures."""
    limit = Decimal(budget.limit_usd)
    settled = Decimal(spent.settled_pusd) / PICO
    provisional = Decimal(spent.provisional_pusd) / PICO
    held = Decimal(spent.held_pusd) / PICO
    total = settled + provisional + held
    fraction = (total / limit).quantize(FRACTION_PLACES, rounding=ROUND_FLOOR)
    thresholds = thresholds_of(budget)
    crossed = [t for t in thresholds if total >= limit * Decimal(t)]
    if total >= limit:
        state = "exceeded"
    elif crossed:
        state = "warning"
    else:
        state = "ok"
    return {
        "budget_id": budget.budget_id,
        "scope": scope_json(budget),
        "limit_usd": budget.limit_usd,
        "measure": budget.measure,
        "period": budget.period,
        "period_start": rfc3339(start),
        "period_end": rfc3339(end),
        "spent_usd": format_usd(total),
        "settled_usd": format_usd(settled),
        "provisional_usd": format_usd(provisional),
        "held_usd": format_usd(held),
        "remaining_usd": format_usd(max(limit - total, Decimal(0))),
        "fraction_used": format_usd(max(fraction, Decimal(0))),
        "state": state,
        "thresholds_crossed": crossed,
        "as_of": rfc3339(now),
    }


def statuses(
    budgets: Sequence[AnyBudget], figures: dict[int, Spent], now: datetime
) -> list[dict[str, Any]]:
    """The statuses of ``budgets`` from their figures (``billing.budgets.spent``), in order."""
    return [status_json(b, *span(b, now), figures[b.id], now) for b in budgets]


def _statuses(session: Session, budgets: Sequence[Budget], now: datetime) -> list[dict[str, Any]]:
    return statuses(budgets, spent(session, budgets, now), now)


def statuses_in_force(session: Session, now: datetime, limit: int) -> list[dict[str, Any]]:
    """The status of the first ``limit`` budgets in force, by ``budget_id`` (``/metrics``)."""
    return status_page(session, None, limit, now)[0]


def status_page(
    session: Session, after: str | None, limit: int, now: datetime
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the statuses of the budgets in force, by ``budget_id`` after ``after``, and
    the ``budget_id`` the next page starts after (None: the last); only the page's are
    computed (the console's Budgets page)."""
    budgets, last = cut_page(_repo(session).budget_page(session, after, limit + 1), limit)
    return _statuses(session, budgets, now), None if last is None else last.budget_id


def customer_statuses(
    session: Session, customer_ids: Sequence[str], now: datetime
) -> list[dict[str, Any]]:
    """The status of every budget in force scoped to one of ``customer_ids``, by
    ``budget_id`` (the console's Customers page: only its page's customers)."""
    return _statuses(session, _repo(session).customers_budgets(session, customer_ids), now)


def fullest_statuses(session: Session, now: datetime, limit: int) -> list[dict[str, Any]]:
    """The statuses of the ``limit`` budgets in force whose counters are the fullest
    (``BudgetsRepository.fullest``), fullest first, then the budgets no counter keeps (v3 tag,
    model and rolling budgets); the console's Overview keeps those in ``warning`` or
    ``exceeded``. Only these are computed."""
    repo = _repo(session)
    budgets = repo.fullest(session, now, limit)
    ranked = {b.id for b in budgets}
    budgets += [b for b in repo.uncounted(session) if b.id not in ranked]
    found = _statuses(session, budgets, now)
    return sorted(found, key=lambda s: -Decimal(s["fraction_used"]))


def budget_status(session: Session, budget_id: str, now: datetime) -> dict[str, Any]:
    """``GET /v1/budgets/{budget_id}``: the current period's spend; 404 for an unknown or
    deleted budget."""
    return _statuses(session, [_live(session, budget_id)], now)[0]


def counters_of(rows: Iterable[CounterRow]) -> dict[tuple[int, datetime], tuple[int, int]]:
    """``spend_check_rows``' counters as ``billing.budgets.spent.spent`` takes them: (settled,
    provisional) by (budget row, period start)."""
    return {
        (c.budget_row, c.period_start): (c.settled_pusd, c.provisional_pusd)
        for c in rows
        if c.period_start is not None
    }


def spend_check(session: Session, api_key_id: str, now: datetime) -> dict[str, Any]:
    """``GET /v1/spend``: every budget in force over the key, its customer (the key's
    assignment in force now) or every call (v3: ``{"all": true}``; a tag budget is over no
    key), by ``budget_id``, and ``allowed`` (false when any of them is exceeded).

    One statement (``BudgetsRepository.spend_check_rows``: the generation, the customer and the
    versions' latest counters) over the versions kept in memory (``billing.budgets.cache``;
    loaded again when the generation says they changed), then the holds and the calls not yet
    stepped, and the v3 budgets' calls (``billing.budgets.spent``), all indexed reads. A counter
    that is not of the version's current period (none yet this period) counts 0. Run in one
    read transaction (``billing.storage.db.read_transaction``: one snapshot on PostgreSQL too),
    so that a step committing meanwhile is seen by all of its reads or none."""
    generation, customer, _, rows, _, _ = _repo(session).spend_check_rows(session, api_key_id, now)
    budgets = cache.in_force_at(session, generation)
    # (A version ended between the statement and a reload of the copy is left out.)
    found = over(budgets.near(api_key_id, customer, ()), api_key_id, customer, (), None)
    statuses_ = statuses(found, spent(session, found, now, counters_of(rows)), now)
    return {
        "api_key_id": api_key_id,
        "allowed": all(s["state"] != "exceeded" for s in statuses_),
        "budgets": statuses_,
        "as_of": rfc3339(now),
    }


# -- alerts ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _bars(limit_usd: str, thresholds: str) -> tuple[tuple[str, Decimal], ...]:
    """Each threshold (text) with the spend that reaches it, in picodollars (exact)."""
    limit_pusd = Decimal(limit_usd) * PICO
    return tuple((t, limit_pusd * Decimal(t)) for t in json.loads(thresholds))


def record_crossings(
    session: Session,
    budget: AnyBudget,
    start: datetime,
    old_pusd: int,
    settled_pusd: int,
    provisional_pusd: int,
    now: datetime,
) -> int:
    """Make the alerts of a counter of ``budget`` (period ``start``) going from ``old_pusd``
    spent to ``settled_pusd + provisional_pusd``: ``budget.threshold_crossed`` for each threshold
    it reached upward, ``budget.threshold_resolved`` for each it fell back below; each at most
    once per (budget, period, threshold) (insert-or-skip); with its webhook in the outbox when
    the budget has a URL. Returns how many alerts were made."""
    new_pusd = settled_pusd + provisional_pusd
    if new_pusd == old_pusd:
        return 0
    bars = _bars(budget.limit_usd, budget.thresholds)
    # Crossed upward from the lowest threshold, resolved downward from the highest.
    changes: list[tuple[str, str]] = []
    for t, bar in bars if new_pusd > old_pusd else reversed(bars):
        if old_pusd < bar <= new_pusd:
            changes.append((CROSSED, t))
        elif new_pusd < bar <= old_pusd:
            changes.append((RESOLVED, t))
    if not changes:
        return 0
    _, end = span(budget, start)
    status = status_json(budget, start, end, Spent(settled_pusd, provisional_pusd), now)
    made = 0
    for kind, threshold in changes:
        data = {**status, "budget_id": budget.budget_id, "threshold": threshold}
        made += enqueue_alert(session, budget, kind, threshold, start, data, now)
    return made


#: A budget no counter keeps with a span of it: a calendar period ``[start, end)`` or its
#: rolling window at the time asked (``scopes.span``).
Target = tuple[AnyBudget, datetime, datetime | None]


def record_summed(session: Session, targets: Sequence[Target], now: datetime) -> int:
    """Make the alerts of budgets no counter keeps (v3: a tag, every call, a model, a rolling
    window), each over its span in ``targets`` (each (budget, span) once), from their spend
    summed now (``spent.summed_spend``: the figures reconciliation steps wrote, settled and
    provisional; not the live holds nor the estimates of calls no step has read, as a counter
    does not count them either: a hold is replaced by its call's figure, which alerts when a
    step writes it, or released, and an alert on it would then have been noise). Returns how
    many alerts were made.

    The same alerts, bodies and kinds as ``record_crossings``, but from the spend's level
    against the alerts already stored rather than from a counter's change:

    - a calendar period: ``budget.threshold_crossed`` when the spend is at or above a threshold
      and the (budget, period, threshold) has no crossing yet; ``budget.threshold_resolved``
      when it is below one that was crossed in the period and not yet resolved: once each per
      budget, period and threshold, as v2 (a new period starts with none crossed);
    - a rolling window has no periods: a threshold is crossed from its crossing alert until
      its resolved alert. A crossing is stored under the window's start when it was seen (the
      alert's ``period_start``: ``now − window_s``), its resolution under the same start (its
      pair): a crossing alerts again only after a resolved one. The window slides without a
      step: ``billing.budgets.summed.on_pass`` resolves what it left below.

    Alerts are per ``budget_id``: a new version of the budget (``PUT``) keeps the crossings of
    the earlier ones. The budgets' alert locks (``lock_alerts``, in row order; not the
    admission locks, which an authorization holds while it locks credit grants that a step may
    hold) are held from before the alerts are read to the commit: two steps over one budget
    record one after the other, the second seeing the first one's alerts (read committed)."""
    if not targets:
        return 0
    repo = _repo(session)
    repo.lock_alerts(session, sorted({budget.id for budget, _, _ in targets}))
    periods = {(b.budget_id, start) for b, start, _ in targets if b.period != "rolling"}
    marks = repo.alert_marks(session, periods, (CROSSED, RESOLVED))
    rolling = {b.budget_id for b, _, _ in targets if b.period == "rolling"}
    crossed_now = repo.open_crossings(session, rolling, CROSSED, RESOLVED)
    made = 0
    for budget, start, end in targets:
        settled, provisional = summed_spend(session, budget, start, end)
        total = settled + provisional
        bars = _bars(budget.limit_usd, budget.thresholds)
        # (kind, threshold, the alert's period start): upward from the lowest threshold,
        # resolved downward from the highest.
        changes: list[tuple[str, str, datetime]] = []
        for t, bar in bars:
            if total < bar:
                continue
            if budget.period == "rolling":
                if not crossed_now.get((budget.budget_id, t)):
                    changes.append((CROSSED, t, start))
            elif (budget.budget_id, start, t, CROSSED) not in marks:
                changes.append((CROSSED, t, start))
        for t, bar in reversed(bars):
            if total >= bar:
                continue
            if budget.period == "rolling":
                changes += [(RESOLVED, t, s) for s in crossed_now.get((budget.budget_id, t), [])]
            elif (budget.budget_id, start, t, CROSSED) in marks and (
                budget.budget_id,
                start,
                t,
                RESOLVED,
            ) not in marks:
                changes.append((RESOLVED, t, start))
        if not changes:
            continue
        status = status_json(budget, start, end, Spent(settled, provisional), now)
        for kind, threshold, alert_start in changes:
            data = {**status, "budget_id": budget.budget_id, "threshold": threshold}
            made += enqueue_alert(session, budget, kind, threshold, alert_start, data, now)
    return made


def enqueue_alert(
    session: Session,
    budget: AnyBudget,
    kind: str,
    threshold: str,
    start: datetime,
    data: dict[str, Any],
    now: datetime,
) -> bool:
    """Store one alert ``kind`` of ``budget`` (``{"type", "timestamp", "data"}``) unless its
    (budget, ``start``, ``threshold``, ``kind``) has one, with its webhook in the outbox when the
    budget has a URL (signed with the budget's secret); whether it was stored. Budget alerts and
    (v3) credit alerts (``billing.credits.alerts``) go through it."""
    alert_id = new_alert_id()
    body = json.dumps(
        {"type": kind, "timestamp": rfc3339(now), "data": data}, separators=(",", ":")
    )
    repo = _repo(session)
    inserted = repo.insert_alert(
        session,
        {
            "alert_id": alert_id,
            "budget_id": budget.budget_id,
            "budget_row": budget.id,
            "period_start": start,
            "threshold": threshold,
            "type": kind,
            "created_at": now,
            "body": body,
        },
    )
    if inserted and budget.webhook_url:
        repo.insert_outbox(
            session,
            {
                "alert_id": alert_id,
                "url": budget.webhook_url,
                "state": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            },
        )
    return inserted


def list_alerts(
    session: Session, budget_id: str | None, since: datetime | None
) -> list[dict[str, Any]]:
    """``GET /v1/alerts``: alerts oldest first (at most ``MAX_ALERTS``), each with its delivery
    state (``none`` for a budget without a webhook URL)."""
    out = []
    for alert, box in _repo(session).alerts(session, budget_id, since, MAX_ALERTS):
        if box is None:
            delivery: dict[str, Any] = {
                "state": "none",
                "attempts": 0,
                "last_status": None,
                "last_error": None,
                "next_attempt_at": None,
                "delivered_at": None,
            }
        else:
            delivery = {
                "state": box.state,
                "attempts": box.attempts,
                "last_status": box.last_status,
                "last_error": box.last_error,
                "next_attempt_at": rfc3339(box.next_attempt_at) if box.state == "pending" else None,
                "delivered_at": rfc3339(box.delivered_at),
            }
        out.append(
            {
                "alert_id": alert.alert_id,
                "type": alert.type,
                "budget_id": alert.budget_id,
                "threshold": alert.threshold,
                "period_start": rfc3339(alert.period_start),
                "created_at": rfc3339(alert.created_at),
                "payload": json.loads(alert.body),
                "delivery": delivery,
            }
        )
    return out
