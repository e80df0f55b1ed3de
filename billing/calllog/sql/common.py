"""What the call log's SQL shares on both databases: the rollup rows a usage query reads (a
table and its conditions) and the units of the calls or entries of a period."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Select,
    Table,
    TextualSelect,
    and_,
    bindparam,
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


#: The filters a slice may bind (``rollup_slice``): its field, the bound parameter's name, and
#: whether it is a list.
_FILTERS = (
    ("api_key_id", "f_key", False),
    ("model", "f_model", False),
    ("customer_id", "f_customer", False),
    ("api_key_ids", "f_keys", True),
    ("customer_ids", "f_customers", True),
)


#: A slice's statement shape (``slice_shape``): its table's name, the filters present and the
#: dimensions.
Shape = tuple[str, tuple[str, ...], tuple[str, ...]]


def slice_shape(rows: RollupSlice) -> Shape:
    """What a statement over ``rows`` is built of, but for the values (a key of statements
    built once): the rollup table it reads, the one with the fewest rows that has what ``rows``
    filters and groups by (0021: without a model, ``usage_rollups_by_key``; without a key
    either, ``usage_rollups_by_customer``), the filters present and the dimensions."""
    present = tuple(name for name, _, _ in _FILTERS if getattr(rows, name) is not None)
    return _slice_table(rows).name, present, rows.dims


def slice_params(rows: RollupSlice) -> dict[str, Any]:
    """The values of ``slice_where``'s parameters for ``rows``."""
    params: dict[str, Any] = {"f_basis": rows.basis}
    for name, param, listed in _FILTERS:
        value = getattr(rows, name)
        if value is not None:
            params[param] = list(value) if listed else value
    return params


@functools.cache
def slice_where(shape: Shape) -> tuple[Table, list[ColumnElement[Any]]]:
    """The table of a slice's ``shape`` and its conditions other than the bucket range, bound by
    name (``f_basis``, ``f_key``, ``f_model``, ``f_customer``, ``f_keys``, ``f_customers``:
    ``slice_params``), the same objects for every slice of the shape."""
    table_name, present, _dims = shape
    table = _TABLES[table_name]
    c = table.c
    where: list[ColumnElement[Any]] = [c.basis == bindparam("f_basis")]
    for name, param, listed in _FILTERS:
        if name in present:
            if listed:
                where.append(c[name.removesuffix("s")].in_(bindparam(param, expanding=True)))
            else:
                where.append(c[name] == bindparam(param))
    return table, where


def _slice_table(rows: RollupSlice) -> Table:
    if not rows.by_key:
        return _ALL_KEYS
    if rows.model is not None or "model" in rows.dims:
        return _KEYED
    if rows.api_key_id is None and rows.api_key_ids is None and "api_key_id" not in rows.dims:
        return _BY_CUSTOMER
    return _BY_KEY


_TABLES = {t.name: t for t in (_KEYED, _ALL_KEYS, _BY_KEY, _BY_CUSTOMER)}


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
        query = _ranking(statement, dim).limit(limit)
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
        if coarse is None or coarse.end - coarse.start > _BOUND_SPAN:
            return None
        params = slice_params(rows)
        params.update(b_level=coarse.level, b_start=coarse.start, b_end=coarse.end)
        read = _bounds(slice_shape(rows))
        taken = PRUNED_FIRST * limit
        while taken <= PRUNED_MOST:
            # Twice the batch: the batch, the next bound, and whether half the values at most
            # are taken (else the full ranking answers).
            found = session.execute(read.limit(2 * taken), params).all()
            if len(found) < 2 * taken:
                return None
            bounds = [(float(b or 0), v) for v, b in found]
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
#: The longest bound's cover: fewer than 2**10 rows a value (``_beats``' margin).
_BOUND_SPAN = timedelta(days=366 * 80)
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


def _beats(score: float, bound: float) -> bool:
    """Whether a ranking's ``score`` (``_scored``: ``fl(fl(W) + fl(fl(F) / 1e12))`` of a
    value's sums ``W`` >= 0 and ``F`` >= 0) is greater than any score of a value whose ``bound``
    (``pruned_ranking``'s: the float sum of its rows' ``fl(fl(w) + fl(fl(f) / 1e12))``) is at
    most this one. Non-negative terms: the rounding of ``n`` rows' bound makes it at least
    ``cost * (1 - 2**-53) ** (n + 2)``, of ``n`` under 2**10 (months of a range) within
    ``1 + 2**-40`` of it, and the score's three roundings make it at most ``cost / PICO *
    (1 + 2**-53) ** 3``, under ``1 + 10**-15``: compared exactly, with both margins."""
    return Fraction(score) > Fraction(bound) * _MARGIN


_MARGIN = (1 + Fraction(1, 10**15)) * (1 + Fraction(1, 2**40))


@functools.cache
def _bounds(shape: Shape) -> Select[Any]:
    """``pruned_ranking``'s statement of a slice's ``shape`` (``slice_shape``): each value's
    bound over the buckets of ``b_level`` in [``b_start``, ``b_end``), greatest first.

    On PostgreSQL most of the statement is its heap visits (a page a month row). A covering
    index (level 3: the key and cost INCLUDEd) was measured and not kept: it scans in ~3 ms
    only just after a VACUUM (with half of a month's rows updated since, 16,000 heap fetches
    again: ingest updates the current month's rows all the time), and indexing the cost makes
    every rollup update non-HOT (65 % HOT before, 0 after). The bound is summed in floating
    point, each row's cost as one float: the exact sums (PostgreSQL's ``sum(bigint)`` is a
    numeric) and their carry cost as much as the scan (33 → 21 ms at 10,000 keys); ``_beats``
    allows for its rounding. Only the first rows are sent (``LIMIT``): at 10,000 keys the
    ~20,000 month rows read into Python took 20-30 ms."""
    table, where = slice_where(shape)
    (dim,) = shape[2]
    c = table.c
    bound = func.sum(
        cast(c.cost_whole_usd, Float) + cast(c.cost_frac_pusd, Float) / float(PICO)
    ).label("bound")
    return (
        select(c[dim].label("value"), bound)
        .where(
            *where,
            c.level == bindparam("b_level"),
            c.bucket_start >= bindparam("b_start"),
            c.bucket_start < bindparam("b_end"),
        )
        .group_by(c[dim])
        .order_by(bound.desc())
    )


@functools.cache
def _ranking(statement: Select[Any] | TextualSelect, dim: str) -> Select[Any]:
    """``_scored``'s statement over a cost ``statement`` (``sums_statement``'s, built once per
    shape: this is too): the cost summed per value of ``dim``, compared in floating point (the
    whole dollars' sum plus the picodollars' sum over ``PICO``), greatest first, ties by value
    in the database's order."""
    sums = statement.subquery("sums")
    # Floating point ranks only; the sums returned are exact integers.
    cost = cast(func.sum(sums.c.cost_whole_usd), Float) + cast(
        func.sum(sums.c.cost_frac_pusd), Float
    ) / float(PICO)
    return select(sums.c[dim], cost).group_by(sums.c[dim]).order_by(cost.desc(), sums.c[dim])


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
