"""The rows that cross the reconciler's repository (``billing.reconcile.repository``).

Times cross it in two forms: aware UTC ``datetime`` values, and values "as the driver returns
them" (``DriverTime``: what the database's driver gives for a timestamp column, compared and
written back without parsing; ``ReconcileRepository.driver_time`` turns a ``datetime`` into that
form and ``utc`` turns it back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from billing.reconcile.rule import CallFigures
    from billing.reconcile.state import CallState

#: A timestamp as the database's driver returns it (SQLite: text; PostgreSQL: a ``datetime``).
DriverTime = Any
#: One call's step: its state before, its state after, its figures from the rule.
Update = tuple["CallState", "CallState", "CallFigures"]
#: ``(request_id, settled, attempts, call_no, last_received_at, api_key_id, model, started_at)``,
#: the times as the driver returns them.
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
#: ``(request_id, api_key_id, charge_pusd, call_no)`` of a call the fast path settled: its one
#: settlement entry (seq 1) charges its key, no customer, its cost (``billing.credits.draws``
#: draws it without reading the entry back).
CommonCharge = tuple[str, str, int, int]
#: The calls the fast path settled (``CommonCharge``), and their ``GroupRow``s.
Settled = tuple[list[CommonCharge], list[GroupRow]]
