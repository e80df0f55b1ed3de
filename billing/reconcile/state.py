"""A step's view of its calls: each call's row before the step, its state after, and what its
ledger holds already."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS, Tokens, set_tokens
from billing.plans.rating import plan_prices_by_id
from billing.pricing.prices import PriceRow, prices_by_id
from billing.reconcile.ledger import LineKey
from billing.reconcile.repository import ReconcileRepository
from billing.reconcile.rule import CallFigures
from billing.storage.store import store_for

#: The columns of ``calls`` a step reads of a settled call: what the rollups placed the call
#: under, and the rest of its state that decides the step's writes.
STATE_COLUMNS = (
    "request_id",
    "settled",
    "last_received_at",
    "started_at",
    "api_key_id",
    "model",
    "anomalies",
    "cost_pusd",
    "attempts",
    "customer_id",
    "plan_id",
    "charge_pusd",
    *TOKEN_FIELDS,
)


class CallState:
    """A call's row as a step reads it (before) or writes it (after); see ``rollups.CallLike``
    (one attribute per token bucket, named as in ``TOKEN_FIELDS``).

    Read back, an open call only carries what the step needs (``rollups.place_call`` reads no
    more of a call that is not settled); ``stored`` holds the raw ``last_received_at`` and the
    identity columns (api key, model, start) as the driver returned them.
    """

    __slots__ = (*STATE_COLUMNS, "arrival", "settling", "stored")

    request_id: str
    settled: bool
    last_received_at: datetime
    started_at: datetime | None
    api_key_id: str | None
    model: str | None
    anomalies: list[str]
    cost_pusd: int | None
    attempts: int
    customer_id: str | None
    plan_id: str | None
    charge_pusd: int | None
    settling: bool
    stored: tuple[Any, ...]
    #: The last arrival among the call's events (as the driver returns times; see load_events).
    arrival: Any

    def __getattr__(self, name: str) -> int:
        # Only reached for a slot not set yet: mypy reads the token buckets through here.
        raise AttributeError(name)


def load_states(session: Session, request_ids: Sequence[str]) -> dict[str, CallState]:
    """The step's calls as stored; a settled call with its current figures (what the rollups
    hold for it)."""
    repo: ReconcileRepository = store_for(session).reconcile
    states: dict[str, CallState] = {}
    for request_id, settled, attempts, *stored in repo.read_states(session, request_ids):
        state = CallState()
        state.request_id = request_id
        state.settled = bool(settled)
        state.attempts = attempts
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


def new_state(
    old: CallState,
    fig: CallFigures,
    cost: int | None,
    settle: bool,
    anomalies: list[str],
    charged: tuple[str | None, str | None, int | None] = (None, None, None),
) -> CallState:
    """The call's state after the step: ``fig`` and its cost, settled if ``settle``;
    ``charged``: its customer, plan and charge (v2)."""
    new = CallState()
    new.request_id = old.request_id
    new.settled = old.settled or settle
    new.settling = settle and not old.settled
    new.stored = old.stored
    new.started_at = fig.started_at
    new.api_key_id = fig.api_key_id
    new.model = fig.model
    new.anomalies = anomalies
    new.cost_pusd = cost
    new.customer_id, new.plan_id, new.charge_pusd = charged
    new.attempts = len(fig.attempts)
    set_tokens(new, fig.tokens)
    return new


@dataclass
class Booked:
    """A settled call's ledger: tokens and price per line, the closed lines, the last seq."""

    tokens: dict[LineKey, Tokens] = field(default_factory=dict)
    prices: dict[LineKey, PriceRow | None] = field(default_factory=dict)
    closed: set[LineKey] = field(default_factory=set)
    max_seq: int = 0
    #: (v2) Units per line (name → summed count), for the lines that have any.
    units: dict[LineKey, dict[str, int]] = field(default_factory=dict)
    #: (v2) The plan price each line was charged at, for the lines that have one.
    plan_prices: dict[LineKey, PriceRow | None] = field(default_factory=dict)


NOTHING_BOOKED = Booked()


def load_booked(session: Session, request_ids: Sequence[str]) -> dict[str, Booked]:
    """What the ledger holds for each of the (settled) calls."""
    repo: ReconcileRepository = store_for(session).reconcile
    booked: dict[str, Booked] = {}
    price_ids: set[int] = set()
    plan_price_ids: set[int] = set()
    for row in repo.read_booked(session, request_ids):
        request_id, *line, max_seq, last_reversal = row[:10]
        sums = row[10:]
        entry = booked.setdefault(request_id, Booked())
        key = LineKey(*line)
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
