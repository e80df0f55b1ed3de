"""The reconciler's queries that SQLAlchemy writes alike for SQLite and PostgreSQL, and the rows
its writes take; ``billing.reconcile.sql.sqlite`` and ``billing.reconcile.sql.postgres`` build on
them (see ``billing.reconcile.repository`` for the methods)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, false, func, select, true
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS
from billing.reconcile.ledger import REVERSAL_PREFIX
from billing.reconcile.rows import BodyRow, FoldRow, StateRow, Update
from billing.reconcile.state import CallState, other_models_json
from billing.storage.models import Call, LedgerEntry

if TYPE_CHECKING:
    from billing.reconcile.rule import CallFigures

#: Calls per ``IN (…)`` list or array parameter.
CHUNK = 2000

#: What a ledger line is booked under (``billing.reconcile.ledger.LineKey``, in its order).
_LINE = (
    LedgerEntry.api_key_id,
    LedgerEntry.model,
    LedgerEntry.price_id,
    LedgerEntry.customer_id,
    LedgerEntry.plan_id,
    LedgerEntry.plan_price_id,
    LedgerEntry.markup_pct,
    LedgerEntry.failure_charge,
)
_SUMS = [func.sum(getattr(LedgerEntry, name)) for name in TOKEN_FIELDS]
_LAST_REVERSAL = func.max(
    case((LedgerEntry.reason.like(f"{REVERSAL_PREFIX}%"), LedgerEntry.seq), else_=None)
)


class CoreReconcile:
    """The methods of ``ReconcileRepository`` that read the same on both databases; a database's
    class gives the statements ``states``, ``bodies`` and ``folds`` (in its dialect, one list or
    array of request ids each) and ``fetch`` (their rows for any number of calls)."""

    states: str
    bodies: str
    folds: str

    def fetch(self, session: Session, statement: str, request_ids: Sequence[str]) -> list[Any]:
        raise NotImplementedError

    def read_states(self, session: Session, request_ids: Sequence[str]) -> list[StateRow]:
        return self.fetch(session, self.states, request_ids)

    def read_events(
        self, session: Session, request_ids: Sequence[str]
    ) -> tuple[list[BodyRow], list[FoldRow]]:
        return (
            self.fetch(session, self.bodies, request_ids),
            self.fetch(session, self.folds, request_ids),
        )

    def due_calls(
        self, session: Session, cutoff: datetime, limit: int, lock: bool, before: datetime | None
    ) -> list[str]:
        """Two queries, each a range of one index read in order (``calls(settled, pending,
        last_received_at, request_id)`` and ``calls(pending, last_received_at, request_id)``),
        so a step costs the same however many calls are waiting; one ``OR`` of both conditions
        can use neither index and sorts every waiting call at every step. ``FOR UPDATE SKIP
        LOCKED`` where the database has it (SQLite has one writer at a time)."""
        order = (Call.last_received_at, Call.request_id)
        queries = [
            # Open, not pending (reconciled since its last event), and quiet for settle_after.
            select(Call.request_id).where(
                Call.settled == false(), Call.pending == false(), Call.last_received_at <= cutoff
            ),
            select(Call.request_id).where(
                Call.pending == true(),
                *(() if before is None else (Call.last_received_at <= before,)),
            ),
        ]
        found: list[str] = []
        conn = session.connection()  # Core rows: no ORM loading for thousands of ids a step
        for query in queries:
            if len(found) >= limit:
                break
            query = query.order_by(*order).limit(limit - len(found))
            if lock:
                query = query.with_for_update(skip_locked=True)
            found.extend(conn.execute(query).scalars())
        return found

    def pending_horizon(self, session: Session) -> datetime | None:
        """One step of the pending index."""
        return session.scalar(select(func.max(Call.last_received_at)).where(Call.pending == true()))

    def lock_call(self, session: Session, request_id: str) -> bool:
        query = (
            select(Call.request_id)
            .where(Call.request_id == request_id)
            .with_for_update(skip_locked=True)
        )
        return session.scalar(query) is not None

    def read_settled_states(
        self, session: Session, request_ids: Sequence[str], columns: Sequence[str]
    ) -> list[Any]:
        selected = [getattr(Call, name) for name in columns]
        rows: list[Any] = []
        for start in range(0, len(request_ids), CHUNK):
            chunk = request_ids[start : start + CHUNK]
            rows.extend(session.execute(select(*selected).where(Call.request_id.in_(chunk))))
        return rows

    def read_booked(self, session: Session, request_ids: Sequence[str]) -> list[Any]:
        rows = session.execute(
            select(
                LedgerEntry.request_id,
                *_LINE,
                func.max(LedgerEntry.seq),
                _LAST_REVERSAL,
                *_SUMS,
                func.sum(LedgerEntry.provider_cost_pusd),
            )
            .where(LedgerEntry.request_id.in_(request_ids))
            .group_by(LedgerEntry.request_id, *_LINE)
        )
        return list(rows)

    def read_booked_units(self, session: Session, request_ids: Sequence[str]) -> list[Any]:
        rows: list[Any] = []
        for start in range(0, len(request_ids), CHUNK):
            chunk = request_ids[start : start + CHUNK]
            rows.extend(
                session.execute(
                    select(LedgerEntry.request_id, *_LINE, LedgerEntry.units).where(
                        LedgerEntry.request_id.in_(chunk), LedgerEntry.units.is_not(None)
                    )
                )
            )
        return rows


#: The columns of ``call_attempts`` a step writes, in the order of ``attempt_rows``.
ATTEMPT_COLUMNS = (
    "request_id",
    "attempt",
    "model",
    "status",
    "usage_source",
    "error_type",
    "stop_reason",
    *TOKEN_FIELDS,
)


def attempt_rows(updates: Sequence[Update]) -> list[Any]:
    """The ``call_attempts`` rows of the calls with more than one attempt (a call with one
    attempt is its attempt: the ``calls`` row holds its figures; see ``CallAttempt``)."""
    return [
        (
            fig.request_id,
            a.attempt,
            a.model,
            a.status,
            a.usage_source,
            a.error_type,
            a.stop_reason,
            *a.tokens.values(),
        )
        for _old, _new, fig in updates
        if len(fig.attempts) > 1
        for a in fig.attempts
    ]


def had_attempts(updates: Sequence[Update]) -> list[str]:
    """The calls whose attempts were written by an earlier step (to be replaced)."""
    return [old.request_id for old, _new, _fig in updates if old.attempts > 1]


#: The columns of ``calls`` every step writes, in the order of ``call_values``; ``pending`` is
#: cleared too: the row is locked by the step, so nothing arrived for it since its events were
#: read. ``settled_at`` is only set when the call settles now (``COALESCE`` keeps an earlier one).
#: ``last_received_at`` gets the call's last arrival, read from its events (a pending call's row
#: is not updated by its later events): as an open call it waits in the due-call index from then.
CALL_SET = (
    "protocol",
    "metadata",
    "ended_at",
    "status",
    "settled",
    "settled_at",
    "usage_source",
    "attempts",
    *TOKEN_FIELDS,
    "cost_pusd",
    "anomalies",
    "error_type",
    "stop_reason",
    "last_received_at",
    "service_tier",
    "units",
    "other_models",
    "customer_id",
    "plan_id",
    "charge_pusd",
    "counters",
    "provider_cost_pusd",
    "inference_geo",
    "leakage_pusd",
)
#: The identity columns, written as well where they changed (ingest fills them in from the
#: call's first ``stream.started`` already, so that is rare).
CALL_IDENTITY = ("api_key_id", "model", "started_at")

_tokens_of_state = attrgetter(*TOKEN_FIELDS)


@functools.lru_cache(maxsize=256)
def _json_list(codes: tuple[str, ...]) -> str:
    return json.dumps(list(codes))


def _json_metadata(metadata: dict[str, str] | None) -> str | None:
    return None if metadata is None else json.dumps(metadata)


def call_values(
    new: CallState, fig: CallFigures, now: Any, time: Callable[[datetime | None], Any]
) -> tuple[Any, ...]:
    """The values of ``CALL_SET`` for one call; ``now`` and times as the driver takes them."""
    return (
        fig.protocol,
        _json_metadata(fig.metadata),
        time(fig.ended_at),
        fig.status if new.settled else "open",
        new.settled,
        now if new.settling else None,
        fig.usage_source,
        new.attempts,
        *_tokens_of_state(new),
        new.cost_pusd,
        _json_list(tuple(new.anomalies)),
        fig.error_type,
        fig.stop_reason,
        new.arrival,
        fig.service_tier,
        json.dumps(fig.units) if fig.units else None,
        other_models_json(fig) if fig.other_models else None,
        new.customer_id,
        new.plan_id,
        new.charge_pusd,
        json.dumps(fig.counters) if fig.counters else None,
        fig.provider_cost_pusd,
        fig.inference_geo,
        new.leakage_pusd,
    )
