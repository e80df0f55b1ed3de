"""A call's billable lines and their cost, and the ledger entries a step writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from billing.dimensions import TOKEN_FIELDS, Tokens, set_tokens
from billing.pricing.prices import PriceBook
from billing.pricing.rates import RATES
from billing.reconcile.ledger import Line, LineKey, NewEntry
from billing.reconcile.rule import UNPRICED, CallFigures

#: The rates of an unpriced entry.
_NO_RATES: tuple[None, ...] = (None,) * len(RATES)


def target_lines(figures: CallFigures, book: PriceBook) -> list[Line]:
    """The call's billable lines: its attempts grouped by model, each priced at the call's start."""
    by_model: dict[str | None, Tokens] = {}
    for attempt in figures.attempts:
        summed = by_model.get(attempt.model)
        by_model[attempt.model] = attempt.tokens if summed is None else summed + attempt.tokens
    lines = []
    for model, tokens in by_model.items():
        price = book.at(model, figures.started_at)
        key = LineKey(figures.api_key_id, model, price.id if price else None)
        lines.append(Line(key, tokens, price))
    return lines


def call_cost(lines: Sequence[Line]) -> int | None:
    """The call's exact cost in picodollars, or None when any line is unpriced."""
    total = 0
    for line in lines:
        if line.price is None:
            return None
        total += line.price.cost_pusd(line.tokens)
    return total


def anomalies_of(fig: CallFigures, cost: int | None) -> list[str]:
    """The call's anomaly codes: the rule's, and ``unpriced`` when it has no cost."""
    if cost is None and UNPRICED not in fig.anomalies:
        return sorted({*fig.anomalies, UNPRICED})
    return list(fig.anomalies)


class Entry:
    """A new ledger entry (see ``LedgerEntry``; ``rollups.EntryLike``): one attribute per token
    bucket, named as in ``TOKEN_FIELDS``."""

    __slots__ = (
        "api_key_id",
        "booked_at",
        "call_started_at",
        "cost_pusd",
        "kind",
        "model",
        "price",
        "protocol",
        "reason",
        "request_id",
        "seq",
        "status",
        "tokens",
        *TOKEN_FIELDS,
    )

    def __init__(
        self, request_id: str, seq: int, new: NewEntry, fig: CallFigures, now: datetime
    ) -> None:
        self.request_id = request_id
        self.seq = seq
        self.kind = new.kind
        self.reason = new.reason
        self.booked_at = now
        self.api_key_id = new.key.api_key_id
        self.model = new.key.model
        self.protocol = fig.protocol
        self.status = fig.status
        self.call_started_at = fig.started_at
        self.price = new.price
        self.cost_pusd = new.cost_pusd
        self.tokens = new.tokens
        set_tokens(self, new.tokens)

    def __getattr__(self, name: str) -> int:
        # Only reached for a slot not set: mypy reads the token buckets through here.
        raise AttributeError(name)

    def row(self, booked_at: Any, time: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
        """The values of ``ENTRY_COLUMNS`` (``booked_at`` and times as the driver takes them)."""
        price = self.price
        return (
            self.request_id,
            self.seq,
            self.kind,
            self.reason,
            booked_at,
            self.api_key_id,
            self.model,
            self.protocol,
            self.status,
            time(self.call_started_at),
            *self.tokens.values(),
            price.id if price else None,
            *(price.rates if price else _NO_RATES),
            self.cost_pusd,
        )
