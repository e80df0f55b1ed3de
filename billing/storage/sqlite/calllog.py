"""The call log's usage queries on SQLite (``billing.calllog.repository.CalllogRepository``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from sqlalchemy import Integer, String, and_, column, func, select, text
from sqlalchemy.orm import Session

from billing.rollups.buckets import Run
from billing.rollups.repository import COUNT_FIELDS
from billing.storage.models import UsageRollup, UsageRollupAllKeys
from billing.storage.types import sqlite_text

_SUMMED = (*COUNT_FIELDS, "cost_whole_usd", "cost_frac_pusd")

#: The runs, bound as one JSON array of ``[seg, level, lo, hi]`` (instants as stored text), as a
#: table: one bound value, however many runs.
PIECES = (
    text(
        "SELECT json_extract(value, '$[0]') AS seg, json_extract(value, '$[1]') AS lvl, "
        "json_extract(value, '$[2]') AS lo, json_extract(value, '$[3]') AS hi "
        "FROM json_each(:runs)"
    )
    .columns(
        column("seg", Integer), column("lvl", Integer), column("lo", String), column("hi", String)
    )
    .subquery("pieces")
)


class SqliteCalllog:
    """``CalllogRepository`` on SQLite."""

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
        on = [c.basis == basis, c.level == p.lvl, c.bucket_start >= p.lo, c.bucket_start < p.hi]
        if api_key_id is not None:
            on.append(c.api_key_id == api_key_id)
        if model is not None:
            on.append(c.model == model)
        statement = (
            select(p.seg, *(c[d] for d in dims), *(func.sum(c[n]) for n in _SUMMED))
            .select_from(PIECES.join(table, and_(*on)))
            .group_by(p.seg, *(c[d] for d in dims))
        )
        values = [[r.seg, r.level, sqlite_text(r.start), sqlite_text(r.end)] for r in runs]
        return session.execute(statement, {"runs": orjson.dumps(values).decode()})
