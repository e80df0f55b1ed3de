"""What the owner's authorization holds take from its credit (CONTRACT "Authorizations and
holds (v3)", "Prepaid credits (v3)"): the one place the credits read holds."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.budgets.repository import repository as budgets_repository
from billing.credits.rows import Owner


def held_for_owner(session: Session, owner: Owner, now: datetime) -> int:
    """The owner's live holds at ``now`` in picodollars (its customer's, or its key's): those
    whose call has no event yet, or whose call no reconciliation step has read (the hold stands
    for it until then), and, while a call a step has read is open, the part of its hold above
    its figure so far (the call is pending at that figure: together, no less than the hold;
    ``billing.budgets.rows.LiveHold.beyond_call``, in charge, what credit draws)."""
    keys = [owner.api_key_id] if owner.api_key_id is not None else []
    customers = [owner.customer_id] if owner.customer_id is not None else []
    holds = budgets_repository(session).live_holds(session, now, keys, customers, False)
    return sum(
        hold.hold_pusd if hold.call in (None, "unstepped") else hold.beyond_call("charge")
        for hold in holds
    )
