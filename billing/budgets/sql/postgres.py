"""The budgets' SQL on PostgreSQL (``billing.budgets.repository``).

A reconciliation step's counter updates take the transaction-level advisory lock
``BUDGETS_LOCK`` shared; a budget's first counter (created, changed) takes it exclusive. So a
step either committed before the budget read the ledger (the budget counts its entries) or
reads the budget after it committed (the step adds them): read committed, each statement sees
what committed before it. Due webhooks are claimed with ``FOR UPDATE SKIP LOCKED``, so
replicas never claim the same row.

An authorization takes the transaction-level advisory lock of each budget it is under
(``HOLD_LOCKS`` + the version's row id, in ascending order: one lock order for all), then reads
the budgets' spend and holds: two authorizations under one budget decide one after the other,
the second seeing the first one's hold (read committed).

The alerts of a budget no counter keeps are recorded under its own lock (``ALERT_LOCKS`` + the
row id, in ascending order), taken by a step after everything else it locks: two steps over
one budget record one after the other, the second seeing the first one's alerts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, String, Subquery, bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY, distinct_on, insert
from sqlalchemy.orm import Session

from billing.budgets.rows import Claimed
from billing.budgets.sql.alerts import Alerts
from billing.budgets.sql.counters import Counters
from billing.budgets.sql.holds import Holds
from billing.budgets.sql.versions import BudgetVersions
from billing.rollups.buckets import QUARTER
from billing.rollups.sql.postgres import floor_sql
from billing.storage.lists import ARRAY_LIST
from billing.storage.models import Budget, BudgetSpend

#: The advisory lock's key (any constant of this service's own).
BUDGETS_LOCK = 0x6275_6467_6574  # "budget"

#: The base of the budgets' admission locks (``lock_budgets``): "hold" << 32, + the row id.
HOLD_LOCKS = 0x686F_6C64 << 32

#: The base of the locks under which the alerts of a budget no counter keeps are recorded
#: (``lock_alerts``): "alrt" << 32, + the row id. Not the admission locks, which an
#: authorization holds for its whole transaction: a step recording alerts does not wait for
#: authorizations.
ALERT_LOCKS = 0x616C_7274 << 32

LOCK_SHARED = text("SELECT pg_advisory_xact_lock_shared(:key)")
LOCK_EXCLUSIVE = text("SELECT pg_advisory_xact_lock(:key)")
#: Several of them in one round trip, in ascending order of the keys (every transaction takes
#: them in that order: none waits for another that waits for it). PostgreSQL evaluates a
#: volatile function of the select list after the ``ORDER BY`` (since 9.6), row by row.
LOCK_EACH_EXCLUSIVE = text(
    "SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k ORDER BY k"
)


class PostgresBudgets(BudgetVersions, Counters, Alerts, Holds):
    """``BudgetsRepository`` on PostgreSQL."""

    insert = staticmethod(insert)
    listed = ARRAY_LIST
    one_writer = False
    quarter = staticmethod(partial(floor_sql, QUARTER))

    def among(self, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
        clause: ColumnElement[bool] = column == func.any(
            bindparam("ids", list(ids), type_=ARRAY(String))
        )
        return clause

    def live_spent(self, now: datetime) -> Subquery:
        # Every version's latest counter in one pass over budget_spend (DISTINCT ON its key's
        # order), hash-joined to the versions: at 10,000 budgets ~15 against ~25 ms for a probe
        # of budget_spend's key a version (30,000 buffers). A version without a counter has no
        # row (``fullest`` leaves it out as well).
        latest = (
            select(
                BudgetSpend.budget_row,
                (BudgetSpend.settled_pusd + BudgetSpend.provisional_pusd).label("spent"),
            )
            .where(BudgetSpend.period_start <= now)
            .ext(distinct_on(BudgetSpend.budget_row))
            .order_by(BudgetSpend.budget_row, BudgetSpend.period_start.desc())
            .subquery("latest")
        )
        return (
            select(
                Budget.id.label("id"),
                Budget.budget_id.label("budget_id"),
                Budget.limit_usd.label("limit_usd"),
                latest.c.spent.label("spent"),
            )
            .join(latest, latest.c.budget_row == Budget.id)
            .where(Budget.ended_at.is_(None))
            .subquery("live")
        )

    def lock_shared(self, session: Session) -> None:
        session.execute(LOCK_SHARED, {"key": BUDGETS_LOCK})

    def lock_exclusive(self, session: Session) -> None:
        session.execute(LOCK_EXCLUSIVE, {"key": BUDGETS_LOCK})

    def lock_budgets(self, session: Session, rows: Sequence[int]) -> None:
        # On the connection (each authorization): the ORM session's execution of a text
        # statement costs more than the lock.
        if rows:
            keys = [HOLD_LOCKS + row for row in rows]
            session.connection().execute(LOCK_EACH_EXCLUSIVE, {"keys": keys}).all()

    def lock_alerts(self, session: Session, rows: Sequence[int]) -> None:
        if rows:
            keys = [ALERT_LOCKS + row for row in rows]
            session.connection().execute(LOCK_EACH_EXCLUSIVE, {"keys": keys}).all()

    def claim_due(
        self, session: Session, now: datetime, lease_until: datetime, owner: str, limit: int
    ) -> list[Claimed]:
        ids = list(session.scalars(self._due(now, limit).with_for_update(skip_locked=True)))
        return self._lease(session, ids, lease_until, owner)
