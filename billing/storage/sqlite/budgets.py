"""The budgets' SQL on SQLite (``billing.budgets.repository.BudgetsRepository``).

SQLite has one writer at a time: a budget's first counter and a reconciliation step's counter
updates never interleave, so the locks are nothing; a claim of due webhooks runs in a write
transaction (nobody else claims meanwhile).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, literal_column, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from billing.rollups.buckets import QUARTER
from billing.storage.budgets_core import BudgetsCore
from billing.storage.sqlite.rollups import floor_sql


class SqliteBudgets(BudgetsCore):
    """``BudgetsRepository`` on SQLite."""

    insert = staticmethod(insert)
    quarter = staticmethod(partial(floor_sql, QUARTER))

    def among(self, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
        each: Any = select(literal_column("value")).select_from(
            func.json_each(bindparam("ids", json.dumps(list(ids))))
        )
        clause: ColumnElement[bool] = column.in_(each.scalar_subquery())
        return clause

    def lock_shared(self, session: Session) -> None:
        return None

    def lock_exclusive(self, session: Session) -> None:
        return None


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqliteBudgets()
