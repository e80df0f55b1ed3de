"""The rows that cross the budgets' repository (``billing.budgets.repository``). Amounts are
picodollars (``*_pusd``); ``cost`` and ``charge`` are the two measures
(``billing.budgets.measure``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

#: A budget's scope as a column of ``calls`` / ``ledger_entries`` / ``budget_open_calls`` and
#: its value: ``("api_key_id", key)`` or ``("customer_id", customer)``.
Scope = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BudgetDef:
    """A budget version in force as ``billing.budgets.cache`` keeps it: the columns of
    ``billing.storage.models.Budget`` that the counters, the statuses and the alerts read."""

    id: int
    budget_id: str
    api_key_id: str | None
    customer_id: str | None
    measure: str
    period: str
    tz: str
    limit_usd: str
    thresholds: str
    webhook_url: str | None
    tracked_from: datetime
    # (v3) a tag scope, a model filter, a rolling window, what an unpriced model gets.
    tag: str | None = None
    model: str | None = None
    window_s: int | None = None
    unpriced: str | None = None


class OpenAmounts(NamedTuple):
    """What an open call adds to provisional spend (``budget_open_calls``)."""

    request_id: str | None
    api_key_id: str
    customer_id: str | None
    started_at: datetime
    cost_pusd: int
    charge_pusd: int


@dataclass(frozen=True, slots=True)
class StepAmounts:
    """What a reconciliation step changed (``BudgetsRepository.step_amounts``): ``olds``, the
    ``budget_open_calls`` rows of its calls; ``calls``, its calls left open with a key, a start
    and an amount (their figures now); ``entries``, the entries it booked summed per key,
    customer (the call's, at its start) and UTC quarter hour of the call's start (``started_at``
    is that quarter's start; ``request_id`` is None)."""

    olds: list[OpenAmounts]
    calls: list[OpenAmounts]
    entries: list[OpenAmounts]


class CounterRow(NamedTuple):
    """A budget version's counter: its (settled, provisional) spend in the period from
    ``period_start`` (None: the version has no counter at or before the time asked)."""

    budget_row: int
    period_start: datetime | None
    settled_pusd: int
    provisional_pusd: int


class SpendCheckRows(NamedTuple):
    """``spend_check_rows``: the budgets' generation (None: no row), the key's customer now,
    whether that customer is ``credit_required`` (False without one: for the authorization's
    credit check, read in the same statement), the counters of the versions over either, the
    price rows' numbers of the model asked and the key's plan now with its versions' numbers
    (the authorization's estimate)."""

    generation: int | None
    customer_id: str | None
    credit_required: bool
    counters: list[CounterRow]
    #: ``model`` (when asked) → (its price rows, their highest id), absent without any:
    #: ``billing.pricing.cache.price_book``'s ``versions``.
    prices: dict[str, tuple[int, int]]
    #: The plan of the key's assignment in force now, with its versions' count and highest id
    #: (``billing.plans.cache.terms_now``' ``plan``), when a model was asked; else None
    #: (none asked, or no plan).
    plan: tuple[str, int, int] | None


class Claimed(NamedTuple):
    """A webhook claimed for delivery."""

    alert_id: str
    url: str
    body: str
    secret: str
    attempts: int
    created_at: datetime


class StoredHold(NamedTuple):
    """A stored authorization (``budget_holds``) as a repeated authorization or a release
    reads it: its hold, the hash of its body, its first answer (JSON) and when it ends."""

    request_id: str
    hold_pusd: int
    body_hash: str
    answer: str
    expires_at: datetime
    released_at: datetime | None


class LiveHold(NamedTuple):
    """A hold not released and not expired (``budget_holds``) whose call has not settled, with
    its call's state: ``call`` is None without a call, ``"unstepped"`` for a call no
    reconciliation step has read yet (the hold stands for its figure), ``"open"`` for a call a
    step read that has not settled (its figure so far: ``call_cost_pusd``,
    ``call_charge_pusd``). Once its call settled a hold counts nothing and is not read."""

    request_id: str
    api_key_id: str
    customer_id: str | None
    tags: tuple[str, ...]
    model: str
    hold_pusd: int
    expires_at: datetime
    call: str | None
    created_at: datetime
    call_cost_pusd: int | None = None
    call_charge_pusd: int | None = None

    def beyond_call(self, measure: str) -> int:
        """What the hold adds to its call's figure so far in ``measure`` (picodollars): while
        a call a step has read is open, it counts at no less than its live hold (its figure
        grows as it streams, up to what the hold bounds: admission must not see the rest of
        the hold as headroom); 0 once the figure reached the hold, or in any other state."""
        if self.call != "open":
            return 0
        charge = self.call_charge_pusd
        figure = charge if measure == "charge" and charge is not None else self.call_cost_pusd
        return max(0, self.hold_pusd - (figure or 0))


class CallAmount(NamedTuple):
    """A call read for a budget that its counters do not keep (``billing.budgets.spent``):
    settled or not, its amount in the budget's measure (0 when null), the tags of its
    ``stream.started`` metadata (comma-separated, as sent) and of its authorization."""

    settled: bool
    amount_pusd: int
    metadata_tags: str | None
    hold_tags: str | None


class Unstepped(NamedTuple):
    """A call stored but not yet read by a reconciliation step (``ix_calls_unstepped``): what
    its events say so far, for an estimate of its cost (``billing.budgets.spent``)."""

    request_id: str
    api_key_id: str | None
    model: str | None
    started_at: datetime
    metadata_tags: str | None
    input_tokens: int
    output_tokens: int


class StepCall(NamedTuple):
    """A call a reconciliation step wrote, as the budgets no counter keeps match it
    (``billing.budgets.summed``): its key, its customer at its start, its model, its start
    (None before its ``stream.started``), the tags of its metadata (comma-separated, as sent)
    and of its authorization (JSON, None without a hold)."""

    api_key_id: str | None
    customer_id: str | None
    model: str | None
    started_at: datetime | None
    metadata_tags: str | None
    hold_tags: str | None
