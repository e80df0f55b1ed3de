"""The budgets' counters, kept by each reconciliation step in its own transaction
(CONTRACT "Budgets and alerts (v2)": spend kept current incrementally, not by scanning calls).

A step changes spend in two ways, and both are read back once per step, set-based, whichever
path (the SQL fast path or the rule) wrote them:

- the ledger entries it booked (``booked_at`` = the step's time): settled spend of the entries'
  key, in the period of the entry's call start;
- the figures of the calls it left open: provisional spend. ``budget_open_calls`` holds what
  each open call adds now; the step takes that back and adds the call's new figures (0 once
  it settled: its entries replace it).

The changes are summed per (key, customer, call start), then per budget version in force over
the key or over the customer (the call's customer at its start, as the step wrote it on the call
and its entries; the versions kept in memory, ``billing.budgets.cache``) and period, and added
to the counters (one upsert for all, returning the new figures); a counter whose spend crossed a
threshold makes its alerts there (``billing.budgets.service.record_crossings``). Periods before a
version's first (``tracked_from``) are not kept. With no budget in force a step does nothing
here but read the budgets' generation (and, on PostgreSQL, take the shared advisory lock that
orders it with a budget's first counter, before that read: a budget made meanwhile has
committed and bumped it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from sqlalchemy.orm import Session

from billing.budgets import summed
from billing.budgets.cache import InForce, in_force
from billing.budgets.periods import period_start
from billing.budgets.repository import repository
from billing.budgets.rows import BudgetDef, OpenAmounts
from billing.budgets.service import record_crossings

#: ``period_start`` remembered: a step's changes are by quarter hour, which repeat.
_period_start = lru_cache(maxsize=16384)(period_start)

#: Per (key, customer or None, call start: its UTC quarter hour for entries): [settled cost,
#: settled charge, provisional cost, provisional charge].
Deltas = dict[tuple[str, str | None, datetime], list[int]]


def after_step(session: Session, request_ids: Sequence[str], now: datetime) -> int:
    """Update the counters for the calls ``request_ids`` a step just wrote (entries booked at
    ``now``); returns the number of alerts made.

    Only the open calls that a budget in force counts (over their key or their customer) are
    kept in ``budget_open_calls``: what is kept is exactly what was added, so a call without a
    budget adds and takes back nothing (a budget made later fills its scope's rows from
    ``calls``, ``BudgetsRepository.refresh_open``). A pass run with a
    fixed ``now`` (tests, benchmarks) must not step the same call twice: its entries are found
    by their booking time.

    Statements: the generation (and the versions when it changed, ``billing.budgets.cache``);
    with a version in force, the step's amounts (one); when one of them is counted, the open
    calls' rows (one or two) and the counters (one). With a budget in force that no counter
    keeps (v3), ``billing.budgets.summed.after_step``'s (none without one).
    """
    if not request_ids:
        return 0
    repo = repository(session)
    repo.lock_shared(session)
    budgets = in_force(session)
    if not budgets.by_row:
        return 0
    amounts = repo.step_amounts(session, request_ids, now)
    by_key, by_customer = budgets.by_key, budgets.by_customer
    deltas: Deltas = defaultdict(lambda: [0, 0, 0, 0])
    for old in amounts.olds:
        d = deltas[(old.api_key_id, old.customer_id, old.started_at)]
        d[2] -= old.cost_pusd
        d[3] -= old.charge_pusd
    still_open: list[OpenAmounts] = []
    for call in amounts.calls:  # open, with a key, a start and an amount
        if call.api_key_id not in by_key and call.customer_id not in by_customer:
            continue
        still_open.append(call)
        d = deltas[(call.api_key_id, call.customer_id, call.started_at)]
        d[2] += call.cost_pusd
        d[3] += call.charge_pusd
    for entry in amounts.entries:
        if entry.api_key_id in by_key or entry.customer_id in by_customer:
            d = deltas[(entry.api_key_id, entry.customer_id, entry.started_at)]
            d[0] += entry.cost_pusd
            d[1] += entry.charge_pusd
    if amounts.olds or still_open:
        kept = {c.request_id for c in still_open}
        gone = [o.request_id for o in amounts.olds if o.request_id not in kept]
        repo.replace_open(session, [rid for rid in gone if rid is not None], still_open)
    made = apply(session, {k: v for k, v in deltas.items() if any(v)}, now, budgets)
    # (v3) The budgets no counter keeps: summed and checked (none in force: no statement).
    return made + summed.after_step(session, budgets, request_ids, now)


def apply(
    session: Session,
    deltas: Deltas,
    now: datetime,
    budgets: InForce | None = None,
) -> int:
    """Add ``deltas`` to the counters of the budgets in force over their keys and customers
    (``budgets`` as ``billing.budgets.cache.in_force`` gives them, read when None), making the
    alerts of the thresholds crossed; returns the alerts made."""
    if not deltas:
        return 0
    if budgets is None:
        budgets = in_force(session)
    repo = repository(session)
    # Per (budget row, period start): [settled, provisional] in the budget's measure.
    sums: dict[tuple[int, datetime], list[int]] = defaultdict(lambda: [0, 0])
    rows: dict[int, BudgetDef] = {}
    for (key, customer, started), d in deltas.items():
        for budget in budgets.over(key, customer):
            start = _period_start(budget.period, budget.tz, started)
            if start < budget.tracked_from:
                continue
            rows[budget.id] = budget
            s = sums[(budget.id, start)]
            if budget.measure == "cost":
                s[0] += d[0]
                s[1] += d[2]
            else:
                s[0] += d[1]
                s[1] += d[3]
    # Counters in key order: one lock order for every reconciler; one statement.
    changes = [(row, start, d[0], d[1]) for (row, start), d in sorted(sums.items()) if any(d)]
    news = repo.add_spends(session, changes)
    made = 0
    for row, start, settled, provisional in changes:
        new_settled, new_provisional = news[(row, start)]
        old = new_settled + new_provisional - settled - provisional
        made += record_crossings(session, rows[row], start, old, new_settled, new_provisional, now)
    return made
