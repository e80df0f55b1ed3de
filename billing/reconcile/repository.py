"""The reconciler's SQL, as a ``Protocol``, and ``repository(session)``, which gives the SQLite
or the PostgreSQL implementation (``billing.reconcile.sql``: the reads and writes of a step, and
the fast path's statements). Row shapes and the two forms of times: ``billing.reconcile.rows``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from billing.reconcile.entries import Entry
from billing.reconcile.rows import (
    BodyRow,
    DriverTime,
    FoldRow,
    Reasons,
    Settled,
    StateRow,
    Update,
)
from billing.reconcile.sql.postgres import PostgresReconcile
from billing.reconcile.sql.sqlite import SqliteReconcile
from billing.storage.dialects import ByDialect


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
        """The fast path (``billing.reconcile.fastpath``): settle those of ``ids`` of the common
        shape that settle now, write their rows and settlement entries (``why``: ``Reasons``);
        returns the calls settled and their rollup contributions."""
        ...


_REPOSITORIES: ByDialect[ReconcileRepository] = ByDialect(
    sqlite=SqliteReconcile(), postgresql=PostgresReconcile()
)


def repository(bind: Session | Connection | Engine) -> ReconcileRepository:
    """The reconciler's repository of the database behind ``bind``."""
    return _REPOSITORIES.of(bind)
