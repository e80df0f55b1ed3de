"""The SQL of the call log's usage queries, as a ``Protocol``, and ``repository(session)``,
which gives the SQLite or the PostgreSQL implementation (``billing.calllog.sql``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.calllog.sql.postgres import PostgresCalllog
from billing.calllog.sql.sqlite import SqliteCalllog
from billing.rollups.buckets import Run
from billing.storage.dialects import ByDialect


class CalllogRepository(Protocol):
    """The call log's statements on one database, run in the session's transaction."""

    def rollup_sums(self, session: Session, runs: Sequence[Run], rows: RollupSlice) -> Sums:
        """The rollup ``rows`` inside each of the ``runs`` (a run: one level, a range of bucket
        starts), summed per (run's ``seg``, ``rows.dims``): ``(seg, *dims, *COUNT_FIELDS,
        cost_whole_usd, cost_frac_pusd, charge_whole_usd, charge_frac_pusd, leakage_whole_usd,
        leakage_frac_pusd)``, sums as the
        database gives them (null for no row), ``''`` for a null key, model or customer. Each run
        is one range of the table's primary key."""

    def rollup_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> Sums:
        """(v3) The ``limit`` values of ``rows``' one dimension with the greatest cost summed
        over the ``runs``, greatest first (compared in floating point: a ranking; ties by
        value), each as ``rollup_sums`` gives it without the ``seg``: ``(value,
        *COUNT_FIELDS, cost_whole_usd, ...)``, ``''`` for a null key, model or customer. The
        cost of every rollup row of the runs is read once, then every sum of the ranked keys or
        customers only (their index)."""
        ...

    def status_sums(self, session: Session, runs: Sequence[Run]) -> dict[str, int]:
        """(0021) The settled calls by status in the ``runs`` (``call_status_rollups``)."""
        ...

    def units_in(
        self,
        session: Session,
        basis: str,
        since: datetime,
        until: datetime,
        api_key_id: str | None,
        model: str | None,
        customer_id: str | None = None,
    ) -> list[Any]:
        """(v2) ``(at, api_key_id, model, units, customer_id)`` of every settled call
        (``call_start``: at its start) or ledger entry (``booked``: at its booking) in
        ``[since, until)`` that has units, with the key, model and customer filters; ``units``
        as stored (name → count)."""
        ...


_REPOSITORIES: ByDialect[CalllogRepository] = ByDialect(
    sqlite=SqliteCalllog(), postgresql=PostgresCalllog()
)


def repository(session: Session) -> CalllogRepository:
    """The call log' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
