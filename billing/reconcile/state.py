"""A step's view of its calls: each call's row before the step, its state after, and what its
ledger holds already."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from billing.dimensions import TOKEN_FIELDS, Tokens, set_tokens
from billing.pricing.prices import PriceRow
from billing.reconcile.ledger import LineKey
from billing.reconcile.rule import CallFigures

#: The columns of ``calls`` a step reads of a settled call: what the rollups placed the call
#: under, and the rest of its state that decides the step's writes.
STATE_COLUMNS = (
    "request_id",
    "settled",
    "status",
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
    "leakage_pusd",
    *TOKEN_FIELDS,
)


class CallState:
    """A call's row as a step reads it (before) or writes it (after); see ``rollups.CallLike``
    (one attribute per token bucket, named as in ``TOKEN_FIELDS``).

    Read back, an open call only carries what the step needs (``rollups.place_call`` reads no
    more of a call that is not settled); ``stored`` holds the raw ``last_received_at`` and the
    identity columns (api key, model, start) as the driver returned them.
    """

    __slots__ = (*STATE_COLUMNS, "arrival", "call_no", "settling", "stored")

    request_id: str
    settled: bool
    status: str
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
    leakage_pusd: int | None
    settling: bool
    stored: tuple[Any, ...]
    #: The call's number (``calls.call_no``).
    call_no: int
    #: The last arrival among the call's events (as the driver returns times; see load_events).
    arrival: Any

    def __getattr__(self, name: str) -> int:
        # Only reached for a slot not set yet: mypy reads the token buckets through here.
        raise AttributeError(name)


def new_state(
    old: CallState,
    fig: CallFigures,
    cost: int | None,
    settle: bool,
    anomalies: list[str],
    charged: tuple[str | None, str | None, int | None, int | None] = (None, None, None, 0),
) -> CallState:
    """The call's state after the step: ``fig`` and its cost, settled if ``settle``;
    ``charged``: its customer, plan and charge (v2) and leakage (v3)."""
    new = CallState()
    new.request_id = old.request_id
    new.settled = old.settled or settle
    # As the step writes it (``billing.reconcile.sql.common``): the figures' once settled.
    new.status = fig.status if new.settled else "open"
    new.settling = settle and not old.settled
    new.stored = old.stored
    new.call_no = old.call_no
    new.started_at = fig.started_at
    new.api_key_id = fig.api_key_id
    new.model = fig.model
    new.anomalies = anomalies
    new.cost_pusd = cost
    new.customer_id, new.plan_id, new.charge_pusd, new.leakage_pusd = charged
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
    #: (v3) The provider's own cost booked per line, for the lines that have one.
    provider_costs: dict[LineKey, int | None] = field(default_factory=dict)


NOTHING_BOOKED = Booked()


def other_models_json(fig: CallFigures) -> str:
    """The call's ``other_models`` as JSON text: ``[{"model", input_tokens, output_tokens,
    cache_read_input_tokens, cache_creation_input_tokens}]`` by model (CONTRACT "Usage
    dimensions (v2)")."""
    return json.dumps(
        [
            {
                "model": model,
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens_billed,
                "cache_read_input_tokens": t.cache_read_input_tokens,
                "cache_creation_input_tokens": t.cache_creation_input_tokens,
            }
            for model, t in fig.other_models.items()
        ]
    )
