"""The call log's usage queries on PostgreSQL (``billing.calllog.repository``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import DateTime, Integer, Select, bindparam, column, func, select, text, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.calllog.sql.common import (
    Ranking,
    Shape,
    UnitsIn,
    slice_params,
    slice_shape,
    slice_where,
)
from billing.rollups.buckets import Run
from billing.rollups.rows import ROLLUP_SUMMED

_INSTANT = DateTime(timezone=True)

#: The runs, bound as one array per column (seg, lvl, lo, hi), as a table.
PIECES = (
    text("SELECT * FROM unnest(:seg, :lvl, :lo, :hi) AS v(seg, lvl, lo, hi)")
    .bindparams(
        bindparam("seg", type_=ARRAY(Integer)),
        bindparam("lvl", type_=ARRAY(Integer)),
        bindparam("lo", type_=ARRAY(_INSTANT)),
        bindparam("hi", type_=ARRAY(_INSTANT)),
    )
    .columns(
        column("seg", Integer),
        column("lvl", Integer),
        column("lo", _INSTANT),
        column("hi", _INSTANT),
    )
    .subquery("pieces")
)


class PostgresCalllog(UnitsIn, Ranking):
    """``CalllogRepository`` on PostgreSQL."""

    def rollup_sums(self, session: Session, runs: Sequence[Run], rows: RollupSlice) -> Sums:
        return session.execute(*self.sums_statement(runs, rows))

    def sums_statement(
        self, runs: Sequence[Run], rows: RollupSlice, summed: Sequence[str] = ROLLUP_SUMMED
    ) -> tuple[Select[Any], dict[str, Any]]:
        bound = slice_params(rows)
        bound.update(
            seg=[r.seg for r in runs],
            lvl=[r.level for r in runs],
            lo=[r.start for r in runs],
            hi=[r.end for r in runs],
        )
        return _sums(slice_shape(rows), tuple(summed)), bound


@functools.cache
def _sums(shape: Shape, summed: tuple[str, ...]) -> Select[Any]:
    """``sums_statement``'s statement of a slice's ``shape``, built once (its construction cost
    more than 1 ms of CPU a statement, 8 of them an Overview): the runs bound as ``PIECES``, the
    filters as ``slice_where``'s."""
    # A plain join is hashed over every rollup row of the key; an aggregating LATERAL (one
    # PostgreSQL cannot flatten) reads one index range per run.
    p = PIECES.c
    table, where = slice_where(shape)
    dims = shape[2]
    c = table.c
    matched = (
        select(*(c[d] for d in dims), *(func.sum(c[n]).label(n) for n in summed))
        .where(*where, c.level == p.lvl, c.bucket_start >= p.lo, c.bucket_start < p.hi)
        .group_by(*(c[d] for d in dims))
        .lateral()
    )
    m = matched.c
    return (
        select(p.seg, *(m[d] for d in dims), *(func.sum(m[n]).label(n) for n in summed))
        .select_from(PIECES.join(matched, true()))
        .group_by(p.seg, *(m[d] for d in dims))
    )
