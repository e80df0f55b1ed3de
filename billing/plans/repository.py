"""The SQL of keys and plans, as a ``Protocol``, and ``repository(session)``, which gives its
implementation (``billing.plans.sql.common``: the same statements on both databases). Every
method runs in the session's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from billing.plans.sql.common import CorePlans
from billing.storage.dialects import ByDialect
from billing.storage.models import KeyAssignment, PlanPrice, PlanVersion


class PlansRepository(Protocol):
    """Keys' assignments and plans' versions (``key_assignments``, ``plan_versions``,
    ``plan_prices``)."""

    def key_history(
        self, session: Session, api_key_ids: Sequence[str]
    ) -> dict[str, list[KeyAssignment]]:
        """Every assignment of each key that has any, oldest ``effective_from`` first."""
        ...

    def keys_ever_of(self, session: Session, customer_ids: Sequence[str]) -> list[str]:
        """The keys any assignment of which names one of ``customer_ids`` (the
        ``customer_id`` index), by ``api_key_id``."""
        ...

    def customers_keys_in_force(
        self, session: Session, customer_ids: Sequence[str], now: datetime
    ) -> list[tuple[str, str | None, int]]:
        """``(customer_id, plan_id, keys)``: how many keys have as their assignment in force
        at ``now`` (the latest at or before it) one naming that customer (one of
        ``customer_ids``) and that plan (None: no plan); no order."""
        ...

    def add_key_version(self, session: Session, row: KeyAssignment) -> None:
        """Insert one assignment (its identity (key, effective_from) is not stored yet)."""
        ...

    def key_page(self, session: Session, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` keys, by ``api_key_id``, after ``after``: those with an assignment
        and those a call names."""
        ...

    def key_seen(self, session: Session, api_key_id: str) -> bool:
        """Whether a call names the key (a key seen only in events exists implicitly)."""
        ...

    def plan_exists(self, session: Session, plan_id: str) -> bool:
        """Whether the plan has a version."""
        ...

    def plan_versions(
        self, session: Session, plan_ids: Sequence[str] | None
    ) -> list[tuple[PlanVersion, list[PlanPrice]]]:
        """The versions of ``plan_ids`` (None: every plan) by plan, then ``effective_from``,
        each with its prices (by model, tier, threshold)."""
        ...

    def add_plan_version(
        self, session: Session, version: PlanVersion, prices: Sequence[PlanPrice]
    ) -> None:
        """Insert a version and its prices (ids given by the database, flushed)."""
        ...

    def plan_prices_by_id(self, session: Session, ids: Sequence[int]) -> dict[int, PlanPrice]:
        """The plan prices with these ids, each with its version loaded."""
        ...

    def plan_version_times(self, session: Session, ids: Sequence[int]) -> dict[int, datetime]:
        """The ``effective_from`` of the plan versions with these ids."""
        ...

    def mark_key_pending(self, session: Session, api_key_id: str, since: datetime) -> int:
        """Mark the key's calls started at or after ``since`` for re-reconciliation; how many."""
        ...

    def mark_plan_pending(self, session: Session, plan_id: str, since: datetime) -> int:
        """Mark for re-reconciliation the calls started at or after ``since`` of every key that
        is (or was) assigned ``plan_id``; how many."""
        ...


_REPOSITORIES: ByDialect[PlansRepository] = ByDialect(sqlite=CorePlans(), postgresql=CorePlans())


def repository(session: Session) -> PlansRepository:
    """The keys and plans' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
