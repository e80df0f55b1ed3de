"""The alerts of the budgets no counter keeps (CONTRACT "Budgets and alerts (v2)" for the alerts,
"Authorizations and holds (v3)" for the budgets: a tag, every call, a model, a rolling window).

Their spend is summed from the calls when asked (``billing.budgets.spent``), so a step keeps no
counter of theirs; it checks them instead (``after_step``): the budgets in force whose scope and
model match any of the step's calls, over the span each such call falls in (the calendar period
of its start, from the version's first; the rolling window at the step's time when the call
started in it), are summed once each and their alerts recorded against those already stored
(``billing.budgets.service.record_summed``, which states the once-per-crossing rule). A rolling
window also slides without a step: ``on_pass``, after each reconciliation pass, checks the
rolling budgets with a crossing not yet resolved.

With no such budget in force a step does nothing here (no statement: the versions in memory,
``billing.budgets.cache``, say so); with some, one statement reads the step's calls and each
matching (budget, span) costs its sum (``BudgetsRepository.call_amounts``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from billing.budgets.cache import InForce, copy_of, in_force
from billing.budgets.periods import period_bounds
from billing.budgets.repository import repository
from billing.budgets.rows import BudgetDef
from billing.budgets.scopes import model_matches, span, tags_of
from billing.budgets.service import CROSSED, RESOLVED, Target, record_summed
from billing.storage.db import read_transaction, write_transaction


def after_step(
    session: Session, budgets: InForce, request_ids: Sequence[str], now: datetime
) -> int:
    """Record the alerts of the budgets in force no counter keeps that count any of the calls
    ``request_ids`` a step just wrote (at ``now``); returns the number of alerts made."""
    summed = budgets.summed
    if not summed or not request_ids:
        return 0
    targets: dict[tuple[int, datetime], Target] = {}
    for call in repository(session).step_calls(session, request_ids):
        if call.started_at is None:
            continue
        tags = tags_of(call.metadata_tags)
        if call.hold_tags is not None:
            tags += json.loads(call.hold_tags)
        for budget in summed.over(call.api_key_id, call.customer_id, tags):
            if not model_matches(budget.model, call.model):
                continue
            if budget.period == "rolling":
                start, end = span(budget, now)
                if call.started_at <= start:
                    continue  # out of the window now
            else:
                start, end = period_bounds(budget.period, budget.tz, call.started_at)
                if start < budget.tracked_from:
                    continue  # before the version's first period
            targets.setdefault((budget.id, start), (budget, start, end))
    return record_summed(session, list(targets.values()), now)


def _rolling(sessions: sessionmaker[Session]) -> list[BudgetDef]:
    """The rolling budgets of the versions this process keeps in memory (loaded when it has
    none yet). The copy may be older than the database's generation, but the process whose
    step recorded a crossing read the budget then, so it has it (until it ends)."""
    bind = sessions.kw.get("bind")
    copy = copy_of(bind.engine) if bind is not None else None
    if copy is None:
        with read_transaction(sessions) as session:
            copy = in_force(session)
    return copy.summed.rolling


def on_pass(sessions: sessionmaker[Session], now: datetime) -> int:
    """After a reconciliation pass at ``now``: resolve (or cross) the thresholds of the rolling
    budgets that have a crossing not yet resolved, their windows having slid since; returns the
    number of alerts made. Nothing without a rolling budget in force (no statement), one read
    without such a crossing, a write transaction only with one."""
    if not _rolling(sessions):
        return 0
    with read_transaction(sessions) as session:
        rolling = {b.budget_id: b for b in in_force(session).summed.rolling}
        crossed = repository(session).open_crossings(session, rolling, CROSSED, RESOLVED)
    ids = sorted({budget_id for budget_id, _ in crossed})
    if not ids:
        return 0
    with write_transaction(sessions) as session:
        current = {b.budget_id: b for b in in_force(session).summed.rolling}
        targets: list[Target] = [(current[i], *span(current[i], now)) for i in ids if i in current]
        return record_summed(session, targets, now)
