"""The call log's usage queries on PostgreSQL (``billing.calllog.repository.CalllogRepository``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import DateTime, Integer, bindparam, column, func, select, text, true
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from billing.rollups.buckets import Run
from billing.rollups.repository import COUNT_FIELDS
from billing.storage.models import UsageRollup, UsageRollupAllKeys

_SUMMED = (*COUNT_FIELDS, "cost_whole_usd", "cost_frac_pusd")

#: The runs, bound as one array per column, as a table.
PIECES = (
    text("SELECT * FROM unnest(:seg, :lvl, :lo, :hi) AS v(seg, lvl, lo, hi)")
    .bindparams(
        bindparam("seg", type_=ARRAY(Integer)),
        bindparam("lvl", type_=ARRAY(Integer)),
        bindparam("lo", type_=ARRAY(DateTime(timezone=True))),
        bindparam("hi", type_=ARRAY(DateTime(timezone=True))),
    )
    .columns(
        column("seg", Integer),
        column("lvl", Integer),
        column("lo", DateTime(timezone=True)),
        column("hi", DateTime(timezone=True)),
    )
    .subquery("pieces")
)


class PostgresCalllog:
    """``CalllogRepository`` on PostgreSQL."""

    def rollup_sums(
        self,
        session: Session,
        runs: Sequence[Run],
        *,
        by_key: bool,
        basis: str,
        api_key_id: str | None,
        model: str | None,
        dims: Sequence[str],
    ) -> Iterable[Sequence[Any]]:
        table = UsageRollup.__table__ if by_key else UsageRollupAllKeys.__table__
        c = table.c
        p = PIECES.c
        where = [c.basis == basis, c.level == p.lvl, c.bucket_start >= p.lo, c.bucket_start < p.hi]
        if api_key_id is not None:
            where.append(c.api_key_id == api_key_id)
        if model is not None:
            where.append(c.model == model)
        # A plain join is hashed over every rollup row of the key; an aggregating LATERAL (one
        # PostgreSQL cannot flatten) reads one index range per run.
        matched = (
            select(*(c[d] for d in dims), *(func.sum(c[n]).label(n) for n in _SUMMED))
            .where(*where)
            .group_by(*(c[d] for d in dims))
            .lateral()
        )
        m = matched.c
        statement = (
            select(p.seg, *(m[d] for d in dims), *(func.sum(m[n]) for n in _SUMMED))
            .select_from(PIECES.join(matched, true()))
            .group_by(p.seg, *(m[d] for d in dims))
        )
        params = {
            "seg": [r.seg for r in runs],
            "lvl": [r.level for r in runs],
            "lo": [r.start for r in runs],
            "hi": [r.end for r in runs],
        }
        return session.execute(statement, params)
