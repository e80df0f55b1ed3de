"""The SQL the budgets need (``store_for(session).budgets``); implemented by
``billing.storage.{sqlite,postgres}.budgets`` over ``billing.storage.budgets_core``.

Amounts are picodollars (``*_pusd``); ``cost`` and ``charge`` are the two measures
(``billing.budgets.measure``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from billing.storage.models import Budget, BudgetAlert, WebhookOutbox


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


class Claimed(NamedTuple):
    """A webhook claimed for delivery."""

    alert_id: str
    url: str
    body: str
    secret: str
    attempts: int
    created_at: datetime


class BudgetsRepository(Protocol):
    def lock_shared(self, session: Session) -> None:
        """Held by a step while it updates counters (PostgreSQL: an advisory lock)."""

    def lock_exclusive(self, session: Session) -> None:
        """Held while a budget version fills its first counter."""

    def versions(self, session: Session, budget_id: str) -> list[Budget]: ...
    def insert_budget(self, session: Session, values: dict[str, Any]) -> Budget:
        """Add a version (and bump the generation)."""

    def end_budget(self, session: Session, row: int, now: datetime) -> None:
        """End a version (and bump the generation)."""

    def list_budgets(self, session: Session, include_ended: bool) -> list[Budget]: ...
    def generation(self, session: Session) -> int | None:
        """The budgets' generation (``budget_generation``; None without its row)."""

    def bump_generation(self, session: Session) -> None: ...
    def definitions(self, session: Session) -> list[BudgetDef]:
        """The versions in force (``billing.budgets.cache``)."""

    def spend_check_rows(
        self, session: Session, key: str, now: datetime
    ) -> tuple[int | None, str | None, list[CounterRow]]:
        """One statement: the generation, the customer of ``key`` at ``now`` (its assignment in
        force) and the latest counter at or before ``now`` of each version in force over the
        key or that customer."""

    def spend(
        self, session: Session, pairs: Sequence[tuple[int, datetime]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        """(settled, provisional) per (budget row, period start) that has a counter."""

    def add_spend(
        self, session: Session, row: int, start: datetime, settled: int, provisional: int
    ) -> tuple[int, int]:
        """Add to (or create) the counter; returns its new (settled, provisional)."""

    def add_spends(
        self, session: Session, changes: Sequence[tuple[int, datetime, int, int]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        """``add_spend`` of (row, start, settled, provisional) changes in one statement (in the
        order given: one lock order for every reconciler)."""

    def settled_of(
        self,
        session: Session,
        scope: Scope,
        measure: str,
        start: datetime,
        end: datetime | None,
    ) -> int:
        """The ledger's amounts of the scope's calls started in ``[start, end)`` (a key's, or
        a customer's: the entries' ``customer_id``, the customer at the call's start)."""

    def provisional_of(
        self,
        session: Session,
        scope: Scope,
        measure: str,
        start: datetime,
        end: datetime | None,
    ) -> int: ...
    def refresh_open(self, session: Session, scope: Scope) -> None:
        """``budget_open_calls`` of the scope's open calls set to their current amounts."""

    def step_amounts(
        self, session: Session, ids: Sequence[str], booked_at: datetime
    ) -> StepAmounts:
        """A step's olds, open calls and entries booked at ``booked_at`` (one statement)."""

    def replace_open(
        self, session: Session, gone: Sequence[str], rows: Sequence[OpenAmounts]
    ) -> None:
        """``budget_open_calls`` without ``gone`` and with ``rows`` (added or replaced)."""

    def insert_alert(self, session: Session, values: dict[str, Any]) -> bool:
        """Insert unless the (budget, period, threshold, type) has one; True when inserted."""

    def insert_outbox(self, session: Session, values: dict[str, Any]) -> None: ...
    def alerts(
        self, session: Session, budget_id: str | None, since: datetime | None, limit: int
    ) -> list[tuple[BudgetAlert, WebhookOutbox | None]]: ...
    def claim_due(
        self, session: Session, now: datetime, lease_until: datetime, owner: str, limit: int
    ) -> list[Claimed]: ...
    def record_attempt(
        self, session: Session, alert_id: str, owner: str, values: dict[str, Any]
    ) -> None: ...
