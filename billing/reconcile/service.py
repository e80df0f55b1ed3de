"""Reconciliation steps: recompute pending calls, settle, write the ledger.

One step handles a bounded batch of calls in one transaction: it locks their rows (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL, so two servers never work on the same call; SQLite has one writer at a
time), recomputes their figures from the events with the pure rule, books the difference in the
ledger, and clears ``pending``. Its SQL is the store's (``ReconcileRepository``). Source:
CONTRACT "Reconciliation" and "Cost".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from billing.archive.service import park_archived
from billing.budgets import authorize as holds
from billing.budgets import counters as budget_counters
from billing.credits import draws as credit_draws
from billing.dimensions import set_tokens
from billing.plans.rating import Rating
from billing.pricing.service import price_book
from billing.reconcile.entries import Entry, anomalies_of, call_charge, call_cost, target_lines
from billing.reconcile.fastpath import settle_common
from billing.reconcile.ledger import SETTLED_COMPLETE, plan_entries, settled_timed_out
from billing.reconcile.reads import load_booked, load_events, load_states
from billing.reconcile.repository import repository
from billing.reconcile.rows import CommonCharge, Update
from billing.reconcile.rule import CallFigures, check_figures, reconcile_call
from billing.reconcile.state import NOTHING_BOOKED, CallState, new_state, other_models_json
from billing.rollups import drift as drift_rollup
from billing.rollups import service as rollups
from billing.rollups.rows import Contributions
from billing.storage.models import Call

__all__ = [
    "StepResult",
    "call_cost",
    "due_calls",
    "load_events",
    "lock_call",
    "pending_horizon",
    "preview_call",
    "reconcile_calls",
    "reconcile_step",
    "settle_common",
    "target_lines",
]


@dataclass
class StepResult:
    """What one step (or a whole pass) did: calls examined, settled, and adjustments written."""

    examined: int = 0
    settled: int = 0
    adjusted: int = 0
    settled_ids: list[str] = field(default_factory=list)

    def add(self, other: StepResult) -> None:
        self.examined += other.examined
        self.settled += other.settled
        self.adjusted += other.adjusted
        self.settled_ids.extend(other.settled_ids)


def due_calls(
    session: Session,
    now: datetime,
    settle_after_s: float,
    limit: int,
    *,
    lock: bool = True,
    pending_before: datetime | None = None,
) -> list[str]:
    """Lock and return up to ``limit`` calls that need work: open ones whose last event arrived
    ``settle_after_s`` seconds ago or earlier (oldest first), then pending ones (oldest first;
    with ``pending_before``, only those pending since that instant or earlier). Rows locked by
    another reconciler are skipped. With ``lock=False`` the rows are only listed (a read
    transaction).

    ``last_received_at`` (see ``Call``) is the arrival of the last event of a call that is not
    pending, and of the events that made a pending call pending (so pending calls are taken in
    the order they started waiting).
    """
    cutoff = now - timedelta(seconds=settle_after_s)
    return repository(session).due_calls(session, cutoff, limit, lock, pending_before)


def pending_horizon(session: Session) -> datetime | None:
    """The latest ``last_received_at`` among the calls pending now (None: none is): as
    ``due_calls``' ``pending_before``, it takes every call pending now, whatever the clocks that
    stamped them (a host whose clock runs ahead, a value the reconciler wrote back); a call made
    pending later is left to the next pass unless stamped no later than that."""
    return repository(session).pending_horizon(session)


def reconcile_step(
    session: Session,
    now: datetime,
    settle_after_s: float,
    limit: int,
    *,
    common_in_sql: bool = True,
    pending_before: datetime | None = None,
) -> StepResult:
    """Do one bounded step inside the caller's transaction (the caller commits).

    Returns what was done; ``examined`` is 0 when no call needed work. ``common_in_sql``: see
    ``reconcile_calls``; ``pending_before``: see ``due_calls``.
    """
    request_ids = due_calls(session, now, settle_after_s, limit, pending_before=pending_before)
    return reconcile_calls(session, request_ids, now, settle_after_s, common_in_sql=common_in_sql)


def reconcile_calls(
    session: Session,
    request_ids: Sequence[str],
    now: datetime,
    settle_after_s: float,
    *,
    common_in_sql: bool = True,
) -> StepResult:
    """Recompute, settle and book the given (already locked) calls.

    Set-based: the calls of the common shape are settled by the database
    (``billing.reconcile.fastpath``; not with ``common_in_sql=False``, which gives the same rows
    more slowly); the others are read in a few statements for the whole batch, figured by the
    rule, then written with one statement (or one ``executemany``) per table: the calls, their
    attempts, the ledger entries, the rollups.
    """
    result = StepResult(examined=len(request_ids))
    if not request_ids:
        return result
    # A settled call with events in an archived month is not rebuilt from the rest of them.
    parked = park_archived(session, request_ids, now)
    if parked:
        request_ids = [rid for rid in request_ids if rid not in parked]
    deltas = rollups.Deltas()
    every = list(request_ids)
    # The calls the fast path settles were not settled: the drift rollup held none of them.
    common: list[str] = []
    # Their contributions to the drift rollup, summed by the fast path.
    common_drift: Contributions = {}
    # Their keys and charges, for the credit draws.
    common_charged: list[CommonCharge] = []
    if common_in_sql:
        common = settle_common(
            session, request_ids, now, settle_after_s, deltas, common_drift, common_charged
        )
        if common:
            result.settled += len(common)
            result.settled_ids.extend(common)
            done = set(common)
            request_ids = [rid for rid in request_ids if rid not in done]
            if not request_ids:
                credit_draws.after_step(session, [], {}, now, common_charged)
                rollups.after_step(session, {}, [], [], deltas)
                drift_rollup.after_writes(session, {}, [], common_drift)
                budget_counters.after_step(session, every, now)
                holds.settle_holds(session, result.settled_ids, now)
                return result
    repo = repository(session)
    states = load_states(session, request_ids)
    rolled_up = rollups.before_step(session, states.values())
    arrivals: dict[str, Any] = {}
    events = load_events(session, request_ids, arrivals)
    figures = {rid: reconcile_call(rid, evs) for rid, evs in events.items() if evs}
    for figured in figures.values():
        check_figures(figured)
    models = {m for f in figures.values() for m in _models(f)}
    book = price_book(session, models)
    rating = Rating.load(session, (f.api_key_id for f in figures.values()))
    booked = load_booked(session, [rid for rid, state in states.items() if state.settled])
    # Compared with the stored value as the driver returns it.
    cutoff = repo.driver_time(now - timedelta(seconds=settle_after_s))
    entries: list[Entry] = []
    updates: list[Update] = []
    after: list[CallState] = []
    for request_id in request_ids:
        call = states[request_id]
        fig = figures.get(request_id)
        if fig is None:
            after.append(call)
            continue
        lines = target_lines(fig, book, rating)
        cost = call_cost(lines)
        terms = rating.terms(fig.api_key_id, fig.started_at)
        charged = (terms.customer_id, terms.plan_id, *call_charge(lines))
        # The row's last_received_at is not updated by the later events of a pending call.
        arrival = arrivals.get(request_id)
        if arrival is None or arrival < call.stored[0]:
            arrival = call.stored[0]
        timed_out = arrival <= cutoff
        settle = call.settled or fig.complete or timed_out
        if settle:
            record = booked.get(request_id) or NOTHING_BOOKED
            reason = SETTLED_COMPLETE if fig.complete else settled_timed_out(settle_after_s)
            planned = plan_entries(
                lines,
                record.tokens,
                record.prices,
                request_id in booked,
                reason,
                record.closed,
                record.units,
                record.plan_prices,
                record.provider_costs,
            )
            seq = record.max_seq
            for new in planned:
                seq += 1
                entries.append(Entry(request_id, seq, new, fig, now))
                if new.kind == "adjustment":
                    result.adjusted += 1
            if not call.settled:
                result.settled += 1
                result.settled_ids.append(request_id)
        state = new_state(call, fig, cost, settle, anomalies_of(fig, cost), charged)
        state.arrival = arrival
        updates.append((call, state, fig))
        after.append(state)
    drift_before = drift_rollup.before_writes(session, (old for old, _, _ in updates))
    repo.write_calls(session, updates, now)
    repo.write_attempts(session, updates)
    repo.write_entries(session, entries)
    numbers = {rid: state.call_no for rid, state in states.items()}
    credit_draws.after_step(session, entries, numbers, now, common_charged)
    rollups.after_step(session, rolled_up, after, entries, deltas)
    held = [new.request_id for _, new, _ in updates if drift_rollup.holds(new)]
    drift_rollup.after_writes(session, drift_before, held, common_drift)
    budget_counters.after_step(session, every, now)
    holds.settle_holds(session, result.settled_ids, now)
    return result


def preview_call(session: Session, call: Call) -> None:
    """Put the call's provisional figures (from its events, not yet reconciled) on ``call``.

    For reading only: the caller must not commit the session afterwards.
    """
    events = load_events(session, [call.request_id])[call.request_id]
    if not events:
        return
    fig = reconcile_call(call.request_id, events)
    check_figures(fig)
    rating = Rating.load(session, [fig.api_key_id])
    lines = target_lines(fig, price_book(session, _models(fig)), rating)
    _apply(call, fig, call_cost(lines), call.settled, call.settled_at or datetime.now(UTC))
    terms = rating.terms(fig.api_key_id, fig.started_at)
    call.customer_id, call.plan_id = terms.customer_id, terms.plan_id
    call.charge_pusd, call.leakage_pusd = call_charge(lines)


def _models(fig: CallFigures) -> list[str]:
    """The models whose prices the call's lines need: its attempts' and their other models'."""
    return [m for a in fig.attempts for m in (a.model, *a.other_models) if m]


#: The attributes of a ``Call`` that are the figures' own.
_AS_FIGURED: tuple[str, ...] = ("api_key_id", "model", "protocol", "started_at", "ended_at")
_AS_FIGURED += ("usage_source", "error_type", "stop_reason")


def _apply(call: Call, fig: CallFigures, cost: int | None, settle: bool, now: datetime) -> None:
    for name in _AS_FIGURED:
        setattr(call, name, getattr(fig, name))
    call.metadata_ = fig.metadata
    call.status = fig.status if settle else "open"
    if settle and not call.settled:
        call.settled = True
        call.settled_at = now
    call.attempts = len(fig.attempts)
    set_tokens(call, fig.tokens)
    call.cost_pusd = cost
    call.anomalies = anomalies_of(fig, cost)
    call.service_tier = fig.service_tier
    call.units = fig.units or None
    call.other_models = json.loads(other_models_json(fig)) if fig.other_models else None
    call.counters = fig.counters or None
    call.provider_cost_pusd = fig.provider_cost_pusd
    call.inference_geo = fig.inference_geo
    call.pending = False


def lock_call(session: Session, request_id: str) -> bool:
    """Lock one call's row for this transaction; False when another reconciler holds it."""
    return repository(session).lock_call(session, request_id)
