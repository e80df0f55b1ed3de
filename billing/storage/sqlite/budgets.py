"""The budgets' SQL on SQLite (``billing.budgets.repository.BudgetsRepository``).

SQLite has one writer at a time: a budget's first counter and a reconciliation step's counter
updates never interleave, so the locks are nothing; a claim of due webhooks runs in a write
transaction (nobody else claims meanwhile).
"""

from __future__ import annotations

from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from billing.storage.budgets_core import BudgetsCore


class SqliteBudgets(BudgetsCore):
    """``BudgetsRepository`` on SQLite."""

    insert = staticmethod(insert)

    def lock_shared(self, session: Session) -> None:
        return None

    def lock_exclusive(self, session: Session) -> None:
        return None


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqliteBudgets()
