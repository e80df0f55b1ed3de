"""What the call log's SQL shares on both databases: the rollup rows a usage query reads (a
table and its conditions) and the units of the calls or entries of a period."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Select,
    Table,
    TextualSelect,
    and_,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.rollups.buckets import DAY, HOUR, MONTH, Run, ceil, floor, step
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
    ) -> tuple[Select[Any] | TextualSelect, dict[str, Any]]:
        raise NotImplementedError

    def rollup_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> Sums:
        (dim,) = rows.dims
        ranked = self.pruned_ranking(session, runs, rows, limit)
        if ranked is None:
            ranked = self.full_ranking(session, runs, rows, limit)
        if not ranked:
            return []
        if dim not in ("api_key_id", "customer_id"):
            return self._ranked_sums(session, runs, rows, ranked)
        # The ranked values' every sum is read after, by their index (a key's or a customer's
        # rows), not summed for every value of the period.
        exact: dict[Any, list[int]] = {}
        statement, bound = self.sums_statement(runs, _only(rows, ranked))
        for _seg, value, *values in session.execute(statement, bound):
            known = exact.get(value)
            values = [int(v or 0) for v in values]
            exact[value] = (
                values if known is None else [a + b for a, b in zip(known, values, strict=True)]
            )
        return [(value, *exact[value]) for value in ranked if value in exact]

    def full_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> list[Any]:
        """The ``limit`` values of ``rows``' one dimension with the greatest cost over the
        ``runs`` (every rollup row of the runs read once, the cost only): ``_scored``'s."""
        return [value for value, _score in self._scored(session, runs, rows, limit)]

    def _scored(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> list[tuple[Any, float]]:
        """The ranking's statement: the cost summed per value over the ``runs``, compared in
        floating point (``score``: the whole dollars' sum plus the picodollars' sum over
        ``PICO``), greatest first, ties by value in the database's order; ``(value, score)``."""
        (dim,) = rows.dims
        statement, bound = self.sums_statement(runs, rows, _COST)
        sums = statement.subquery("sums")
        # Floating point ranks only; the sums returned are exact integers.
        cost = cast(func.sum(sums.c.cost_whole_usd), Float) + cast(
            func.sum(sums.c.cost_frac_pusd), Float
        ) / float(PICO)
        query = (
            select(sums.c[dim], cost)
            .group_by(sums.c[dim])
            .order_by(cost.desc(), sums.c[dim])
            .limit(limit)
        )
        return [(value, float(score or 0)) for value, score in session.execute(query, bound)]

    def pruned_ranking(
        self, session: Session, runs: Sequence[Run], rows: RollupSlice, limit: int
    ) -> list[Any] | None:
        """``full_ranking``'s answer, the same values in the same order, without reading every
        row of the ``runs`` (a threshold algorithm); None where it does not apply (then
        ``full_ranking`` answers).

        Applies to the ``call_start`` keys and customers only: a settled call's cost is never
        negative there (non-negative rates of non-negative token and unit counts, a part of a
        bucket no larger than the bucket), so every rollup row holds a cost >= 0 in whole
        dollars >= 0 and picodollars in ``[0, PICO)``, and a value's cost over coarser buckets
        that cover the runs (``bounding_run``: a few rows per value) bounds its cost over the
        runs from above. (``booked`` is not pruned: an adjustment's cost is negative.) The
        values are taken by that bound, greatest first, in growing batches; their exact
        ranking (``_scored``, restricted to them) is final once its ``limit``-th score beats
        every value not taken: greater than the next bound, by a margin for the float
        rounding (``_beats``). A value not taken then ranks after ``limit`` values, ties
        included, so the ranking of the taken values is the ranking of all."""
        (dim,) = rows.dims
        if rows.basis != CALL_START or dim not in ("api_key_id", "customer_id") or not runs:
            return None
        coarse = bounding_run(runs)
        if coarse is None:
            return None
        table, where = rollup_slice(rows)
        c = table.c
        # Each value's bound summed and ranked in the database, only the first ``2 * taken``
        # sent: at 10,000 keys the ~20,000 month rows read into Python took 20-30 ms.
        # On PostgreSQL most of the statement is its heap visits (a page a month row). A
        # covering index (level 3: the key and cost INCLUDEd) was measured and not kept: it
        # scans in ~3 ms only just after a VACUUM (with half of a month's rows updated since,
        # 16,000 heap fetches again: ingest updates the current month's rows all the time), and
        # indexing the cost makes every rollup update non-HOT (65 % HOT before, 0 after).
        sums = (
            select(
                c[dim].label("value"),
                func.sum(c.cost_whole_usd).label("whole"),
                func.sum(c.cost_frac_pusd).label("frac"),
            )
            .where(
                *where,
                c.level == coarse.level,
                c.bucket_start >= coarse.start,
                c.bucket_start < coarse.end,
            )
            .group_by(c[dim])
            .subquery("bounds")
        )
        b = sums.c
        # Exact, in integers on both databases: the whole dollars with the picodollars' carry,
        # then the picodollars left (ties in any order: only the bounds' values matter).
        carried = b.whole + (b.frac - b.frac % PICO) // PICO
        read = select(b.value, b.whole, b.frac).order_by(carried.desc(), (b.frac % PICO).desc())
        taken = PRUNED_FIRST * limit
        while taken <= PRUNED_MOST:
            # Twice the batch: the batch, the next bound, and whether half the values at most
            # are taken (else the full ranking answers).
            found = session.execute(read.limit(2 * taken)).all()
            if len(found) < 2 * taken:
                return None
            bounds = [(int(whole) * PICO + int(frac), v) for v, whole, frac in found]
            scored = self._scored(
                session, runs, _only(rows, [v for _b, v in bounds[:taken]]), limit
            )
            if len(scored) == limit and _beats(scored[-1][1], bounds[taken][0]):
                return [value for value, _score in scored]
            taken *= 4
        return None

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


def _only(rows: RollupSlice, values: Sequence[Any]) -> RollupSlice:
    """``rows`` restricted to these keys or customers (``rows``' one dimension)."""
    if rows.dims == ("api_key_id",):
        return replace(rows, api_key_ids=tuple(values))
    return replace(rows, customer_ids=tuple(values))


#: The pruned ranking's first batch, per value ranked (each next batch is 4 times larger), and
#: the most values it takes (a larger batch, or half of the values: the full ranking).
PRUNED_FIRST = 4
PRUNED_MOST = 4000
#: The levels of a bound, finest first (a quarter hour is no coarser than any cover).
_BOUND_LEVELS = (HOUR, DAY, MONTH)


def bounding_run(runs: Sequence[Run]) -> Run | None:
    """The buckets whose sum bounds a value's sum over ``runs`` (values >= 0): those of the
    finest level among ``_BOUND_LEVELS`` of which at most two cover every run (else the
    months covering them); None when those are the runs themselves (the bound is the sum)."""
    lo = min(r.start for r in runs)
    hi = max(r.end for r in runs)
    for level in _BOUND_LEVELS:
        start, end = floor(level, lo), ceil(level, hi)
        if step(level, step(level, start)) >= end or level == MONTH:
            if len(runs) == 1 and runs[0].level == level:
                return None
            return Run(0, level, start, end)
    return None  # pragma: no cover (the month level always answers)


def _beats(score: float, bound_pusd: int) -> bool:
    """Whether a ranking's ``score`` (``_scored``: ``fl(fl(W) + fl(fl(F) / 1e12))`` of a
    value's sums ``W`` >= 0 and ``F`` >= 0) is greater than any score of a value whose exact
    cost is at most ``bound_pusd``: three roundings of non-negative terms make a score at most
    ``cost / PICO * (1 + 2**-53) ** 3``, under the margin ``1 + 10**-15``, compared exactly."""
    return Fraction(score) > Fraction(bound_pusd, PICO) * _MARGIN


_MARGIN = 1 + Fraction(1, 10**15)


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
