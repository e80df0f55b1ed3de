"""What the owner's authorization holds take from its credit (CONTRACT "Authorizations and
holds (v3)", "Prepaid credits (v3)"): the one place the credits read holds."""

from __future__ import annotations

from collections.abc import Collection
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
    return held_by_owner(session, [owner], now).get(owner, 0)


def held_by_owner(session: Session, owners: Collection[Owner], now: datetime) -> dict[Owner, int]:
    """``held_for_owner`` of each of ``owners`` (one read; an owner without holds: absent). A
    customer's holds are those naming it; a key's (a key without a customer), those of the
    key."""
    keys = {o.api_key_id for o in owners if o.customer_id is None and o.api_key_id is not None}
    customers = {o.customer_id for o in owners if o.customer_id is not None}
    holds = budgets_repository(session).live_holds(session, now, keys, customers, False)
    held: dict[Owner, int] = {}
    for hold in holds:
        amount = hold.hold_pusd if hold.call in (None, "unstepped") else hold.beyond_call("charge")
        for owner, mine in (
            (Owner(hold.customer_id, None), hold.customer_id in customers),
            (Owner(None, hold.api_key_id), hold.api_key_id in keys),
        ):
            if mine:
                held[owner] = held.get(owner, 0) + amount
    return held
