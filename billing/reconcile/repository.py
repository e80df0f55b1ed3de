"""The reconciler's SQL, as the methods a database's store implements
(``billing.storage.sqlite.reconcile``, ``billing.storage.postgres.reconcile``).

Domain code reaches it with ``store_for(session).reconcile``. Times cross this interface in two
forms: aware UTC ``datetime`` values, and values "as the driver returns them" (``DriverTime``:
what the database's driver gives for a timestamp column, compared and written back without
parsing; ``driver_time`` turns a ``datetime`` into that form and ``utc`` turns it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from billing.reconcile.entries import Entry
    from billing.reconcile.rule import CallFigures
    from billing.reconcile.state import CallState

#: A timestamp as the database's driver returns it (SQLite: text; PostgreSQL: a ``datetime``).
DriverTime = Any
#: One call's step: its state before, its state after, its figures from the rule.
Update = tuple["CallState", "CallState", "CallFigures"]
#: ``(request_id, settled, attempts, last_received_at, api_key_id, model, started_at)``, the
#: times as the driver returns them.
StateRow = tuple[Any, ...]
#: ``(request_id, body, received_at)`` of an event that is not a ``stream.tokens``.
BodyRow = tuple[str, Any, DriverTime]
#: ``(request_id, attempt, first occurred_at, last occurred_at, largest delivered, largest
#: generated, last received_at)`` of one attempt's ``stream.tokens`` (times as the driver
#: returns them).
FoldRow = tuple[str, int, DriverTime, DriverTime, int, int, DriverTime]
#: ``(api_key_id, model, quarter (aware UTC), hour, provider, upstream account, calls, *token
#: sums, whole USD, picodollars)``: the rollup contributions of the calls the fast path settled,
#: per key, model, quarter hour, provider and upstream account (``''`` for none); ``hour`` is the
#: quarter's hour as ``drift_rollups`` keys it (``billing.drift.repository.RollupKey``).
GroupRow = tuple[Any, ...]
#: The reasons of a settlement with upstream usage and of one on the clock.
Reasons = tuple[str, str]
#: The calls the fast path settled, and their ``GroupRow``s.
Settled = tuple[list[str], list[GroupRow]]


class ReconcileRepository(Protocol):
    """The reconciler's reads and writes of one database, inside the caller's transaction."""

    #: Whether steps may run at once in several threads (each locks its calls); False where the
    #: database has one writer at a time.
    steps_at_once: bool

    def utc(self, value: DriverTime) -> datetime:
        """A timestamp as the driver returned it, as an aware UTC ``datetime``."""
        ...

    def driver_time(self, value: datetime) -> DriverTime:
        """An aware ``datetime`` in the form the driver returns timestamps in."""
        ...

    def due_calls(
        self, session: Session, cutoff: datetime, limit: int, lock: bool, before: datetime | None
    ) -> list[str]:
        """Up to ``limit`` calls that need work (open ones quiet since ``cutoff``, then pending
        ones, those pending since ``before`` or earlier when given), oldest first, locked unless
        ``lock`` is false (rows locked elsewhere skipped)."""
        ...

    def pending_horizon(self, session: Session) -> datetime | None:
        """The latest ``last_received_at`` among the pending calls (None: none is)."""
        ...

    def lock_call(self, session: Session, request_id: str) -> bool:
        """Lock one call's row; False when another transaction holds it."""
        ...

    def mark_model_pending(self, session: Session, model: str, effective_from: datetime) -> int:
        """Mark pending the calls with an attempt on ``model``, or tokens billed at its rates
        (``other_models``, v2), started at or after ``effective_from``; returns how many."""
        ...

    def read_states(self, session: Session, request_ids: Sequence[str]) -> list[StateRow]:
        """The ``calls`` rows of ``request_ids`` (see ``StateRow``)."""
        ...

    def read_settled_states(
        self, session: Session, request_ids: Sequence[str], columns: Sequence[str]
    ) -> list[Any]:
        """``columns`` of the given calls' rows, typed (times as aware ``datetime``)."""
        ...

    def read_events(
        self, session: Session, request_ids: Sequence[str]
    ) -> tuple[list[BodyRow], list[FoldRow]]:
        """The calls' events: the bodies of every event but ``stream.tokens``, and the
        ``stream.tokens`` folded per call and attempt by the database."""
        ...

    def read_booked(self, session: Session, request_ids: Sequence[str]) -> list[Any]:
        """Per call and ledger line (``LineKey``: key, model, price id, customer, plan, plan
        price id, markup): ``(request_id, *line, max seq, seq of the last reversal or None,
        *token sums)``."""
        ...

    def read_booked_units(self, session: Session, request_ids: Sequence[str]) -> list[Any]:
        """The entries of the calls that have units (v2): ``(request_id, *line, units)`` (the
        line as ``read_booked``'s), ``units`` as the stored JSON text (name → signed count)."""
        ...

    def write_calls(self, session: Session, updates: Sequence[Update], now: datetime) -> None:
        """Write each call's new state and figures onto its row; clears ``pending``."""
        ...

    def write_attempts(self, session: Session, updates: Sequence[Update]) -> None:
        """Replace the ``call_attempts`` rows of the calls of more than one attempt."""
        ...

    def write_entries(self, session: Session, entries: Sequence[Entry]) -> None:
        """Insert new ledger entries."""
        ...

    def settle_common(
        self, session: Session, ids: Sequence[str], now: datetime, cutoff: datetime, why: Reasons
    ) -> Settled:
        """The fast path (``billing.reconcile.common``): settle those of ``ids`` of the common
        shape that settle now, write their rows and settlement entries (``why``: ``Reasons``);
        returns the calls settled and their rollup contributions."""
        ...
