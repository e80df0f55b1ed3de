"""What a call is charged under: its key's customer and plan in force at its start, and that
plan's version (markup and own prices), loaded once per reconciliation step (CONTRACT "Keys,
customers and plans (v2)")."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from billing.plans.repository import repository
from billing.pricing.prices import PriceBook, PriceRow
from billing.rates import RATE_COLUMNS
from billing.storage.models import KeyAssignment, PlanPrice, PlanVersion


def plan_price_row(price: PlanPrice, effective_from: datetime) -> PriceRow:
    """A stored plan price as a ``PriceRow`` (in force from its version's ``effective_from``)."""
    text = price.unit_prices
    return PriceRow(
        price.id,
        price.model,
        effective_from,
        *(getattr(price, name) for name in RATE_COLUMNS),
        service_tier=price.service_tier or None,
        above_input_tokens=price.above_input_tokens,
        unit_prices={str(k): int(v) for k, v in json.loads(text).items()} if text else None,
        inference_geo=price.inference_geo or None,
    )


def failure_charges_of(text: str | None) -> tuple[tuple[str, str], ...]:
    """A plan version's stored ``failure_charges`` (JSON text of the categories not at
    ``bill``, or null) as sorted (category, policy) pairs."""
    return tuple(sorted(json.loads(text).items())) if text else ()


def assignment_at(history: Sequence[KeyAssignment], when: datetime) -> KeyAssignment | None:
    """The assignment in force at ``when`` of one key's ``history`` (oldest ``effective_from``
    first, as ``PlansRepository.key_history`` gives it): the latest at or before ``when``."""
    found = None
    for row in history:
        if row.effective_from > when:
            break
        found = row
    return found


@dataclass(frozen=True, slots=True)
class Terms:
    """A call's customer and plan (either may be None), and, when the plan has a version in
    force, its markup text (``markup_pct``), its own prices (``book``) and (v3) its charge
    policy for failed calls (``failure_charges``: (category, policy) pairs of the categories
    not at ``bill``)."""

    customer_id: str | None
    plan_id: str | None
    markup_pct: str | None = None
    book: PriceBook | None = None
    failure_charges: tuple[tuple[str, str], ...] = ()

    def plan_price(
        self,
        model: str | None,
        when: datetime | None,
        tier: str | None,
        context: int,
        geo: str | None = None,
    ) -> PriceRow | None:
        """The plan's own price for ``model`` at ``tier`` and ``geo`` (else fewer), as prices
        are looked up (``PriceBook.at``); None without one."""
        if self.book is None:
            return None
        return self.book.at(model, when, tier, context, geo)


#: A key without an assignment in force: no customer, no plan (charged at cost).
NO_TERMS = Terms(None, None)


class PlanVersions:
    """A plan's versions: ``(effective_from, markup text, PriceBook, failure charges)`` by
    ``effective_from`` (``Rating``; kept per process by ``billing.plans.cache``)."""

    def __init__(self, versions: Sequence[tuple[PlanVersion, list[PlanPrice]]]) -> None:
        self.versions = [
            (
                v.effective_from,
                v.markup_pct,
                PriceBook([plan_price_row(p, v.effective_from) for p in prices]),
                failure_charges_of(v.failure_charges),
            )
            for v, prices in versions
        ]

    def at(self, when: datetime) -> tuple[str, PriceBook, tuple[tuple[str, str], ...]] | None:
        found = None
        for effective_from, markup, book, failures in self.versions:
            if effective_from <= when:
                found = (markup, book, failures)
            else:
                break
        return found


class Rating:
    """The assignments of a set of keys and the plans they name, answering ``terms(key, t)``
    in memory."""

    def __init__(
        self,
        history: dict[str, list[KeyAssignment]],
        plans: dict[str, list[tuple[PlanVersion, list[PlanPrice]]]],
    ) -> None:
        self._history = history
        self._plans = {plan_id: PlanVersions(versions) for plan_id, versions in plans.items()}

    @classmethod
    def load(cls, session: Session, api_key_ids: Iterable[str | None]) -> Rating:
        """The assignments of ``api_key_ids`` and every version of the plans they name."""
        keys = sorted({k for k in api_key_ids if k})
        if not keys:
            return cls({}, {})
        repo = repository(session)
        history = repo.key_history(session, keys)
        plan_ids = sorted({a.plan_id for rows in history.values() for a in rows if a.plan_id})
        plans: dict[str, list[tuple[PlanVersion, list[PlanPrice]]]] = {}
        for version, prices in repo.plan_versions(session, plan_ids) if plan_ids else ():
            plans.setdefault(version.plan_id, []).append((version, prices))
        return cls(history, plans)

    def terms(self, api_key_id: str | None, when: datetime | None) -> Terms:
        """The key's customer and plan in force at ``when`` (the latest ``effective_from`` at
        or before it) and the plan's version then; ``NO_TERMS`` for none."""
        if api_key_id is None or when is None:
            return NO_TERMS
        found = assignment_at(self._history.get(api_key_id, ()), when)
        if found is None:
            return NO_TERMS
        plan = None if found.plan_id is None else self._plans.get(found.plan_id)
        return plan_terms(found.customer_id, found.plan_id, plan, when)


def plan_terms(
    customer_id: str | None, plan_id: str | None, plan: PlanVersions | None, when: datetime
) -> Terms:
    """The terms of an assignment to ``customer_id`` and ``plan_id`` (``plan``: its versions,
    None for none) at ``when``: the plan's version in force then, if any."""
    if plan_id is None:
        return Terms(customer_id, None)
    version = plan.at(when) if plan is not None else None
    if version is None:
        return Terms(customer_id, plan_id)
    return Terms(customer_id, plan_id, *version)


def plan_prices_by_id(session: Session, ids: set[int]) -> dict[int, PriceRow]:
    """The stored plan prices with these ids, as ``PriceRow``s (for a booked line)."""
    repo = repository(session)
    rows = repo.plan_prices_by_id(session, sorted(ids))
    times = repo.plan_version_times(session, sorted({r.plan_version_id for r in rows.values()}))
    return {i: plan_price_row(r, times[r.plan_version_id]) for i, r in rows.items()}
