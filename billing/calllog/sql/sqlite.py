"""The call log's usage queries on SQLite (``billing.calllog.repository``)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from sqlalchemy import Integer, String, and_, column, func, select, text
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.calllog.sql.common import UnitsIn, rollup_slice
from billing.rollups.buckets import Run
from billing.rollups.rows import ROLLUP_SUMMED
from billing.storage.types import sqlite_text

#: The runs, bound as one JSON array of ``[seg, level, lo, hi]`` (instants as stored text), as a
#: table: one bound value however many runs. SQLite joins it first and reads one range of the
#: rollup table's key per run.
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


class SqliteCalllog(UnitsIn):
    """``CalllogRepository`` on SQLite."""

    def rollup_sums(self, session: Session, runs: Sequence[Run], rows: RollupSlice) -> Sums:
        table, where = rollup_slice(rows)
        c = table.c
        p = PIECES.c
        in_run = [c.level == p.lvl, c.bucket_start >= p.lo, c.bucket_start < p.hi]
        keys = [c[d] for d in rows.dims]
        statement = (
            select(p.seg, *keys, *(func.sum(c[n]) for n in ROLLUP_SUMMED))
            .select_from(PIECES.join(table, and_(*where, *in_run)))
            .group_by(p.seg, *keys)
        )
        bound = [[r.seg, r.level, sqlite_text(r.start), sqlite_text(r.end)] for r in runs]
        return session.execute(statement, {"runs": orjson.dumps(bound).decode()})
