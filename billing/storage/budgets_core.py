"""The budgets' SQL both databases share (``billing.budgets.repository.BudgetsRepository``),
built with SQLAlchemy on the ORM tables; each database's module gives its own ``insert`` (with
``on_conflict_…``), its locks and its claim of due webhooks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    and_,
    bindparam,
    cast,
    delete,
    event,
    func,
    literal,
    null,
    or_,
    select,
    true,
    tuple_,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from billing.budgets.measure import AMOUNT_COLUMNS
from billing.budgets.repository import (
    BudgetDef,
    Claimed,
    CounterRow,
    OpenAmounts,
    Scope,
    StepAmounts,
)
from billing.storage.models import (
    Budget,
    BudgetAlert,
    BudgetGeneration,
    BudgetOpenCall,
    BudgetSpend,
    Call,
    KeyAssignment,
    LedgerEntry,
    WebhookOutbox,
)
from billing.storage.types import UTCDateTime

_L = LedgerEntry.__table__.c
_C = Call.__table__.c
_COST = AMOUNT_COLUMNS["cost"]
_CHARGE = AMOUNT_COLUMNS["charge"]


#: The counters of (budget row, period start) pairs (``spend``).
_SPEND = select(
    BudgetSpend.budget_row,
    BudgetSpend.period_start,
    BudgetSpend.settled_pusd,
    BudgetSpend.provisional_pusd,
).where(
    tuple_(BudgetSpend.budget_row, BudgetSpend.period_start).in_(bindparam("pairs", expanding=True))
)
#: The budgets' generation (``generation``).
_GENERATION = select(BudgetGeneration.generation).where(BudgetGeneration.id == 1)
#: The versions in force (``definitions``).
_DEFINITIONS = select(
    Budget.id,
    Budget.budget_id,
    Budget.api_key_id,
    Budget.customer_id,
    Budget.measure,
    Budget.period,
    Budget.tz,
    Budget.limit_usd,
    Budget.thresholds,
    Budget.webhook_url,
    Budget.tracked_from,
).where(Budget.ended_at.is_(None))


def _spend_check() -> Any:
    """``spend_check_rows``' one statement: the generation and the key's customer now (its
    latest assignment at or before ``:now``) on every row, with each version in force over the
    key or that customer and its latest counter at or before ``:now`` (nulls without one; one
    row of nulls but the first two without any version). The versions over the key and over
    the customer are two lookups of their partial indexes (``UNION ALL``: an ``OR`` of the two
    columns is a scan of one index on SQLite)."""
    now = bindparam("now", type_=UTCDateTime)
    owner = (
        select(KeyAssignment.customer_id)
        .where(KeyAssignment.api_key_id == bindparam("key"), KeyAssignment.effective_from <= now)
        .order_by(KeyAssignment.effective_from.desc())
        .limit(1)
        .scalar_subquery()
    )
    head = select(
        _GENERATION.scalar_subquery().label("generation"), owner.label("customer_id")
    ).subquery("head")
    live = Budget.ended_at.is_(None)
    over = union_all(
        select(Budget.id).where(live, Budget.api_key_id == bindparam("key")),
        select(Budget.id).where(live, Budget.customer_id == owner),
    ).subquery("over")
    latest = (
        select(func.max(BudgetSpend.period_start))
        .where(BudgetSpend.budget_row == over.c.id, BudgetSpend.period_start <= now)
        .correlate(over)
        .scalar_subquery()
    )
    return (
        select(
            head.c.generation,
            head.c.customer_id,
            over.c.id,
            BudgetSpend.period_start,
            BudgetSpend.settled_pusd,
            BudgetSpend.provisional_pusd,
        )
        .select_from(head)
        .outerjoin(over, true())
        .outerjoin(
            BudgetSpend,
            and_(BudgetSpend.budget_row == over.c.id, BudgetSpend.period_start == latest),
        )
    )


_SPEND_CHECK = _spend_check()

#: ``session.info`` key: the transaction that bumped the generation already.
_BUMPED = "billing.budgets.generation_bumped"


@event.listens_for(Session, "after_soft_rollback")
def _forget_bump(session: Session, previous_transaction: Any) -> None:
    """Any rollback, a savepoint's included, may have undone the bump: the next write bumps."""
    session.info.pop(_BUMPED, None)


