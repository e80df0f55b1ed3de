"""The call log's usage queries on SQLite (``billing.calllog.repository``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    Integer,
    Select,
    String,
    TextualSelect,
    and_,
    column,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.orm import Session

from billing.calllog.rows import RollupSlice, Sums
from billing.calllog.sql.common import (
    _BY_KEY,
    Ranking,
    Shape,
    UnitsIn,
    slice_params,
    slice_shape,
    slice_where,
)
from billing.rollups.buckets import Run
from billing.rollups.rows import CALL_START, ROLLUP_SUMMED
from billing.storage.models import Call
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


#: ``units_in`` of one customer's settled calls (``call_start``): the calls with units read
#: ``INDEXED BY`` the partial (customer_id, started_at) index of the calls with units. Without
#: the hint SQLite takes the plain (customer_id, started_at, request_id) index and checks every
#: call of the customer's period for units: 0.4–0.6 s for a month of a customer of the
#: 1,000,000-call bench seed (107,000 calls, none with units) against 1 ms. (SQLAlchemy renders
#: no table hint on SQLite, hence the text.) Bound: ``customer``, ``since``, ``until`` (stored
#: text, ``sqlite_text``); ``:key`` / ``:model`` appended when given.
_CUSTOMER_UNITS = (
    "SELECT started_at, api_key_id, model, units, customer_id FROM calls "
    "INDEXED BY ix_calls_units_customer_id_started_at "
    "WHERE units IS NOT NULL AND settled = 1 AND customer_id = :customer "
    "AND started_at >= :since AND started_at < :until"
)


class SqliteCalllog(UnitsIn, Ranking):
    """``CalllogRepository`` on SQLite."""

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
        if basis != CALL_START or customer_id is None:
            return super().units_in(session, basis, since, until, api_key_id, model, customer_id)
        sql = _CUSTOMER_UNITS
        params: dict[str, Any] = {
            "customer": customer_id,
            "since": sqlite_text(since),
            "until": sqlite_text(until),
        }
        if api_key_id is not None:
            sql, params["key"] = sql + " AND api_key_id = :key", api_key_id
        if model is not None:
            sql, params["model"] = sql + " AND model = :model", model
        statement = text(sql).columns(
            Call.started_at, Call.api_key_id, Call.model, Call.units, Call.customer_id
        )
        return list(session.execute(statement, params))

    def rollup_sums(self, session: Session, runs: Sequence[Run], rows: RollupSlice) -> Sums:
        return session.execute(*self.sums_statement(runs, rows))

    def sums_statement(
        self, runs: Sequence[Run], rows: RollupSlice, summed: Sequence[str] = ROLLUP_SUMMED
    ) -> tuple[Select[Any] | TextualSelect, dict[str, Any]]:
        shape = slice_shape(rows)
        bound = [[r.seg, r.level, sqlite_text(r.start), sqlite_text(r.end)] for r in runs]
        runs_json = orjson.dumps(bound).decode()
        if _listed_keys(shape, rows):
            assert rows.api_key_ids is not None
            ids = orjson.dumps(list(rows.api_key_ids)).decode()
            return _KEYS_SUMS[tuple(summed)], {
                "runs": runs_json,
                "basis": rows.basis,
                "ids": ids,
            }
        return _sums(shape, tuple(summed)), {**slice_params(rows), "runs": runs_json}


@functools.cache
def _sums(shape: Shape, summed: tuple[str, ...]) -> Select[Any]:
    """``sums_statement``'s statement of a slice's ``shape``, built once (its construction cost
    about 1 ms of CPU a statement): the runs bound as ``PIECES``, the filters as
    ``slice_where``'s."""
    table, where = slice_where(shape)
    c = table.c
    p = PIECES.c
    in_run = [c.level == p.lvl, c.bucket_start >= p.lo, c.bucket_start < p.hi]
    dims = shape[2]
    return (
        select(p.seg, *(c[d] for d in dims), *(func.sum(c[n]).label(n) for n in summed))
        .select_from(PIECES.join(table, and_(*where, *in_run)))
        # ``+column``: grouped without its index. Else SQLite walks the whole primary key
        # (basis, api_key_id, ...) in order, the runs inside, to skip a sort: every rollup
        # row of the basis instead of one index range per run (0.2 s against 0.02 s at
        # 100,000 calls).
        .group_by(p.seg, *(literal_column(f"+{table.name}.{d}") for d in dims))
    )


def _listed_keys(shape: Shape, rows: RollupSlice) -> bool:
    """Whether ``rows`` are a list of keys' rows of ``usage_rollups_by_key`` by key, nothing
    else filtered (the Overview's ranked keys, a page of keys): ``_KEYS_SUMS`` reads them."""
    return (
        shape[0] == _BY_KEY.name
        and rows.dims == ("api_key_id",)
        and rows.api_key_ids is not None
        and rows.api_key_id is None
        and rows.customer_id is None
        and rows.customer_ids is None
    )


class _KeysSums(dict[tuple[str, ...], TextualSelect]):
    """``sums_statement`` of a list of keys (``_listed_keys``) per tuple of summed columns:
    ``usage_rollups_by_key`` read ``INDEXED BY`` its (basis, api_key_id, level, bucket_start)
    index, one range per key and run. Without the hint SQLite reads every row of each run's
    range of the primary key (basis, level, bucket_start, ...) and keeps the listed keys: for
    60 keys over 30 days of the 1,000,000-call bench seed 20–75 ms against 3 ms. (SQLAlchemy
    renders no table hint on SQLite, hence the text.) Bound: ``runs`` (as ``PIECES``),
    ``basis`` and ``ids`` (the keys, one JSON array)."""

    def __missing__(self, summed: tuple[str, ...]) -> TextualSelect:
        sums = ", ".join(f"sum(r.{name}) AS {name}" for name in summed)
        statement = text(
            f"SELECT p.seg AS seg, r.api_key_id AS api_key_id, {sums} "
            "FROM (SELECT json_extract(value, '$[0]') AS seg, json_extract(value, '$[1]') AS lvl, "
            "json_extract(value, '$[2]') AS lo, json_extract(value, '$[3]') AS hi "
            "FROM json_each(:runs)) AS p "
            "JOIN usage_rollups_by_key AS r "
            "INDEXED BY ix_usage_rollups_by_key_basis_api_key_id_level_bucket_start "
            "ON r.basis = :basis AND r.api_key_id IN (SELECT value FROM json_each(:ids)) "
            "AND r.level = p.lvl AND r.bucket_start >= p.lo AND r.bucket_start < p.hi "
            "GROUP BY p.seg, +r.api_key_id"
        ).columns(
            column("seg", Integer),
            column("api_key_id", String),
            *(column(name, Integer) for name in summed),
        )
        self[summed] = statement
        return statement


_KEYS_SUMS = _KeysSums()
