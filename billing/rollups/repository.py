"""The SQL of the rollups, as a ``Protocol``, and ``repository(session)``, which gives the
SQLite or the PostgreSQL implementation (``billing.rollups.sql``).

Tables (``billing.storage.models``): ``usage_rollups`` (by basis, key, level, UTC bucket, model),
``usage_rollups_all_keys`` (the same summed over every key), ``usage_rollups_by_key`` (summed
over every model), ``usage_rollups_by_customer`` (and every key), ``call_status_rollups``
(settled calls by status), ``usage_rollup_keyless`` (where a settled call without
``stream.started`` sits in the call_start rollups) and ``drift_rollups`` (the
drift's "ours" per UTC hour and day). A usage rollup row's summed columns are ``COUNT_FIELDS``
then ``cost_whole_usd`` and ``cost_frac_pusd`` (the exact cost in picodollars split as ``whole *
PICO + frac``, ``0 <= frac < PICO``), then the charge likewise (``billing.rollups.rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from billing.rollups.rows import RollupKey, RollupSums, Rows
from billing.rollups.sql.postgres import PostgresRollups
from billing.rollups.sql.sqlite import SqliteRollups
from billing.storage.dialects import ByDialect


class RollupsRepository(Protocol):
    """The rollups' statements on one database. Every method runs in the session's transaction.

    ``add`` takes rows ``(basis, api_key_id, level, bucket_start, model, customer_id,
    *COUNT_FIELDS, cost_whole_usd, cost_frac_pusd, charge_whole_usd, charge_frac_pusd,
    leakage_whole_usd, leakage_frac_pusd)`` for
    ``usage_rollups`` (``keyed``) and the same without ``api_key_id`` and ``customer_id`` for
    ``usage_rollups_all_keys``: ``bucket_start`` an aware UTC datetime, a null
    key or model as ``''``, the rows in key order (one lock order for every reconciler) and none
    all zero.
    """

    def add(
        self,
        session: Session,
        keyed: Rows,
        all_keys: Rows,
        by_key: Rows,
        by_customer: Rows,
        statuses: Rows,
    ) -> None:
        """Add the rows into their tables, one statement per table: ``x = x + excluded.x``, the
        cost with its carry. (0021) ``by_key``: rows ``(basis, api_key_id, level,
        bucket_start, customer_id, *summed)`` for ``usage_rollups_by_key``; ``by_customer``:
        ``(basis, level, bucket_start, customer_id, *summed)`` for
        ``usage_rollups_by_customer``; ``statuses``: ``(level, bucket_start, status, calls)``
        for ``call_status_rollups``."""

    def keyless_starts(self, session: Session, request_ids: Sequence[str]) -> dict[str, datetime]:
        """The start each of the key-less ``request_ids`` was rolled up under (those known)."""

    def keep_keyless(self, session: Session, rows: Sequence[tuple[str, datetime]]) -> None:
        """Remember ``(request_id, started_at)`` for each of ``rows`` (replacing what was
        remembered); ``rows`` is not empty."""

    def forget_keyless(self, session: Session, request_ids: Sequence[str]) -> None:
        """Forget the ``request_ids`` (not empty)."""

    def rebuild(self, session: Session) -> None:
        """Empty the usage rollup tables (the drift's aside) and recompute them from ``calls``
        (settled, with a start) and ``ledger_entries``, set-based."""

    def floor_sql(self, level: int, column: Any) -> ColumnElement[Any]:
        """SQL for ``billing.rollups.buckets.floor(level, column)`` of a UTC timestamp column."""

    # -- the drift's rollup (``drift_rollups``, kept by ``billing.rollups.drift``) -----------

    def drift_contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        """What the calls ``request_ids`` (as stored now) add to ``drift_rollups``, summed per
        row; the caller says which calls it holds."""
        ...

    def drift_day_of(self, hour: Any) -> Any:
        """The day of a ``RollupKey``'s hour, as the driver gives a ``bucket_start``."""
        ...

    def add_drift(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        """Add ``(level, bucket_start, *RollupKey[1:], *RollupSums)`` rows (in key order, the
        lock order of every reconciler) into ``drift_rollups``: ``x = x + excluded.x``."""
        ...

    def rebuild_drift(self, session: Session) -> None:
        """Empty ``drift_rollups`` and sum into it every settled call with a start and a
        ``stream.started`` (no ``started_missing`` anomaly), by hour, then the hours by day,
        set-based."""
        ...


_REPOSITORIES: ByDialect[RollupsRepository] = ByDialect(
    sqlite=SqliteRollups(), postgresql=PostgresRollups()
)


def repository(session: Session) -> RollupsRepository:
    """The rollups' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
