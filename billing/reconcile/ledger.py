"""Turning a call's target figures into ledger entries: settle once, then adjust by differences.

Source: CONTRACT "Reconciliation". Entries are only ever added. A call's booked figures are the
sum of its entries per *line* (api key, model, price); the next entries are the difference between
the target lines and what is booked: an adjustment when a line's tokens change; a reversal of the
old line plus a new settlement when the key or model changed; a reversal plus a re-post at the new
rates when the price changed (for example a model that was priced after it was settled).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import NamedTuple

from billing.dimensions import TOKEN_FIELDS, Tokens
from billing.pricing.prices import PriceRow
from billing.pricing.rates import RATE_COLUMNS


class LineKey(NamedTuple):
    """What a ledger line is booked under: the key, the model and the price id (None: unpriced)."""

    api_key_id: str | None
    model: str | None
    price_id: int | None

    def sort_key(self) -> tuple[str, str, int]:
        return (self.api_key_id or "", self.model or "", self.price_id or 0)


@dataclass(slots=True)
class Line:
    """Target tokens of one line and the price that applies to it (None: unpriced)."""

    key: LineKey
    tokens: Tokens
    price: PriceRow | None


@dataclass(slots=True)
class NewEntry:
    """A ledger entry to write: ``kind`` settlement|adjustment, signed token deltas, its price."""

    kind: str
    reason: str
    key: LineKey
    tokens: Tokens
    price: PriceRow | None
    cost_pusd: int | None


def _cost(tokens: Tokens, price: PriceRow | None) -> int | None:
    return None if price is None else price.cost_pusd(tokens)


def _describe(delta: Tokens) -> str:
    changes = [
        f"{name} {value:+d}"
        for name, value in delta.as_dict().items()
        if value and name in TOKEN_FIELDS
    ]
    return ", ".join(changes)


#: The longest reason the ledger stores (``ledger_entries.reason`` is a VARCHAR(200)).
MAX_REASON = 200


def _late(delta: Tokens) -> str:
    # With every bucket changed by large amounts the text would not fit; the entry's own columns
    # hold the exact deltas, so the reason may be cut.
    changes = _describe(delta)
    if not changes:
        return "late events added a line with no tokens yet"
    reason = f"late events changed the usage: {changes}"
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"


#: The reason of a settlement when every attempt has upstream usage (CONTRACT "Reconciliation").
SETTLED_COMPLETE = "settled: upstream usage for every attempt"


def settled_timed_out(settle_after_s: float) -> str:
    """The reason of a settlement on the clock: no event for ``settle_after_s`` seconds (CONTRACT
    "Reconciliation")."""
    return f"settled: no event for {settle_after_s:g} s"


#: The columns a new ledger entry is written with (``entry_id`` is the database's), in order.
ENTRY_COLUMNS = (
    "request_id",
    "seq",
    "kind",
    "reason",
    "booked_at",
    "api_key_id",
    "model",
    "protocol",
    "status",
    "call_started_at",
    *TOKEN_FIELDS,
    "price_id",
    *RATE_COLUMNS,
    "cost_pusd",
)

#: The reason of an entry that reverses a line in full; a line whose latest entry has it is closed.
REVERSAL_REASON = "reversal: the call's api key, model or price changed"
#: What every reversal's reason starts with (``LIKE 'reversal:%'`` finds them in the ledger).
REVERSAL_PREFIX = "reversal:"


def plan_entries(
    target: list[Line],
    booked: Mapping[LineKey, Tokens],
    booked_prices: Mapping[LineKey, PriceRow | None],
    has_entries: bool,
    settle_reason: str,
    closed: AbstractSet[LineKey],
) -> list[NewEntry]:
    """The entries that bring the booked lines to the target lines (empty when they agree).

    ``booked`` holds the summed token deltas per line so far, ``booked_prices`` the price each
    line was booked at and ``closed`` the lines whose latest entry reversed them; every other
    booked line is open, even at zero tokens (a call settled before any usage still has its
    line). ``has_entries`` tells whether the call has any entry yet. An open line that is no
    longer a target is reversed in full, and a target line that is not open gets an entry, both
    even at zero tokens, so the ledger always names the call's key, model and price.
    Source: CONTRACT "Reconciliation".
    """
    if not has_entries:
        if len(target) == 1:  # most calls: one line, nothing to order
            (only,) = target
            return [
                NewEntry(
                    "settlement",
                    settle_reason,
                    only.key,
                    only.tokens,
                    only.price,
                    _cost(only.tokens, only.price),
                )
            ]
        return [
            NewEntry(
                "settlement",
                settle_reason,
                line.key,
                line.tokens,
                line.price,
                _cost(line.tokens, line.price),
            )
            for line in sorted(target, key=lambda line: line.key.sort_key())
        ]
    live = {key: tokens for key, tokens in booked.items() if key not in closed}
    targets = {line.key: line for line in target}
    # A new line whose key and model stay, but at another price, is a re-pricing of the line that
    # is reversed; a new settlement follows only a reversal of another key or model; a line that
    # is merely new (say a late attempt on another model) is a change of the same settled call.
    reversed_pairs = {(key.api_key_id, key.model) for key in live if key not in targets}
    reversing = bool(reversed_pairs)
    entries: list[NewEntry] = []
    for key in sorted(set(live) | set(targets), key=LineKey.sort_key):
        was = live.get(key, Tokens())
        line = targets.get(key)
        now = line.tokens if line else Tokens()
        delta = now - was
        if key in live and line is not None:
            if delta.is_zero():
                continue
            entries.append(
                NewEntry(
                    "adjustment", _late(delta), key, delta, line.price, _cost(delta, line.price)
                )
            )
        elif line is None:
            price = booked_prices.get(key)
            entries.append(
                NewEntry("adjustment", REVERSAL_REASON, key, delta, price, _cost(delta, price))
            )
        elif (key.api_key_id, key.model) in reversed_pairs:
            reason = (
                "re-priced: the model's price in force at the call's start changed"
                if line.price is not None
                else "re-booked without a price"
            )
            entries.append(
                NewEntry("adjustment", reason, key, delta, line.price, _cost(delta, line.price))
            )
        elif not reversing:
            entries.append(
                NewEntry(
                    "adjustment", _late(delta), key, delta, line.price, _cost(delta, line.price)
                )
            )
        else:
            reason = "settled again after the call's api key or model changed"
            entries.append(
                NewEntry("settlement", reason, key, delta, line.price, _cost(delta, line.price))
            )
    # Reversals first, so the entries read in the order an accountant would book them.
    entries.sort(key=lambda e: 0 if e.reason.startswith(REVERSAL_PREFIX) else 1)
    return entries