class BudgetsCore:
    """``BudgetsRepository`` over a dialect's ``insert``; ``lock_shared`` / ``lock_exclusive``
    and ``claim_due`` are the dialect's."""

    insert: Callable[..., Any]
    #: SQL for the UTC quarter hour of an instant column (``billing.rollups.buckets.floor``).
    quarter: Callable[[Any], ColumnElement[Any]]

    def among(self, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
        """``column`` is one of ``ids``, as one bound value (a step's thousands of ids are not
        thousands of parameters)."""
        raise NotImplementedError

    # -- locks: a budget's first counter and the steps' counter updates never interleave ------

    def lock_shared(self, session: Session) -> None:
        raise NotImplementedError

    def lock_exclusive(self, session: Session) -> None:
        raise NotImplementedError

    # -- budgets -----------------------------------------------------------------------------

    def insert_budget(self, session: Session, values: dict[str, Any]) -> Budget:
        budget = Budget(**values)
        session.add(budget)
        session.flush()
        self.bump_generation(session)
        return budget

    def versions(self, session: Session, budget_id: str) -> list[Budget]:
        return list(
            session.scalars(
                select(Budget).where(Budget.budget_id == budget_id).order_by(Budget.version)
            )
        )

    def end_budget(self, session: Session, row: int, now: datetime) -> None:
        session.execute(update(Budget).where(Budget.id == row).values(ended_at=now))
        self.bump_generation(session)

    def list_budgets(self, session: Session, include_ended: bool) -> list[Budget]:
        if include_ended:
            # The last version of each budget.
            last = (
                select(Budget.budget_id, func.max(Budget.version).label("v"))
                .group_by(Budget.budget_id)
                .subquery()
            )
            query = select(Budget).join(
                last, and_(Budget.budget_id == last.c.budget_id, Budget.version == last.c.v)
            )
        else:
            query = select(Budget).where(Budget.ended_at.is_(None))
        return list(session.scalars(query.order_by(Budget.budget_id)))

    def generation(self, session: Session) -> int | None:
        value = session.scalar(_GENERATION)
        return None if value is None else int(value)

    def bump_generation(self, session: Session) -> None:
        """Every write of ``budgets`` calls this in its transaction (the row is put back when
        missing); once per transaction (again after a rollback of a savepoint, which may have
        taken the bump with it): the readers only need a new number after it, and each bump is
        a new version of the one row that every spend check reads (thousands in one
        transaction spread it over pages that PostgreSQL's index scan then walks until a
        vacuum)."""
        transaction = session.get_transaction()
        if transaction is not None and session.info.get(_BUMPED) is transaction:
            return
        session.info[_BUMPED] = transaction
        statement = self.insert(BudgetGeneration).values(id=1, generation=1)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["id"],
                set_={"generation": BudgetGeneration.generation + 1},
            )
        )

    def definitions(self, session: Session) -> list[BudgetDef]:
        return [BudgetDef(*row) for row in session.connection().execute(_DEFINITIONS)]

    def spend_check_rows(
        self, session: Session, key: str, now: datetime
    ) -> tuple[int | None, str | None, list[CounterRow]]:
        # Core on the session's connection: the ORM's execution adds nothing to plain columns.
        rows = session.connection().execute(_SPEND_CHECK, {"key": key, "now": now}).all()
        counters = [
            CounterRow(int(row), start, int(settled or 0), int(provisional or 0))
            for _, _, row, start, settled, provisional in rows
            if row is not None
        ]
        generation = rows[0][0]
        return (None if generation is None else int(generation)), rows[0][1], counters

    # -- counters ----------------------------------------------------------------------------

    def spend(
        self, session: Session, pairs: Sequence[tuple[int, datetime]]
    ) -> dict[tuple[int, datetime], tuple[int, int]]:
        if not pairs:
            return {}
        found = session.execute(_SPEND, {"pairs": list(pairs)})
        return {(row, start): (settled, provisional) for row, start, settled, provisional in found}

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
        query = select(func.coalesce(func.sum(amount), 0)).where(
            _L[column] == value, _L.call_started_at >= start
        )
        if end is not None:
            query = query.where(_L.call_started_at < end)
        return int(session.scalar(query) or 0)

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
        query = select(func.coalesce(func.sum(amount), 0)).where(
            getattr(BudgetOpenCall, column) == value, BudgetOpenCall.started_at >= start
        )
        if end is not None:
            query = query.where(BudgetOpenCall.started_at < end)
        return int(session.scalar(query) or 0)

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

    # -- alerts and the outbox ---------------------------------------------------------------

    def insert_alert(self, session: Session, values: dict[str, Any]) -> bool:
        statement = (
            self.insert(BudgetAlert)
            .values(**values)
            .on_conflict_do_nothing(
                index_elements=["budget_id", "period_start", "threshold", "type"]
            )
            .returning(BudgetAlert.alert_id)
        )
        return session.execute(statement).first() is not None

    def insert_outbox(self, session: Session, values: dict[str, Any]) -> None:
        session.execute(self.insert(WebhookOutbox).values(**values))

    def alerts(
        self, session: Session, budget_id: str | None, since: datetime | None, limit: int
    ) -> list[tuple[BudgetAlert, WebhookOutbox | None]]:
        query = select(BudgetAlert, WebhookOutbox).outerjoin(
            WebhookOutbox, WebhookOutbox.alert_id == BudgetAlert.alert_id
        )
        if budget_id is not None:
            query = query.where(BudgetAlert.budget_id == budget_id)
        if since is not None:
            query = query.where(BudgetAlert.created_at >= since)
        query = query.order_by(BudgetAlert.created_at, BudgetAlert.alert_id).limit(limit)
        return [(row[0], row[1]) for row in session.execute(query)]

    def _due(self, now: datetime, limit: int) -> Any:
        return (
            select(WebhookOutbox.alert_id)
            .where(
                WebhookOutbox.state == "pending",
                WebhookOutbox.next_attempt_at <= now,
                or_(WebhookOutbox.lease_until.is_(None), WebhookOutbox.lease_until < now),
            )
            .order_by(WebhookOutbox.next_attempt_at)
            .limit(limit)
        )

    def claim_due(
        self, session: Session, now: datetime, lease_until: datetime, owner: str, limit: int
    ) -> list[Claimed]:
        ids = list(session.scalars(self._due(now, limit)))
        return self._lease(session, ids, lease_until, owner)

    def _lease(
        self, session: Session, ids: Sequence[str], lease_until: datetime, owner: str
    ) -> list[Claimed]:
        if not ids:
            return []
        session.execute(
            update(WebhookOutbox)
            .where(WebhookOutbox.alert_id.in_(list(ids)))
            .values(lease_owner=owner, lease_until=lease_until)
        )
        rows = session.execute(
            select(
                WebhookOutbox.alert_id,
                WebhookOutbox.url,
                BudgetAlert.body,
                Budget.webhook_secret,
                WebhookOutbox.attempts,
                WebhookOutbox.created_at,
            )
            .join(BudgetAlert, BudgetAlert.alert_id == WebhookOutbox.alert_id)
            .join(Budget, Budget.id == BudgetAlert.budget_row)
            .where(WebhookOutbox.alert_id.in_(list(ids)))
        )
        return [Claimed(*row) for row in rows]

    def record_attempt(
        self, session: Session, alert_id: str, owner: str, values: dict[str, Any]
    ) -> None:
        session.execute(
            update(WebhookOutbox)
            .where(WebhookOutbox.alert_id == alert_id, WebhookOutbox.lease_owner == owner)
            .values(lease_owner=None, lease_until=None, **values)
        )
