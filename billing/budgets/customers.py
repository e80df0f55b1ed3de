"""Which customer a key belongs to now, for the spend check (``GET /v1/spend?api_key_id=``
answers the budgets over the key and over its customer): its assignment in force now
(``key_assignments``, CONTRACT "Keys, customers and plans (v2)"). A customer budget's spend is
not resolved through keys: it counts the calls whose customer at their start is the budget's
(``calls.customer_id``, ``ledger_entries.customer_id``; ``billing.budgets.counters``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from billing.plans.rating import assignment_at
from billing.storage.store import store_for


def customers_of_keys(session: Session, keys: Collection[str]) -> dict[str, str]:
    """key → customer id, for those of ``keys`` assigned to a customer now."""
    if not keys:
        return {}
    now = datetime.now(UTC)
    owners: dict[str, str] = {}
    for key, history in store_for(session).plans.key_history(session, list(keys)).items():
        row = assignment_at(history, now)
        if row is not None and row.customer_id is not None:
            owners[key] = row.customer_id
    return owners
