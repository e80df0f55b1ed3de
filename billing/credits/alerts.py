"""Credit alerts on the budgets' durable, signed webhook outbox (CONTRACT "Prepaid credits
(v3)"): ``credits.low`` when an owner's available credit falls below its customer's
``low_balance_usd``, ``credits.exhausted`` when it reaches zero, ``credits.expiring`` seven
days before a grant with a remainder expires.

An alert is stored through ``billing.budgets.service.enqueue_alert`` (a ``budget_alerts`` row,
and its ``webhook_outbox`` row in the same transaction, signed with the budget's secret by the
delivery worker): once for each budget in force over the owner (its customer, or its key)
that has a ``webhook_url``, the endpoint and secret the operator gave for that owner's alerts.
An owner without such a budget gets no webhook (the contract gives customers no URL of their
own). Once per crossing: a crossing is seen in the step whose draws made it (the owner's
grants are locked while it draws, so two steps never see the same one), and stored under
that instant; an expiring grant once, under its ``expires_at``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from billing.budgets.cache import InForce, in_force
from billing.budgets.service import enqueue_alert
from billing.credits.repository import repository
from billing.credits.rows import GrantView, Owner
from billing.money import pusd_to_str
from billing.timefmt import rfc3339

LOW = "credits.low"
EXHAUSTED = "credits.exhausted"
EXPIRING = "credits.expiring"
#: How long before a grant's ``expires_at`` ``credits.expiring`` is sent.
EXPIRING_AHEAD = timedelta(days=7)


def _send(
    session: Session, owner: Owner, kind: str, key: str, start: datetime, data: dict[str, Any],
    now: datetime,
) -> int:  # fmt: skip
    """Enqueue the alert for every budget in force over ``owner`` with a webhook URL."""
    made = 0
    for budget in in_force(session).by_row.values():
        if budget.webhook_url is None:
            continue
        if (budget.customer_id, budget.api_key_id) != owner:
            continue
        body = {"customer_id": owner.customer_id, "api_key_id": owner.api_key_id, **data}
        made += enqueue_alert(session, budget, kind, key, start, body, now)
    return made


#: ``watched``'s answer for the budgets' copy it was made of (``billing.budgets.cache``): a new
#: copy (a new budget generation) makes it again.
_watched: tuple[InForce, frozenset[Owner]] | None = None


def watched(session: Session) -> frozenset[Owner]:
    """The owners an alert can reach: those with a budget in force with a webhook URL.
    ``crossings`` of any other owner stores nothing, so a step need not figure them.

    Read from the process's copy of the budgets in force (``billing.budgets.cache.in_force``:
    one statement, the generation, while no budget changed), not from ``budgets``: reading the
    10,000 versions of 10,000 budgets cost each reconciliation step 60-120 ms, inside SQLite's
    one write lock."""
    global _watched
    budgets = in_force(session)
    made = _watched
    if made is None or made[0] is not budgets:
        owners = frozenset(
            Owner(budget.customer_id, budget.api_key_id)
            for budget in budgets.by_row.values()
            if budget.webhook_url is not None
        )
        made = _watched = (budgets, owners)
    return made[1]


def crossings(
    session: Session, owner: Owner, before_pusd: int, after_pusd: int, now: datetime
) -> int:
    """The alerts of the owner's available credit going from ``before_pusd`` to
    ``after_pusd`` (picodollars) at ``now``: ``credits.low`` crossing its customer's
    ``low_balance_usd`` downward, ``credits.exhausted`` reaching zero; how many were stored."""
    if after_pusd >= before_pusd:
        return 0
    low = None
    if owner.customer_id is not None:
        row = repository(session).customer(session, owner.customer_id)
        low = row.low_balance_pusd if row is not None else None
    data = {"available_usd": pusd_to_str(after_pusd), "low_balance_usd": pusd_to_str(low)}
    made = 0
    if low is not None and after_pusd < low <= before_pusd:
        made += _send(session, owner, LOW, str(pusd_to_str(low)), now, data, now)
    if after_pusd <= 0 < before_pusd:
        made += _send(session, owner, EXHAUSTED, "0", now, data, now)
    return made


def expiring(session: Session, now: datetime) -> int:
    """``credits.expiring`` for each grant with a remainder that expires within
    ``EXPIRING_AHEAD`` of ``now`` (once per grant); how many were stored."""
    repo = repository(session)
    made = 0
    for owner, grant_ids in repo.expiring_owners(session, now, now + EXPIRING_AHEAD).items():
        for grant in repo.grants(session, [owner]):
            if grant.grant_id in grant_ids and grant.remaining_pusd > 0 and not grant.voided:
                made += _expiring(session, grant, now)
    return made


def _expiring(session: Session, grant: GrantView, now: datetime) -> int:
    assert grant.expires_at is not None
    # budget_alerts.threshold holds 40 characters: a grant id may be longer.
    key = "grant:" + hashlib.sha256(grant.grant_id.encode()).hexdigest()[:32]
    data = {
        "grant_id": grant.grant_id,
        "remaining_usd": pusd_to_str(grant.remaining_pusd),
        "expires_at": rfc3339(grant.expires_at),
    }
    return _send(session, grant.owner, EXPIRING, key, grant.expires_at, data, now)
