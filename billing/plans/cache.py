"""The versions of plans kept in memory per process and database, for the authorization's hold
(CONTRACT "Authorizations and holds (v3)": a token estimate holds the larger of its cost and its
charge under the key's plan in force now; ``billing.budgets.held``; issue #39).

Plans get new versions at any time, by any process or replica sharing the database, so a copy
is never trusted by its age: the authorization's spend check reads, in its one statement, the
plan of the key's assignment in force and that plan's versions' count and highest id
(``billing.budgets.sql.versions``), and the plan's versions are loaded again, in the same
session, when that is not what the copy was loaded at. Plan versions are only ever inserted (a
new ``effective_from``, its prices in the same transaction; never changed, never deleted), so
every version committed since the copy, whatever the order its id was drawn in, changes the
count. The numbers are read before the rows (a later snapshot under read committed, the same
one in a SQLite write transaction), so a copy is never older than the numbers it is kept under:
a version committed by another process before an authorization began is the one it uses.

The key's assignment itself is not kept here: it is read by that statement every time.

A transaction that adds plan versions itself must not look them up here (its rows, if it rolled
back, could be kept under numbers a later insert reaches again): the authorization never writes
plans.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.plans.rating import PlanVersions, Terms, plan_terms
from billing.plans.repository import repository
from billing.storage.copies import VersionedCopies

#: plan id → its versions, kept under (their count, their highest id); at most 1,024 plans an
#: engine.
_plans: VersionedCopies[PlanVersions] = VersionedCopies(most=1024)


def terms_now(
    session: Session,
    customer_id: str | None,
    plan: tuple[str, int, int] | None,
    when: datetime,
) -> Terms:
    """The terms at ``when`` of an assignment to ``customer_id`` and ``plan``: (plan id, its
    versions' count, their highest id) as this session's statement read them before (the
    spend check's), or None for no plan. The plan's versions come from this process's copy
    when none was added since it was loaded, else are loaded (two statements) and kept."""
    if plan is None:
        return plan_terms(customer_id, None, None, when)
    plan_id, count, top = plan
    versions = _plans.get(
        session,
        plan_id,
        (count, top),
        lambda: PlanVersions(repository(session).plan_versions(session, [plan_id])),
    )
    return plan_terms(customer_id, plan_id, versions, when)
