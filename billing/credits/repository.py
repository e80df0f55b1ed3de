"""The SQL of prepaid credits, as a ``Protocol``, and ``repository(session)``, which gives its
implementation (``billing.credits.sql.common``). Every method runs in the session's
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.credits.rows import (
    BalanceFigures,
    CommonDraws,
    Drawn,
    DueExpiry,
    EntryRow,
    GrantView,
    Movement,
    Owner,
)
from billing.credits.sql.common import POSTGRES, SQLITE
from billing.storage.dialects import ByDialect
from billing.storage.models import CreditEntry, CreditGrant, Customer


class CreditsRepository(Protocol):
    """Customers, grants and credit entries (``customers``, ``credit_grants``,
    ``credit_entries``)."""

    #: Whether a step plans and inserts its draws before it locks the grants it draws, and
    #: keeps them when the locked grants give the same rows (``billing.credits.draws.after_step``):
    #: where steps run at once (PostgreSQL), so that the insert is not done under the locks.
    draws_before_lock: bool

    def any_grants(self, session: Session) -> bool:
        """Whether any grant exists at all (a gateway without credits books none)."""
        ...

    def customer(self, session: Session, customer_id: str) -> Customer | None:
        """The customer's settings row, if it was put."""
        ...

    def credit_required(self, session: Session, customer_id: str) -> bool:
        """Whether the customer was put with ``credit_required`` (one column, no ORM row: the
        authorization path asks it for every call of a customer)."""
        ...

    def customers(self, session: Session, ids: Sequence[str]) -> dict[str, Customer]:
        """The settings rows of these customers that have one."""
        ...

    def save_customer(self, session: Session, row: Customer) -> None:
        """Insert or update a customer's settings row (flushed)."""
        ...

    def customer_known(self, session: Session, customer_id: str) -> bool:
        """Whether the customer was put, is named by a key's assignment or holds a grant."""
        ...

    def customer_page(self, session: Session, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` customer ids (put, or named by keys or grants) after ``after``."""
        ...

    def grant(self, session: Session, grant_id: str) -> CreditGrant | None:
        """The grant, if posted."""
        ...

    def add_grant(self, session: Session, grant: CreditGrant, booked: Movement) -> bool:
        """Insert a grant and its ``grant`` entry; False (nothing inserted) when a grant of
        its ``grant_id`` was stored meanwhile."""
        ...

    def lock_owner(self, session: Session, owner: Owner) -> None:
        """Decide ``owner``'s authorizations one at a time: until the transaction ends, another
        ``lock_owner`` of the same owner waits (PostgreSQL: an advisory lock; SQLite: its one
        writer). Steps never take it: an authorization does not wait for their draws."""
        ...

    def grants(
        self, session: Session, owners: Sequence[Owner], lock: bool = False
    ) -> list[GrantView]:
        """The owners' grants with their remainders, by ``grant_id``; with ``lock``, locked
        for this transaction (PostgreSQL), so that concurrent steps draw them one at a time."""
        ...

    def balance_figures(self, session: Session, owner: Owner, now: datetime) -> BalanceFigures:
        """The owner's live holds at ``now`` (``billing.credits.holds.held_for_owner``),
        ``pending``, ``overdraft`` and ``grants``, in one statement (one snapshot)."""
        ...

    def owners_with_grants(self, session: Session, owners: Sequence[Owner]) -> set[Owner]:
        """Those of ``owners`` that hold any grant."""
        ...

    def drawn(self, session: Session, request_ids: Sequence[str]) -> Drawn:
        """What each call drew so far (draws, reversals, overdrafts), net, by owner and grant."""
        ...

    def add(self, session: Session, moves: Sequence[Movement]) -> None:
        """Book the entries."""
        ...

    def entry_time(self, at: datetime) -> Any:
        """``at`` as ``insert_entries`` takes a ``booked_at`` (the driver's value)."""
        ...

    def insert_entries(self, session: Session, rows: Sequence[EntryRow]) -> None:
        """Insert the rows as they are, in order (one statement), nothing read back; the
        caller keeps the sums (``add_to_sums``)."""
        ...

    def insert_draws(self, session: Session, rows: Sequence[EntryRow], common: CommonDraws) -> None:
        """Insert a step's draws: ``rows`` (in the order drawn) and the ``common`` draws, as one
        list by ``request_id`` (``CommonDraws.merged``), nothing read back; the caller keeps the
        sums (``add_to_sums``)."""
        ...

    def add_to_sums(
        self, session: Session, grants: dict[str, int], overdrafts: dict[Owner, int]
    ) -> None:
        """Add to the grants' remainders (grant id → change) and to the owners' overdrafts
        what entries booked in this transaction changed of them."""
        ...

    def add_once(self, session: Session, move: Movement) -> bool:
        """Book the entry unless one of its ``dedupe_key`` exists; whether it was booked."""
        ...

    def due_expiries(self, session: Session, now: datetime) -> list[DueExpiry]:
        """The grants expired at ``now`` whose expiry (or void) is not booked yet."""
        ...

    def expiring_owners(
        self, session: Session, after: datetime, until: datetime
    ) -> dict[Owner, set[str]]:
        """The grants (by owner) whose ``expires_at`` is in ``(after, until]``."""
        ...

    def overdraft(self, session: Session, owner: Owner) -> int:
        """The owner's overdraft: its overdrafts less their reversals."""
        ...

    def overdrafts(self, session: Session, owners: Sequence[Owner]) -> dict[Owner, int]:
        """``overdraft`` of each of ``owners`` in one statement (an owner without: absent)."""
        ...

    def pending(self, session: Session, owner: Owner) -> int:
        """The provisional charges (else costs) of the owner's unsettled calls."""
        ...

    def pending_by_owner(self, session: Session, owners: Sequence[Owner]) -> dict[Owner, int]:
        """``pending`` of each of ``owners`` (one read; an owner without open calls: absent)."""
        ...

    def entries_between(
        self, session: Session, since: datetime, until: datetime
    ) -> list[CreditEntry]:
        """The entries booked in ``[since, until)``, by booking time and id."""
        ...

    def kind_totals(
        self, session: Session, since: datetime | None, until: datetime
    ) -> dict[tuple[str, bool], int]:
        """Σ amount by (kind, of a grant: else of no grant, an overdraft or its reversal) of
        the entries booked in ``[since, until)`` (``since`` None: from the first)."""
        ...

    def balances_before(self, session: Session, until: datetime) -> dict[str, int]:
        """Each grant's remainder over its entries booked before ``until``."""
        ...

    def owner_entries(self, session: Session, owner: Owner, limit: int) -> list[CreditEntry]:
        """The owner's latest ``limit`` entries, newest first."""
        ...


_REPOSITORIES: ByDialect[CreditsRepository] = ByDialect(sqlite=SQLITE, postgresql=POSTGRES)


def repository(session: Session) -> CreditsRepository:
    """The credits' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
