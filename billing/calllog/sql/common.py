"""What the call log's SQL shares on both databases: the rollup rows a usage query reads (a
table and its conditions) and the units of the calls or entries of a period."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, Select, Table, cast, func, select
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.rollups.buckets import Run
from billing.rollups.rows import CALL_START, PICO, ROLLUP_SUMMED
from billing.storage.models import Call, LedgerEntry, UsageRollup, UsageRollupAllKeys

_KEYED: Table = UsageRollup.__table__  # type: ignore[assignment]
_ALL_KEYS: Table = UsageRollupAllKeys.__table__  # type: ignore[assignment]


def rollup_slice(rows: RollupSlice) -> tuple[Table, list[ColumnElement[Any]]]:
    """The rollup table ``rows`` reads and its conditions other than the bucket range."""
    table = _KEYED if rows.by_key else _ALL_KEYS
    where = [table.c.basis == rows.basis]
    if rows.api_key_id is not None:
        where.append(table.c.api_key_id == rows.api_key_id)
    if rows.model is not None:
        where.append(table.c.model == rows.model)
    if rows.customer_id is not None:
        where.append(table.c.customer_id == rows.customer_id)
    if rows.api_key_ids is not None:
        where.append(table.c.api_key_id.in_(rows.api_key_ids))
    if rows.customer_ids is not None:
        where.append(table.c.customer_id.in_(rows.customer_ids))
    return table, where


class Ranking:
    """``CalllogRepository.rollup_ranking`` over a database's ``sums_statement`` (the
    statement of its ``rollup_sums``, each sum labelled with its column's name)."""

    def sums_statement(
        self, runs: Sequence[Run], rows: RollupSlice
    ) -> tuple[Select[Any], dict[str, Any]]:
        raise NotImplementedError

    def rollup_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> Sums:
        (dim,) = rows.dims
        statement, bound = self.sums_statement(runs, rows)
        sums = statement.subquery("sums")
        # Floating point ranks only; the sums returned are exact integers.
        cost = cast(func.sum(sums.c.cost_whole_usd), Float) + cast(
            func.sum(sums.c.cost_frac_pusd), Float
        ) / float(PICO)
        query = (
            select(sums.c[dim], *(func.sum(sums.c[n]) for n in ROLLUP_SUMMED))
            .group_by(sums.c[dim])
            .order_by(cost.desc(), sums.c[dim])
            .limit(limit)
        )
        return session.execute(query, bound)


class UnitsIn:
    """``CalllogRepository.units_in``, the same SQLAlchemy query on both databases (a base of
    each database's calllog repository)."""

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
        query: Any
        at: Any
        if basis == CALL_START:
            at = Call.started_at
            query = select(at, Call.api_key_id, Call.model, Call.units, Call.customer_id).where(
                Call.units.is_not(None), Call.settled.is_(True)
            )
            key, named, customer = Call.api_key_id, Call.model, Call.customer_id
        else:
            at = LedgerEntry.booked_at
            query = select(
                at,
                LedgerEntry.api_key_id,
                LedgerEntry.model,
                LedgerEntry.units,
                LedgerEntry.customer_id,
            ).where(LedgerEntry.units.is_not(None))
            key, named, customer = (
                LedgerEntry.api_key_id,
                LedgerEntry.model,
                LedgerEntry.customer_id,
            )
        query = query.where(at >= since, at < until)
        if api_key_id is not None:
            query = query.where(key == api_key_id)
        if model is not None:
            query = query.where(named == model)
        if customer_id is not None:
            query = query.where(customer == customer_id)
        return list(session.execute(query))
