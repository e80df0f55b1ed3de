"""Which customer a key belongs to, for budgets over a customer: the one place that says so.

TODO(#24, at merge): #24 adds the key → customer assignment table (and ``calls.customer_id`` /
``ledger_entries.customer_id``). Wire these two functions to it; nothing else in
``billing.budgets`` reads customers. Until then no key has a customer: a customer budget is
stored and answered (at 0 spent), and sums no key.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.orm import Session


def customers_of_keys(session: Session, keys: Collection[str]) -> dict[str, str]:
    """key → customer id, for those of ``keys`` assigned to a customer (none in this branch)."""
    return {}


def keys_of_customer(session: Session, customer_id: str) -> list[str]:
    """The keys assigned to ``customer_id`` (none in this branch)."""
    return []
