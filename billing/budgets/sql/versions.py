"""The budgets' versions, their generation and the spend check's one statement
(``billing.budgets.repository``), built with SQLAlchemy on the ORM tables."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Float,
    Subquery,
    and_,
    bindparam,
    cast,
    event,
    func,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.orm import Session, aliased

from billing.budgets.rows import (
    BudgetDef,
    CounterRow,
    SpendCheckRows,
)
from billing.budgets.sql.common import DialectBase
from billing.storage.lists import CHUNK
from billing.storage.models import (
    Budget,
    BudgetGeneration,
    BudgetSpend,
    Customer,
    KeyAssignment,
    PlanVersion,
    Price,
)
from billing.storage.types import UTCDateTime

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
    Budget.tag,
    Budget.model,
    Budget.window_s,
    Budget.unpriced,
).where(Budget.ended_at.is_(None))


def _spend_check(plans: bool) -> Any:
    """``spend_check_rows``' one statement: the generation and the key's customer now (its
    latest assignment at or before ``:now``) on every row, with each version in force over the
    key or that customer and its latest counter at or before ``:now`` (nulls without one; one
    row of nulls but the first two without any version). The versions over the key and over
    the customer are two lookups of their partial indexes (``UNION ALL``: an ``OR`` of the two
    columns is a scan of one index on SQLite). With ``plans`` (an authorization's token
    estimate), the plan of that same assignment and its versions' count and highest id too
    (``billing.plans.cache.terms_now`` checks its copy by them): the estimate's charge then
    costs no statement while the copy holds."""
    now = bindparam("now", type_=UTCDateTime)
    assigned = (
        select(KeyAssignment.customer_id)
        .where(KeyAssignment.api_key_id == bindparam("key"), KeyAssignment.effective_from <= now)
        .order_by(KeyAssignment.effective_from.desc())
        .limit(1)
    )
    owner = assigned.scalar_subquery()
    # The customer's ``credit_required`` too: the authorization's credit check then needs no
    # statement of its own to know it (one round trip less on PostgreSQL).
    required = select(Customer.credit_required).where(Customer.customer_id == owner)
    # And the price rows of the authorization's ``:model`` (their count and highest id, as
    # ``billing.pricing.cache`` checks its copy by them; null: none asked, 0 rows), read before
    # the rows the cache may load after: one round trip less than that check's own statement.
    model = Price.model == bindparam("model")
    columns = [
        _GENERATION.scalar_subquery().label("generation"),
        owner.label("customer_id"),
        required.scalar_subquery().label("credit_required"),
        select(func.count()).where(model).scalar_subquery().label("price_count"),
        select(func.max(Price.id)).where(model).scalar_subquery().label("price_top"),
    ]
    if plans:
        # The same row as ``owner`` ((key, effective_from) is unique), its plan; versions are
        # only added (a new ``effective_from``), so their count changes with any committed.
        plan = assigned.with_only_columns(KeyAssignment.plan_id).scalar_subquery()
        of_plan = PlanVersion.plan_id == plan
        columns += [
            plan.label("plan_id"),
            select(func.count()).where(of_plan).scalar_subquery().label("plan_count"),
            select(func.max(PlanVersion.id)).where(of_plan).scalar_subquery().label("plan_top"),
        ]
    head = select(*columns).subquery("head")
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
            *head.c,
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


#: ``spend_check_rows``' statement, without and with the key's plan (a token estimate's).
_SPEND_CHECK = {plans: _spend_check(plans) for plans in (False, True)}

#: ``session.info`` key: the transaction that bumped the generation already.
_BUMPED = "billing.budgets.generation_bumped"


@event.listens_for(Session, "after_soft_rollback")
def _forget_bump(session: Session, previous_transaction: Any) -> None:
    """Any rollback, a savepoint's included, may have undone the bump: the next write bumps."""
    session.info.pop(_BUMPED, None)


