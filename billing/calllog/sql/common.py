"""What the call log's SQL shares on both databases: the rollup rows a usage query reads (a
table and its conditions) and the units of the calls or entries of a period."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Float, Select, Table, and_, cast, func, or_, select
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.rollups.buckets import Run
from billing.rollups.rows import CALL_START, PICO, ROLLUP_SUMMED
from billing.storage.models import (
    Call,
    CallStatusRollup,
    LedgerEntry,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupByCustomer,
    UsageRollupByKey,
)

_KEYED: Table = UsageRollup.__table__  # type: ignore[assignment]
_ALL_KEYS: Table = UsageRollupAllKeys.__table__  # type: ignore[assignment]
_BY_KEY: Table = UsageRollupByKey.__table__  # type: ignore[assignment]
_BY_CUSTOMER: Table = UsageRollupByCustomer.__table__  # type: ignore[assignment]


def rollup_slice(rows: RollupSlice) -> tuple[Table, list[ColumnElement[Any]]]:
    """The rollup table ``rows`` reads and its conditions other than the bucket range: the one
    with the fewest rows that has what ``rows`` filters and groups by (0021: without a model,
    ``usage_rollups_by_key``; without a key either, ``usage_rollups_by_customer``)."""
    if not rows.by_key:
        table = _ALL_KEYS
    elif rows.model is not None or "model" in rows.dims:
        table = _KEYED
    elif rows.api_key_id is None and rows.api_key_ids is None and "api_key_id" not in rows.dims:
        table = _BY_CUSTOMER
    else:
        table = _BY_KEY
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
        self, runs: Sequence[Run], rows: RollupSlice, summed: Sequence[str] = ROLLUP_SUMMED
    ) -> tuple[Select[Any], dict[str, Any]]:
        raise NotImplementedError

    def rollup_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> Sums:
        (dim,) = rows.dims
        # The ranking sums the cost only; the ranked values' every sum is read after, by their
        # index (a key's or a customer's rows), not summed for every value of the period.
        statement, bound = self.sums_statement(runs, rows, _COST)
        sums = statement.subquery("sums")
        # Floating point ranks only; the sums returned are exact integers.
        cost = cast(func.sum(sums.c.cost_whole_usd), Float) + cast(
            func.sum(sums.c.cost_frac_pusd), Float
        ) / float(PICO)
        query = (
            select(sums.c[dim])
            .group_by(sums.c[dim])
            .order_by(cost.desc(), sums.c[dim])
            .limit(limit)
        )
        ranked = [value for (value,) in session.execute(query, bound)]
        if not ranked:
            return []
        if dim not in ("api_key_id", "customer_id"):
            return self._ranked_sums(session, runs, rows, ranked)
        if dim == "api_key_id":
            only = replace(rows, api_key_ids=tuple(ranked))
        else:
            only = replace(rows, customer_ids=tuple(ranked))
        exact: dict[Any, list[int]] = {}
        statement, bound = self.sums_statement(runs, only)
        for _seg, value, *values in session.execute(statement, bound):
            known = exact.get(value)
            values = [int(v or 0) for v in values]
            exact[value] = (
                values if known is None else [a + b for a, b in zip(known, values, strict=True)]
            )
        return [(value, *exact[value]) for value in ranked if value in exact]

    def _ranked_sums(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, ranked: list[Any]
    ) -> Sums:
        """Every sum of the ``ranked`` values of a dimension without an id filter (``model``):
        summed for every value, the ranked kept."""
        statement, bound = self.sums_statement(runs, rows)
        sums = statement.subquery("sums")
        (dim,) = rows.dims
        query = select(sums.c[dim], *(func.sum(sums.c[n]) for n in ROLLUP_SUMMED)).group_by(
            sums.c[dim]
        )
        found = {row[0]: row for row in session.execute(query, bound)}
        return [found[value] for value in ranked if value in found]


#: What the ranking sums.
_COST = ("cost_whole_usd", "cost_frac_pusd")


class UnitsIn:
    """``CalllogRepository.units_in`` and ``status_sums``, the same SQLAlchemy queries on both
    databases (a base of each database's calllog repository)."""

    def status_sums(self, session: Session, runs: Sequence[Run]) -> dict[str, int]:
        if not runs:
            return {}
        c = CallStatusRollup
        # One period's cover: a few runs (at most 7 a segment), each a range of the key.
        query = (
            select(c.status, func.sum(c.calls))
            .where(
                or_(
                    *(
                        and_(c.level == r.level, c.bucket_start >= r.start, c.bucket_start < r.end)
                        for r in runs
                    )
                )
            )
            .group_by(c.status)
        )
        return {status: int(count) for status, count in session.execute(query) if count}

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
