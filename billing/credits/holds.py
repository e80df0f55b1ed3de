"""What the owner's authorization holds take from its credit (CONTRACT "Authorizations and
holds (v3)"): the one place the credits read holds. Holds are being built in
``billing.budgets``; until they land there are none, and this answers 0."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.credits.rows import Owner


def held_for_owner(session: Session, owner: Owner, now: datetime) -> int:
    """The owner's holds at ``now`` in picodollars (its customer's, or its key's): 0 until
    holds land (wire them here)."""
    return 0
