"""The SQL the budgets need, as a ``Protocol``, and ``repository(session)``, which gives the
SQLite or the PostgreSQL implementation (``billing.budgets.sql``: versions, counters, alerts).

Amounts are picodollars (``*_pusd``); ``cost`` and ``charge`` are the two measures
(``billing.budgets.measure``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.budgets.rows import (
    BudgetDef,
    CallAmount,
    Claimed,
    LiveHold,
    OpenAmounts,
    Scope,
    SpendCheckRows,
    StepAmounts,
    StepCall,
    StoredHold,
    Unstepped,
)
from billing.budgets.sql.postgres import PostgresBudgets
from billing.budgets.sql.sqlite import SqliteBudgets
from billing.storage.dialects import ByDialect
from billing.storage.models import Budget, BudgetAlert, WebhookOutbox


class BudgetsRepository(Protocol):
    def lock_shared(self, session: Session) -> None:
        """Held by a step while it updates counters (PostgreSQL: an advisory lock)."""

    def lock_exclusive(self, session: Session) -> None:
        """Held while a budget version fills its first counter."""

    def lock_budgets(self, session: Session, rows: Sequence[int]) -> None:
        """Held by an authorization over the budget versions ``rows`` until its transaction
        ends (PostgreSQL: an advisory lock each, in ascending order; SQLite: its one writer)."""

    #: Whether a write transaction reads one snapshot in which nobody else writes (SQLite: its
    #: one writer, taken at ``BEGIN IMMEDIATE``), so that what an authorization read before
    #: ``lock_budgets`` is still what it would read after it (PostgreSQL: read committed, each
    #: statement sees what committed before it).
    one_writer: bool

    def lock_alerts(self, session: Session, rows: Sequence[int]) -> None:
        """Held while the alerts of the budget versions ``rows`` (no counter keeps them) are
        recorded, until the transaction ends (PostgreSQL: an advisory lock each, in ascending
        order, other than ``lock_budgets``'; SQLite: its one writer)."""

    def versions(self, session: Session, budget_id: str) -> list[Budget]: ...
    def insert_budget(self, session: Session, values: dict[str, Any]) -> Budget:
        """Add a version (and bump the generation)."""

    def end_budget(self, session: Session, row: int, now: datetime) -> None:
        """End a version (and bump the generation)."""

    def list_budgets(self, session: Session, include_ended: bool) -> list[Budget]: ...
    def budget_page(self, session: Session, after: str | None, limit: int) -> list[Budget]:
        """Up to ``limit`` versions in force, by ``budget_id``, after ``after``."""
        ...

    def customers_budgets(self, session: Session, customer_ids: Sequence[str]) -> list[Budget]:
        """The versions in force scoped to one of ``customer_ids``, by ``budget_id``."""
        ...

    def uncounted(self, session: Session) -> list[Budget]:
        """The versions in force no counter keeps (``billing.budgets.scopes.kept_by_counters``
        false: v3 tag or every-call scopes, a model, a rolling window), by ``budget_id``."""
        ...

    def fullest(self, session: Session, now: datetime, limit: int) -> list[Budget]:
        """Up to ``limit`` versions in force, the fullest first: by the latest counter at or
        before ``now`` (settled + provisional) over the limit, compared as floating point (a
        ranking only: the caller computes the exact statuses). Versions no counter keeps (v3
        tag, model and rolling budgets) are not among them."""
        ...

    def generation(self, session: Session) -> int | None:
        """The budgets' generation (``budget_generation``; None without its row)."""

    def bump_generation(self, session: Session) -> None: ...
    def definitions(self, session: Session) -> list[BudgetDef]:
        """The versions in force (``billing.budgets.cache``)."""

    def spend_check_rows(
        self, session: Session, key: str, now: datetime, model: str | None = None
    ) -> SpendCheckRows:
        """One statement: the generation, the customer of ``key`` at ``now`` (its assignment in
        force) and whether it is ``credit_required``, the latest counter at or before ``now`` of
        each version in force over the key or that customer, and when ``model`` is asked, its
        price rows' (count, highest id) (``PricingRepository.model_versions``' pair) and the
        plan of the key's assignment in force with its versions' (count, highest id)."""

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

    def hold(self, session: Session, request_id: str) -> StoredHold | None:
        """The stored authorization of ``request_id`` (one statement)."""

    def insert_hold(self, session: Session, values: dict[str, Any]) -> bool:
        """Store a hold (one insert-or-skip); False when the ``request_id`` has one already
        (stored by a concurrent authorization that committed first)."""

    def call_exists(self, session: Session, request_id: str) -> bool:
        """A call with this ``request_id`` is stored (its first event was ingested)."""

    def release_hold(self, session: Session, request_id: str, now: datetime) -> None: ...

    def settle_holds(self, session: Session, request_ids: Sequence[str], now: datetime) -> None:
        """Mark the live holds of these calls, settled by the step running at ``now``, as
        settled: they count nothing from now on and leave the live holds' indexes."""

    def live_holds(
        self,
        session: Session,
        now: datetime,
        keys: Collection[str],
        customers: Collection[str],
        everything: bool,
    ) -> list[LiveHold]:
        """The holds neither released nor expired at ``now`` whose call has not settled, with
        their call's state: of ``keys`` or ``customers``, or every one (``everything``)."""

    def call_amounts(
        self,
        session: Session,
        measure: str,
        start: datetime,
        end: datetime | None,
        *,
        rolling: bool,
        key: str | None = None,
        customer: str | None = None,
        tag: str | None = None,
        model: str | None = None,
    ) -> list[CallAmount]:
        """The amounts of the calls a budget no counter keeps counts (``sql.holds``)."""

    def spend_reads(
        self,
        session: Session,
        now: datetime,
        keys: Collection[str],
        customers: Collection[str],
        everything: bool,
        calls_of_all: bool,
        pairs: Sequence[tuple[int, datetime]],
    ) -> tuple[list[LiveHold], list[Unstepped], dict[tuple[int, datetime], tuple[int, int]] | None]:
        """One statement: ``live_holds(now, keys, customers, everything)``,
        ``unstepped_calls(keys, calls_of_all)`` and ``spend(pairs)`` (None when ``pairs`` are
        more than one statement reads: ``spend`` reads them in slices)."""

    def unstepped_calls(
        self, session: Session, keys: Collection[str], everything: bool
    ) -> list[Unstepped]:
        """The calls of ``keys`` (or every one) stored with a start but not yet read by a
        reconciliation step, with their ``stream.started`` input and largest generated count."""

    def step_calls(self, session: Session, ids: Sequence[str]) -> list[StepCall]:
        """The calls ``ids`` as the budgets no counter keeps match them (one statement)."""

    def insert_alert(self, session: Session, values: dict[str, Any]) -> bool:
        """Insert unless the (budget, period, threshold, type) has one; True when inserted."""

    def alert_marks(
        self, session: Session, pairs: Collection[tuple[str, datetime]], kinds: Sequence[str]
    ) -> set[tuple[str, datetime, str, str]]:
        """(budget_id, period start, threshold, type) of the alerts of ``kinds`` stored for
        the (budget_id, period start) ``pairs`` (one statement)."""

    def open_crossings(
        self, session: Session, budget_ids: Collection[str], crossed: str, resolved: str
    ) -> dict[tuple[str, str], list[datetime]]:
        """Per (budget_id, threshold), the period starts of the ``crossed`` alerts made by a
        rolling version of ``budget_ids`` that have no ``resolved`` alert of the same budget,
        period start and threshold (one statement)."""

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


_REPOSITORIES: ByDialect[BudgetsRepository] = ByDialect(
    sqlite=SqliteBudgets(), postgresql=PostgresBudgets()
)


def repository(session: Session) -> BudgetsRepository:
    """The budgets' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
