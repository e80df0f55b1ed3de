"""The SQL of the usage rollups, as a ``Protocol``: ``billing.storage.sqlite.rollups`` and
``billing.storage.postgres.rollups`` implement it; ``store_for(session).rollups`` picks one.

Tables (``billing.storage.models``): ``usage_rollups`` (by basis, key, level, UTC bucket, model),
``usage_rollups_all_keys`` (the same summed over every key) and ``usage_rollup_keyless`` (where a
settled call without ``stream.started`` sits in the call_start rollups). A rollup row's summed
columns are ``COUNT_FIELDS`` then ``cost_whole_usd`` and ``cost_frac_pusd`` (the exact cost in
picodollars split as ``whole * PICO + frac``, ``0 <= frac < PICO``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS

#: The bases of the rollups (CONTRACT "Call log and usage queries"): settled calls in the bucket
#: of their start, and ledger entries in the bucket of their booking.
CALL_START = "call_start"
BOOKED = "booked"
BASES = (CALL_START, BOOKED)

#: Picodollars per US dollar.
PICO = 10**12
#: The summed integer columns of a rollup row, in the order of ``Totals.values``.
COUNT_FIELDS = ("members", "calls", *TOKEN_FIELDS, "unpriced", "uncharged")

#: Rollup rows to add (see ``RollupsRepository``).
Rows = Sequence[tuple[Any, ...]]


class RollupsRepository(Protocol):
    """The rollups' statements on one database. Every method runs in the session's transaction.

    ``add`` takes rows ``(basis, api_key_id, level, bucket_start, model, customer_id,
    *COUNT_FIELDS, cost_whole_usd, cost_frac_pusd, charge_whole_usd, charge_frac_pusd)`` for
    ``usage_rollups`` (``keyed``) and the same without ``api_key_id`` and ``customer_id`` for
    ``usage_rollups_all_keys``: ``bucket_start`` an aware UTC datetime, a null
    key or model as ``''``, the rows in key order (one lock order for every reconciler) and none
    all zero.
    """

    def add(self, session: Session, keyed: Rows, all_keys: Rows) -> None:
        """Add the rows into their tables, one statement per table: ``x = x + excluded.x``, the
        cost with its carry."""

    def keyless_starts(self, session: Session, request_ids: Sequence[str]) -> dict[str, datetime]:
        """The start each of the key-less ``request_ids`` was rolled up under (those known)."""

    def keep_keyless(self, session: Session, rows: Sequence[tuple[str, datetime]]) -> None:
        """Remember ``(request_id, started_at)`` for each of ``rows`` (replacing what was
        remembered); ``rows`` is not empty."""

    def forget_keyless(self, session: Session, request_ids: Sequence[str]) -> None:
        """Forget the ``request_ids`` (not empty)."""

    def rebuild(self, session: Session) -> None:
        """Empty the three tables and recompute them from ``calls`` (settled, with a start) and
        ``ledger_entries``, set-based."""

    def floor_sql(self, level: int, column: Any) -> ColumnElement[Any]:
        """SQL for ``billing.rollups.buckets.floor(level, column)`` of a UTC timestamp column."""
