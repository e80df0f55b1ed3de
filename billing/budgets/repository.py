"""The SQL the budgets need (``store_for(session).budgets``); implemented by
``billing.storage.{sqlite,postgres}.budgets`` over ``billing.storage.budgets_core``.

Amounts are picodollars (``*_pusd``); ``cost`` and ``charge`` are the two measures
(``billing.budgets.measure``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from billing.storage.models import Budget, BudgetAlert, WebhookOutbox


#: A budget's scope as a column of ``calls`` / ``ledger_entries`` / ``budget_open_calls`` and
#: its value: ``("api_key_id", key)`` or ``("customer_id", customer)``.
Scope = tuple[str, str]


class OpenAmounts(NamedTuple):
    """What an open call adds to provisional spend (``budget_open_calls``)."""

    request_id: str
    api_key_id: str
    customer_id: str | None
    started_at: datetime
    cost_pusd: int
    charge_pusd: int


class CallAmounts(NamedTuple):
    """A call's row as a step left it (amounts null while unpriced)."""

    request_id: str
    api_key_id: str | None
    customer_id: str | None
    started_at: datetime | None
    settled: bool
    cost_pusd: int | None
    charge_pusd: int | None


class EntryAmounts(NamedTuple):
    """The ledger entries a step booked, summed per key, customer (the call's, at its start)
    and UTC quarter hour of the call's start (``call_started_at`` is that quarter's start)."""

    api_key_id: str
    customer_id: str | None
    call_started_at: datetime
    cost_pusd: int
    charge_pusd: int


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

    def insert_budget(self, session: Session, values: dict[str, Any]) -> Budget: ...
    def versions(self, session: Session, budget_id: str) -> list[Budget]: ...
    def end_budget(self, session: Session, row: int, now: datetime) -> None: ...
    def list_budgets(self, session: Session, include_ended: bool) -> list[Budget]: ...
    def any_live(self, session: Session) -> bool: ...
    def live_for(
        self, session: Session, keys: Collection[str], customers: Collection[str]
    ) -> list[Budget]: ...
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

    def open_amounts(self, session: Session, ids: Sequence[str]) -> list[OpenAmounts]: ...
    def call_amounts(self, session: Session, ids: Sequence[str]) -> list[CallAmounts]: ...
    def entry_amounts(
        self, session: Session, ids: Sequence[str], booked_at: datetime
    ) -> list[EntryAmounts]: ...
    def replace_open(
        self, session: Session, ids: Sequence[str], rows: Sequence[OpenAmounts]
    ) -> None: ...
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
