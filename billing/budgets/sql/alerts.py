"""The budgets' alerts and the webhooks' outbox (``billing.budgets.repository``), built with
SQLAlchemy on the ORM tables; claiming due webhooks is the dialect's to lock."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    exists,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.orm import Session, aliased

from billing.budgets.rows import (
    Claimed,
)
from billing.budgets.sql.common import DialectBase
from billing.storage.models import (
    Budget,
    BudgetAlert,
    WebhookOutbox,
)


class Alerts(DialectBase):
    """Alerts, once per budget, period, threshold and type; the outbox's leases."""

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

    def alert_marks(
        self, session: Session, pairs: Collection[tuple[str, datetime]], kinds: Sequence[str]
    ) -> set[tuple[str, datetime, str, str]]:
        if not pairs:
            return set()
        query = select(
            BudgetAlert.budget_id, BudgetAlert.period_start, BudgetAlert.threshold, BudgetAlert.type
        ).where(
            tuple_(BudgetAlert.budget_id, BudgetAlert.period_start).in_(
                bindparam("pairs", sorted(pairs), expanding=True)
            ),
            BudgetAlert.type.in_(list(kinds)),
        )
        return {(b, start, t, kind) for b, start, t, kind in session.execute(query)}

    def open_crossings(
        self, session: Session, budget_ids: Collection[str], crossed: str, resolved: str
    ) -> dict[tuple[str, str], list[datetime]]:
        if not budget_ids:
            return {}
        partner = aliased(BudgetAlert)
        query = (
            select(BudgetAlert.budget_id, BudgetAlert.threshold, BudgetAlert.period_start)
            .join(Budget, Budget.id == BudgetAlert.budget_row)
            .where(
                BudgetAlert.budget_id.in_(sorted(budget_ids)),
                BudgetAlert.type == crossed,
                Budget.period == "rolling",
                ~exists().where(
                    and_(
                        partner.budget_id == BudgetAlert.budget_id,
                        partner.period_start == BudgetAlert.period_start,
                        partner.threshold == BudgetAlert.threshold,
                        partner.type == resolved,
                    )
                ),
            )
            .order_by(BudgetAlert.budget_id, BudgetAlert.threshold, BudgetAlert.period_start)
        )
        found: dict[tuple[str, str], list[datetime]] = {}
        for budget_id, threshold, start in session.execute(query):
            found.setdefault((budget_id, threshold), []).append(start)
        return found

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
