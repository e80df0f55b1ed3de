"""The budgets' SQL on SQLite (``billing.budgets.repository``).

SQLite has one writer at a time: a budget's first counter and a reconciliation step's counter
updates never interleave, nor do two authorizations (each in a write transaction), so the
locks are nothing; a claim of due webhooks runs in a write
transaction (nobody else claims meanwhile).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import lru_cache, partial
from typing import Any

import orjson
from sqlalchemy import ColumnElement, bindparam, func, literal_column, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from billing.budgets.rows import LiveHold, Unstepped
from billing.budgets.sql.alerts import Alerts
from billing.budgets.sql.counters import Counters
from billing.budgets.sql.holds import Holds
from billing.budgets.sql.versions import BudgetVersions
from billing.rollups.buckets import QUARTER
from billing.rollups.sql.sqlite import floor_sql
from billing.storage.lists import JSON_LIST
from billing.storage.types import sqlite_text

#: The counters' upsert (``add_spends``), the changes as one JSON parameter of
#: ``[budget_row, period_start text, settled, provisional]`` rows. (``WHERE true``: SQLite's
#: parser takes the ``ON`` of an upsert after a bare ``SELECT … FROM`` for a join's.)
_ADD_SPENDS = """
INSERT INTO budget_spend (budget_row, period_start, settled_pusd, provisional_pusd)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?) WHERE true
ON CONFLICT (budget_row, period_start) DO UPDATE SET
    settled_pusd = settled_pusd + excluded.settled_pusd,
    provisional_pusd = provisional_pusd + excluded.provisional_pusd
RETURNING budget_row, period_start, settled_pusd, provisional_pusd
"""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

#: A period start as the counters hold it (a step's changes repeat a few starts).
_start_text = lru_cache(maxsize=4096)(sqlite_text)


class SqliteBudgets(BudgetVersions, Counters, Alerts, Holds):
    """``BudgetsRepository`` on SQLite."""

    insert = staticmethod(insert)
    listed = JSON_LIST
    one_writer = True
    quarter = staticmethod(partial(floor_sql, QUARTER))

    def among(self, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
        each: Any = select(literal_column("value")).select_from(
            func.json_each(bindparam("ids", json.dumps(list(ids))))
        )
        clause: ColumnElement[bool] = column.in_(each.scalar_subquery())
        return clause

    def spend_reads(
        self,
        session: Session,
        now: datetime,
        keys: Collection[str],
        customers: Collection[str],
        everything: bool,
        calls_of_all: bool,
        pairs: Sequence[tuple[int, datetime]],
    ) -> tuple[list[LiveHold], list[Unstepped], None]:
        # The reads one at a time: on SQLite a statement is a call into the library, not a round
        # trip, and the UNION ALL that saves PostgreSQL two round trips cost SQLite more server
        # CPU per authorization than the separate reads (bench/holds.py, alternated runs). The
        # counters are read by ``spend`` (None). One snapshot all the same: the write
        # transaction of the authorization holds the one write lock.
        return (
            self.live_holds(session, now, keys, customers, everything),
            self.unstepped_calls(session, keys, calls_of_all),
            None,
        )

    def lock_shared(self, session: Session) -> None:
        return None

    def lock_budgets(self, session: Session, rows: Sequence[int]) -> None:
        # An authorization runs in a write transaction (BEGIN IMMEDIATE): the one writer.
        return None

    def lock_alerts(self, session: Session, rows: Sequence[int]) -> None:
        # (A step, as any writer, is the one writer.)
        return None

    def add_spends(
        self, session: Session, changes: Sequence[tuple[int, datetime, int, int]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        # One driver statement (the ORM's bind and result processing of thousands of rows of
        # datetimes cost more than the upsert): the starts go as their stored text and come
        # back as it, matched to the changes' instants by that text.
        if not changes:
            return {}
        if any(not _INT64_MIN <= n <= _INT64_MAX for _, _, *ns in changes for n in ns):
            # (JSON would carry it, and SQLite store it as a REAL in the integer column.)
            raise OverflowError("a budget counter's change is beyond 64-bit integers")
        rows = [[row, _start_text(start), settled, prov] for row, start, settled, prov in changes]
        starts = {row[1]: change[1] for row, change in zip(rows, changes, strict=True)}
        found = session.connection().exec_driver_sql(_ADD_SPENDS, (orjson.dumps(rows).decode(),))
        return {
            (int(row), starts[text]): (int(settled), int(provisional))
            for row, text, settled, provisional in found
        }

    def lock_exclusive(self, session: Session) -> None:
        return None
