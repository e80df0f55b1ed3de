"""What the owner's authorization holds take from its credit (CONTRACT "Authorizations and
holds (v3)", "Prepaid credits (v3)"): the one place the credits read holds."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from billing.budgets.repository import repository as budgets_repository
from billing.budgets.spent import unstepped_estimates
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


def unstepped_by_owner(
    session: Session, owners: Collection[Owner], now: datetime
) -> dict[Owner, int]:
    """What each of ``owners``' calls stored but not yet read by a reconciliation step will be
    charged (picodollars; an owner without such calls: absent): estimated as the budgets
    estimate them (``billing.budgets.spent``: the ``stream.started`` input and the largest
    generated count at the model's price, charged under the key's plan, the call's owner its
    key's customer at its start, else its key), so that an open call is pending from the ingest
    that stored it (CONTRACT "Authorizations and holds (v3)": no wait for a reconcile pass). A
    call a live hold of the owners stands for is left out: the hold counts it
    (``held_by_owner``). A customer's calls have no customer on their row yet: every call not
    stepped is read (few rows, ``ix_calls_unstepped``)."""
    keys = {o.api_key_id for o in owners if o.customer_id is None and o.api_key_id is not None}
    customers = {o.customer_id for o in owners if o.customer_id is not None}
    repo = budgets_repository(session)
    calls = repo.unstepped_calls(session, keys, bool(customers))
    if not calls:
        return {}
    holds = repo.live_holds(session, now, keys, customers, False)
    standing = {hold.request_id for hold in holds if hold.call == "unstepped"}
    wanted = set(owners)
    pending: dict[Owner, int] = {}
    for call, customer, estimate in unstepped_estimates(session, calls, standing):
        owner = Owner.of(customer, call.api_key_id)
        if owner in wanted:
            pending[owner] = pending.get(owner, 0) + estimate["charge"]
    return pending
