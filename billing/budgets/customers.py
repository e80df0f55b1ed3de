"""Which customer a key belongs to, for budgets over a customer: the one place that says so.

A key's customer is its assignment in force now (``key_assignments``, CONTRACT "Keys,
customers and plans (v2)"): a customer budget counts the keys assigned to it now, with all of
their spend in the period (a key moved to another customer mid-period takes its spend with it).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from billing.storage.models import KeyAssignment
from billing.storage.store import store_for


def _in_force(history: list[KeyAssignment], now: datetime) -> KeyAssignment | None:
    """The assignment in force at ``now`` of one key's ``history`` (oldest first)."""
    found = None
    for row in history:
        if row.effective_from > now:
            break
        found = row
    return found


def customers_of_keys(session: Session, keys: Collection[str]) -> dict[str, str]:
    """key → customer id, for those of ``keys`` assigned to a customer now."""
    if not keys:
        return {}
    now = datetime.now(UTC)
    owners: dict[str, str] = {}
    for key, history in store_for(session).plans.key_history(session, list(keys)).items():
        row = _in_force(history, now)
        if row is not None and row.customer_id is not None:
            owners[key] = row.customer_id
    return owners


def keys_of_customer(session: Session, customer_id: str) -> list[str]:
    """The keys assigned to ``customer_id`` now, by ``api_key_id``."""
    keys = store_for(session).plans.keys_ever_of_customer(session, customer_id)
    owners = customers_of_keys(session, keys)
    return [key for key in keys if owners.get(key) == customer_id]
