"""The statements of keys and plans (``billing.plans.repository``), written with SQLAlchemy
alike for SQLite and PostgreSQL (one class serves both): small tables read by key, and two
``UPDATE``s of ``calls`` by the indexed key and start."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import exists, func, select, text, update
from sqlalchemy.orm import Session, aliased

from billing.storage.models import Call, KeyAssignment, PlanPrice, PlanVersion

#: Ids per ``IN (…)`` list.
CHUNK = 2000


def _key_page_sql(first: bool) -> str:
    """The page of keys by ``api_key_id``: those with an assignment and those a call names (a
    key seen only in events exists implicitly), after ``:after`` unless ``first``. The calls'
    keys are found by one index seek each (``calls (api_key_id, started_at, request_id)``),
    at most ``:limit`` of them, instead of reading every call of every key."""
    after = "" if first else "WHERE api_key_id > :after"
    seek = "api_key_id IS NOT NULL" if first else "api_key_id > :after"
    return f"""
WITH RECURSIVE seen(id, n) AS (
    SELECT (SELECT min(api_key_id) FROM calls WHERE {seek}), 1
    UNION ALL
    SELECT (SELECT min(c.api_key_id) FROM calls c WHERE c.api_key_id > seen.id), seen.n + 1
    FROM seen WHERE seen.id IS NOT NULL AND seen.n < :limit
)
SELECT id FROM seen WHERE id IS NOT NULL
UNION
SELECT api_key_id FROM key_assignments {after}
ORDER BY 1 LIMIT :limit"""


_FIRST_KEYS = text(_key_page_sql(True))
_NEXT_KEYS = text(_key_page_sql(False))


class CorePlans:
    """``PlansRepository`` on both databases."""

    def keys_ever_of(self, session: Session, customer_ids: Sequence[str]) -> list[str]:
        found: set[str] = set()
        ids = sorted(set(customer_ids))
        for start in range(0, len(ids), CHUNK):
            query = select(KeyAssignment.api_key_id).where(
                KeyAssignment.customer_id.in_(ids[start : start + CHUNK])
            )
            found.update(session.scalars(query))
        return sorted(found)

    def customers_keys_in_force(
        self, session: Session, customer_ids: Sequence[str], now: datetime
    ) -> list[tuple[str, str | None, int]]:
        # The assignments of the customers (their index) that no later one of the same key
        # at or before ``now`` replaces (one probe of (api_key_id, effective_from) each),
        # counted in SQL: a page of customers may have thousands of keys, and fetching each
        # key's versions cost 100 ms at 10,000 keys.
        later = aliased(KeyAssignment)
        replaced = exists().where(
            later.api_key_id == KeyAssignment.api_key_id,
            later.effective_from > KeyAssignment.effective_from,
            later.effective_from <= now,
        )
        found: list[tuple[str, str | None, int]] = []
        ids = sorted(set(customer_ids))
        for start in range(0, len(ids), CHUNK):
            query = (
                select(KeyAssignment.customer_id, KeyAssignment.plan_id, func.count())
                .where(
                    KeyAssignment.customer_id.in_(ids[start : start + CHUNK]),
                    KeyAssignment.effective_from <= now,
                    ~replaced,
                )
                .group_by(KeyAssignment.customer_id, KeyAssignment.plan_id)
            )
            # (customer_id is not null: IN matched it)
            found.extend((c or "", p, n) for c, p, n in session.execute(query))
        return found

    def key_history(
        self, session: Session, api_key_ids: Sequence[str]
    ) -> dict[str, list[KeyAssignment]]:
        found: dict[str, list[KeyAssignment]] = {}
        ids = sorted(set(api_key_ids))
        # A gateway without plans has no assignment at all: one probe instead of a search of
        # the step's keys (hundreds of bound ids) at every reconcile step.
        if not ids or not session.scalar(select(exists().select_from(KeyAssignment))):
            return found
        for start in range(0, len(ids), CHUNK):
            query = (
                select(KeyAssignment)
                .where(KeyAssignment.api_key_id.in_(ids[start : start + CHUNK]))
                .order_by(KeyAssignment.api_key_id, KeyAssignment.effective_from)
            )
            for row in session.scalars(query):
                found.setdefault(row.api_key_id, []).append(row)
        return found

    def add_key_version(self, session: Session, row: KeyAssignment) -> None:
        session.add(row)
        session.flush()

    def key_page(self, session: Session, after: str | None, limit: int) -> list[str]:
        if after is None:
            return list(session.scalars(_FIRST_KEYS, {"limit": limit}))
        return list(session.scalars(_NEXT_KEYS, {"after": after, "limit": limit}))

    def key_seen(self, session: Session, api_key_id: str) -> bool:
        return bool(session.scalar(select(exists().where(Call.api_key_id == api_key_id))))

    def plan_exists(self, session: Session, plan_id: str) -> bool:
        return bool(session.scalar(select(exists().where(PlanVersion.plan_id == plan_id))))

    def plan_versions(
        self, session: Session, plan_ids: Sequence[str] | None
    ) -> list[tuple[PlanVersion, list[PlanPrice]]]:
        query = select(PlanVersion).order_by(PlanVersion.plan_id, PlanVersion.effective_from)
        if plan_ids is not None:
            if not plan_ids:
                return []
            query = query.where(PlanVersion.plan_id.in_(sorted(set(plan_ids))))
        versions = list(session.scalars(query))
        prices: dict[int, list[PlanPrice]] = {v.id: [] for v in versions}
        ids = sorted(prices)
        for start in range(0, len(ids), CHUNK):
            rows = session.scalars(
                select(PlanPrice)
                .where(PlanPrice.plan_version_id.in_(ids[start : start + CHUNK]))
                .order_by(PlanPrice.model, PlanPrice.service_tier, PlanPrice.above_input_tokens)
            )
            for row in rows:
                prices[row.plan_version_id].append(row)
        return [(v, prices[v.id]) for v in versions]

    def add_plan_version(
        self, session: Session, version: PlanVersion, prices: Sequence[PlanPrice]
    ) -> None:
        session.add(version)
        session.flush()
        for price in prices:
            price.plan_version_id = version.id
            session.add(price)
        session.flush()

    def plan_prices_by_id(self, session: Session, ids: Sequence[int]) -> dict[int, PlanPrice]:
        if not ids:
            return {}
        rows = session.scalars(select(PlanPrice).where(PlanPrice.id.in_(sorted(set(ids)))))
        return {row.id: row for row in rows}

    def plan_version_times(self, session: Session, ids: Sequence[int]) -> dict[int, datetime]:
        if not ids:
            return {}
        rows = session.execute(
            select(PlanVersion.id, PlanVersion.effective_from).where(
                PlanVersion.id.in_(sorted(set(ids)))
            )
        )
        return {int(i): when for i, when in rows}

    def mark_key_pending(self, session: Session, api_key_id: str, since: datetime) -> int:
        marked = session.execute(
            update(Call)
            .where(Call.api_key_id == api_key_id, Call.started_at >= since)
            .values(pending=True, change_seq=Call.change_seq + 1)
        )
        return int(getattr(marked, "rowcount", 0) or 0)

    def mark_plan_pending(self, session: Session, plan_id: str, since: datetime) -> int:
        keys = select(KeyAssignment.api_key_id).where(KeyAssignment.plan_id == plan_id)
        marked = session.execute(
            update(Call)
            .where(Call.api_key_id.in_(keys), Call.started_at >= since)
            .values(pending=True, change_seq=Call.change_seq + 1)
        )
        return int(getattr(marked, "rowcount", 0) or 0)