class BudgetVersions(DialectBase):
    """Budgets' versions in force and their generation; the spend check's rows."""

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

    def budget_page(self, session: Session, after: str | None, limit: int) -> list[Budget]:
        query = select(Budget).where(Budget.ended_at.is_(None))
        if after is not None:
            query = query.where(Budget.budget_id > after)
        return list(session.scalars(query.order_by(Budget.budget_id).limit(limit)))

    def customers_budgets(self, session: Session, customer_ids: Sequence[str]) -> list[Budget]:
        found: list[Budget] = []
        ids = sorted(set(customer_ids))
        for start in range(0, len(ids), CHUNK):
            query = select(Budget).where(
                Budget.ended_at.is_(None), Budget.customer_id.in_(ids[start : start + CHUNK])
            )
            found += session.scalars(query)
        return sorted(found, key=lambda b: b.budget_id)

    def uncounted(self, session: Session) -> list[Budget]:
        query = select(Budget).where(
            Budget.ended_at.is_(None),
            or_(
                and_(Budget.api_key_id.is_(None), Budget.customer_id.is_(None)),
                Budget.model.is_not(None),
                Budget.period == "rolling",
            ),
        )
        return list(session.scalars(query.order_by(Budget.budget_id)))

    def fullest(self, session: Session, now: datetime, limit: int) -> list[Budget]:
        live = self.live_spent(now)
        used = (live.c.spent / func.nullif(cast(live.c.limit_usd, Float), 0)).label("used")
        # Ranked on the ids alone, then the ``limit`` rows read whole by their key.
        top = (
            select(live.c.id, live.c.budget_id, used)
            .where(live.c.spent.is_not(None))
            .order_by(used.desc().nulls_last(), live.c.budget_id)
            .limit(limit)
            .subquery("top")
        )
        query = (
            select(Budget)
            .join(top, top.c.id == Budget.id)
            .order_by(top.c.used.desc().nulls_last(), top.c.budget_id)
        )
        return list(session.scalars(query))

    def live_spent(self, now: datetime) -> Subquery:
        """``fullest``'s rows: ``(id, budget_id, limit_usd, spent)`` of each version in force,
        ``spent`` its latest counter at or before ``now`` (settled + provisional picodollars;
        None without one)."""
        # One probe of budget_spend's key a version, in a subquery kept apart (OFFSET 0).
        # Joined to the counter on its period, PostgreSQL ran the correlated max() twice a
        # budget in a hash join (75 against 30 ms at 10,000 budgets; PostgreSQL has its own).
        version = aliased(Budget)
        spent = (
            select(BudgetSpend.settled_pusd + BudgetSpend.provisional_pusd)
            .where(BudgetSpend.budget_row == version.id, BudgetSpend.period_start <= now)
            .order_by(BudgetSpend.period_start.desc())
            .limit(1)
            .correlate(version)
            .scalar_subquery()
        )
        return (
            select(
                version.id.label("id"),
                version.budget_id.label("budget_id"),
                version.limit_usd.label("limit_usd"),
                spent.label("spent"),
            )
            .where(version.ended_at.is_(None))
            .offset(0)
            .subquery("live")
        )

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
        self, session: Session, key: str, now: datetime, model: str | None = None
    ) -> SpendCheckRows:
        # Core on the session's connection: the ORM's execution adds nothing to plain columns.
        params = {"key": key, "now": now, "model": model}
        rows = session.connection().execute(_SPEND_CHECK[model is not None], params).all()
        counters = [
            CounterRow(int(row), start, int(settled or 0), int(provisional or 0))
            for *_, row, start, settled, provisional in rows
            if row is not None
        ]
        generation, customer, required, count, top = rows[0][:5]
        prices = {model: (int(count), int(top))} if model is not None and count else {}
        plan = None
        if model is not None:
            plan_id, plan_count, plan_top = rows[0][5:8]
            if plan_id is not None:
                plan = (plan_id, int(plan_count), int(plan_top or 0))
        return SpendCheckRows(
            None if generation is None else int(generation),
            customer,
            bool(required),
            counters,
            prices,
            plan,
        )
