"""The budgets' counters: spend per version and period, what open calls add, a reconciliation
step's amounts (``billing.budgets.repository``), built with SQLAlchemy on the ORM tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    String,
    bindparam,
    cast,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
    type_coerce,
    union_all,
)
from sqlalchemy.orm import Session

from billing.budgets.measure import AMOUNT_COLUMNS
from billing.budgets.rows import (
    OpenAmounts,
    Scope,
    StepAmounts,
)
from billing.budgets.sql.common import DialectBase
from billing.storage.models import (
    BudgetOpenCall,
    BudgetSpend,
    Call,
    LedgerEntry,
)
from billing.storage.types import UTCDateTime

_L = LedgerEntry.__table__.c
_C = Call.__table__.c
_COST = AMOUNT_COLUMNS["cost"]
_CHARGE = AMOUNT_COLUMNS["charge"]


#: The counters of (budget row, period start) pairs (``spend``, Core on the session's
#: connection: an authorization reads one or two, and the ORM's execution path cost more CPU
#: than the read). Pairs read by one ``_SPEND`` statement.
_SPEND_SLICE = 500
_SPEND = select(
    BudgetSpend.budget_row,
    BudgetSpend.period_start,
    BudgetSpend.settled_pusd,
    BudgetSpend.provisional_pusd,
).where(
    tuple_(BudgetSpend.budget_row, BudgetSpend.period_start).in_(bindparam("pairs", expanding=True))
)


def _summed(
    session: Session, amount: Any, owner: Any, started: Any, start: datetime, end: datetime | None
) -> int:
    """The sum of ``amount`` over the rows of ``owner`` whose ``started`` is in ``[start, end)``
    (no end: from ``start`` on); 0 for none."""
    query = select(func.coalesce(func.sum(amount), 0)).where(owner, started >= start)
    if end is not None:
        query = query.where(started < end)
    return int(session.scalar(query) or 0)


class Counters(DialectBase):
    """The counters' reads and writes."""

    def spend(
        self, session: Session, pairs: Sequence[tuple[int, datetime]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        # In slices: a list of 10,000 pairs (the console's statuses of 10,000 budgets) went past
        # PostgreSQL's max_stack_depth ("stack depth limit exceeded", answered 503).
        out: dict[tuple[int, datetime], tuple[int, int]] = {}
        for at in range(0, len(pairs), _SPEND_SLICE):
            found = session.connection().execute(
                _SPEND, {"pairs": list(pairs[at : at + _SPEND_SLICE])}
            )
            out.update(
                ((row, start), (settled, provisional)) for row, start, settled, provisional in found
            )
        return out

    def add_spend(
        self, session: Session, row: int, start: datetime, settled: int, provisional: int
    ) -> tuple[int, int]:
        return self.add_spends(session, [(row, start, settled, provisional)])[(row, start)]

    def add_spends(
        self, session: Session, changes: Sequence[tuple[int, datetime, int, int]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        if not changes:
            return {}
        # Core on the session's connection: the ORM's bulk insert path costs twice the CPU.
        rows = session.connection().execute(
            self._add_spend_statement(),
            [
                {
                    "budget_row": row,
                    "period_start": start,
                    "settled_pusd": settled,
                    "provisional_pusd": provisional,
                }
                for row, start, settled, provisional in changes
            ],
        )
        return {
            (int(row), start): (int(settled), int(provisional))
            for row, start, settled, provisional in rows
        }

    def _add_spend_statement(self) -> Any:
        """The counters' upsert, built once (executed for many rows as multi-row statements:
        SQLAlchemy's "insertmanyvalues", rows in the order given; the answer is matched by
        key, not by order)."""
        built = self.__dict__.get("_add_spend")
        if built is None:
            statement = self.insert(BudgetSpend)
            built = statement.on_conflict_do_update(
                index_elements=["budget_row", "period_start"],
                set_={
                    "settled_pusd": BudgetSpend.settled_pusd + statement.excluded.settled_pusd,
                    "provisional_pusd": BudgetSpend.provisional_pusd
                    + statement.excluded.provisional_pusd,
                },
            ).returning(
                BudgetSpend.budget_row,
                BudgetSpend.period_start,
                BudgetSpend.settled_pusd,
                BudgetSpend.provisional_pusd,
            )
            self.__dict__["_add_spend"] = built
        return built

    def settled_of(
        self,
        session: Session,
        scope: Scope,
        measure: str,
        start: datetime,
        end: datetime | None,
    ) -> int:
        column, value = scope
        amount = _L[AMOUNT_COLUMNS[measure]]
        return _summed(session, amount, _L[column] == value, _L.call_started_at, start, end)

    def provisional_of(
        self,
        session: Session,
        scope: Scope,
        measure: str,
        start: datetime,
        end: datetime | None,
    ) -> int:
        column, value = scope
        amount = getattr(BudgetOpenCall, measure + "_pusd")
        owner = getattr(BudgetOpenCall, column) == value
        return _summed(session, amount, owner, BudgetOpenCall.started_at, start, end)

    def refresh_open(self, session: Session, scope: Scope) -> None:
        column, value = scope
        opened = (
            _C[column] == value,
            _C.settled.is_(False),
            _C.api_key_id.is_not(None),
            _C.started_at.is_not(None),
            or_(_C[_COST].is_not(None), _C[_CHARGE].is_not(None)),
        )
        session.execute(
            delete(BudgetOpenCall).where(
                or_(
                    getattr(BudgetOpenCall, column) == value,
                    BudgetOpenCall.request_id.in_(select(_C.request_id).where(*opened)),
                )
            )
        )
        source = select(
            _C.request_id,
            _C.api_key_id,
            _C.customer_id,
            _C.started_at,
            func.coalesce(_C[_COST], 0),
            func.coalesce(_C[_CHARGE], 0),
        ).where(*opened)
        session.execute(
            self.insert(BudgetOpenCall).from_select(
                [
                    "request_id",
                    "api_key_id",
                    "customer_id",
                    "started_at",
                    "cost_pusd",
                    "charge_pusd",
                ],
                source,
            )
        )

    # -- a reconciliation step's amounts -----------------------------------------------------

    def step_amounts(
        self, session: Session, ids: Sequence[str], booked_at: datetime
    ) -> StepAmounts:
        """One statement (``UNION ALL``, a kind per row):

        - 0: the ``budget_open_calls`` rows of ``ids`` (what they added until now);
        - 1: the calls of ``ids`` left open with a key, a start and an amount (null amounts as 0;
          the others add no provisional spend);
        - 2: the entries of ``ids`` booked at ``booked_at``, summed per key, customer and UTC
          quarter hour of the call's start (``quarter``; no request id): every period boundary
          of an IANA zone (a local midnight) is on a quarter hour of UTC, so a quarter lies in
          one period of any budget.
        """
        quarter = type_coerce(self.quarter(_L.call_started_at), UTCDateTime)
        olds = select(
            literal(0),
            BudgetOpenCall.request_id,
            BudgetOpenCall.api_key_id,
            BudgetOpenCall.customer_id,
            BudgetOpenCall.started_at,
            cast(BudgetOpenCall.cost_pusd, BigInteger),
            cast(BudgetOpenCall.charge_pusd, BigInteger),
        ).where(self.among(BudgetOpenCall.request_id, ids))
        calls = select(
            literal(1),
            _C.request_id,
            _C.api_key_id,
            _C.customer_id,
            _C.started_at,
            cast(func.coalesce(_C[_COST], 0), BigInteger),
            cast(func.coalesce(_C[_CHARGE], 0), BigInteger),
        ).where(
            self.among(_C.request_id, ids),
            _C.settled.is_(False),
            _C.api_key_id.is_not(None),
            _C.started_at.is_not(None),
            or_(_C[_COST].is_not(None), _C[_CHARGE].is_not(None)),
        )
        entries = (
            select(
                literal(2),
                cast(null(), String),
                _L.api_key_id,
                _L.customer_id,
                quarter,
                cast(func.coalesce(func.sum(_L[_COST]), 0), BigInteger),
                cast(func.coalesce(func.sum(_L[_CHARGE]), 0), BigInteger),
            )
            .where(
                self.among(_L.request_id, ids),
                _L.booked_at == booked_at,
                _L.api_key_id.is_not(None),
                _L.call_started_at.is_not(None),
            )
            .group_by(_L.api_key_id, _L.customer_id, quarter)
        )
        found = StepAmounts([], [], [])
        for kind, rid, key, customer, started, cost, charge in session.connection().execute(
            union_all(olds, calls, entries)
        ):
            amounts = OpenAmounts(rid, key, customer, started, int(cost), int(charge))
            (found.olds, found.calls, found.entries)[kind].append(amounts)
        return found

    def replace_open(
        self, session: Session, gone: Sequence[str], rows: Sequence[OpenAmounts]
    ) -> None:
        if gone:
            session.execute(
                delete(BudgetOpenCall).where(self.among(BudgetOpenCall.request_id, gone))
            )
        if rows:
            statement = self.insert(BudgetOpenCall)
            session.execute(
                statement.on_conflict_do_update(
                    index_elements=["request_id"],
                    set_={
                        "api_key_id": statement.excluded.api_key_id,
                        "customer_id": statement.excluded.customer_id,
                        "started_at": statement.excluded.started_at,
                        "cost_pusd": statement.excluded.cost_pusd,
                        "charge_pusd": statement.excluded.charge_pusd,
                    },
                ),
                [r._asdict() for r in rows],
            )
