"""A step's reads: its calls' rows (``load_states``), their stored events as the rule reads
them (``load_events``) and what their ledger holds (``load_booked``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from billing.dimensions import Tokens
from billing.plans.rating import plan_prices_by_id
from billing.pricing.service import prices_by_id
from billing.reconcile.ledger import LineKey
from billing.reconcile.repository import ReconcileRepository, repository
from billing.reconcile.state import STATE_COLUMNS, Booked, CallState
from billing.reconcile.stored import AnyEvent, StoredTokens, decode

#: A booked line's row: the request id, the line (``LineKey``), its last seq and last reversal.
_WIDTH = 1 + len(LineKey._fields) + 2


def load_events(
    session: Session, request_ids: Sequence[str], arrivals: dict[str, Any] | None = None
) -> dict[str, list[AnyEvent]]:
    """Every stored event of the given calls as the rule reads them (in no particular order:
    the rule does not depend on it).

    ``arrivals``, when given, receives each call's last arrival: the latest ``received_at`` of
    its events, as the driver returns it (see ``ReconcileRepository.driver_time``). The
    ``calls`` row does not have it while the call is pending (ingest leaves a pending call's row
    alone).

    The ``stream.tokens`` events (most of a call's events) are folded by the database: per call
    and attempt, the largest of each counter (from the columns ingest fills in, see ``Event``)
    and the earliest and latest ``occurred_at``, given to the rule as two events (the earliest
    and the latest) that carry those largest counters. The rule reads nothing else of a
    ``stream.tokens`` event: it keeps the largest of each counter (a smaller one, or one going
    backwards, changes nothing) and the call's earliest and latest ``occurred_at``; so the
    figures are the same as from every event.
    """
    events: dict[str, list[AnyEvent]] = {rid: [] for rid in request_ids}
    if arrivals is None:
        arrivals = {}
    repo: ReconcileRepository = repository(session)
    bodies, folds = repo.read_events(session, request_ids)
    for request_id, body, received in bodies:
        events[request_id].append(decode(body))
        _note_arrival(arrivals, request_id, received)
    utc = repo.utc
    for request_id, attempt, first, last, delivered, generated, received in folds:
        _note_arrival(arrivals, request_id, received)
        group = events[request_id]
        group.append(_folded(request_id, attempt, utc(first), delivered, generated, "first"))
        group.append(_folded(request_id, attempt, utc(last), delivered, generated, "last"))
    return events


def _note_arrival(arrivals: dict[str, Any], request_id: str, received: Any) -> None:
    """Keep the latest ``received_at`` per call (as the driver returns it)."""
    seen = arrivals.get(request_id)
    if seen is None or received > seen:
        arrivals[request_id] = received


def _folded(
    request_id: str, attempt: int, when: Any, delivered: Any, generated: Any, which: str
) -> StoredTokens:
    event = StoredTokens.__new__(StoredTokens)
    event.__dict__ = {
        "type": "stream.tokens",
        # Not an id ingest accepts (it cannot collide with a stored event's).
        "event_id": f"\x00tokens:{attempt}:{which}",
        "request_id": request_id,
        "occurred_at": when,
        "attempt": attempt,
        "output_tokens_delivered": int(delivered),
        "output_tokens_generated": int(generated),
    }
    return event


def load_states(session: Session, request_ids: Sequence[str]) -> dict[str, CallState]:
    """The step's calls as stored; a settled call with its current figures (what the rollups
    hold for it)."""
    repo: ReconcileRepository = repository(session)
    states: dict[str, CallState] = {}
    for request_id, settled, attempts, call_no, *stored in repo.read_states(session, request_ids):
        state = CallState()
        state.request_id = request_id
        state.settled = bool(settled)
        state.attempts = attempts
        state.call_no = call_no
        state.stored = tuple(stored)
        state.settling = False
        states[request_id] = state
    settled_ids = [rid for rid, state in states.items() if state.settled]
    if settled_ids:
        for row in repo.read_settled_states(session, settled_ids, STATE_COLUMNS):
            state = states[row.request_id]
            for name, value in zip(STATE_COLUMNS, row, strict=True):
                setattr(state, name, value)
    return states


def load_booked(session: Session, request_ids: Sequence[str]) -> dict[str, Booked]:
    """What the ledger holds for each of the (settled) calls."""
    repo: ReconcileRepository = repository(session)
    booked: dict[str, Booked] = {}
    price_ids: set[int] = set()
    plan_price_ids: set[int] = set()
    for row in repo.read_booked(session, request_ids):
        request_id, *line, max_seq, last_reversal = row[:_WIDTH]
        *sums, provider_cost = row[_WIDTH:]
        entry = booked.setdefault(request_id, Booked())
        key = LineKey(*line)
        if provider_cost is not None:
            entry.provider_costs[key] = int(provider_cost)
        if key.plan_price_id is not None:
            plan_price_ids.add(key.plan_price_id)
        entry.tokens[key] = Tokens(*(int(s) for s in sums))
        if last_reversal is not None and int(last_reversal) == int(max_seq):
            entry.closed.add(key)
        entry.max_seq = max(entry.max_seq, int(max_seq))
        if key.price_id is not None:
            price_ids.add(key.price_id)
    if booked:
        for request_id, *parts, text in repo.read_booked_units(session, list(booked)):
            line = booked[request_id].units.setdefault(LineKey(*parts), {})
            for name, count in json.loads(text).items():
                line[name] = line.get(name, 0) + int(count)
    if price_ids:
        prices = prices_by_id(session, price_ids)
        for entry in booked.values():
            for key in entry.tokens:
                entry.prices[key] = prices.get(key.price_id) if key.price_id else None
    if plan_price_ids:
        plan_prices = plan_prices_by_id(session, plan_price_ids)
        for entry in booked.values():
            for key in entry.tokens:
                if key.plan_price_id is not None:
                    entry.plan_prices[key] = plan_prices.get(key.plan_price_id)
    return booked
