"""Prepaid credits: customers as a resource, grants and their voids, balances, and what the
authorization check reads (CONTRACT "Prepaid credits (v3)"). Draws and expiries are booked
by ``billing.credits.draws``; every figure here is a sum of booked credit entries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from billing.credits.draws import active, book_expiries, draw_order, ended
from billing.credits.holds import held_by_owner
from billing.credits.repository import repository
from billing.credits.rows import GRANT, VOID, GrantView, Movement, Owner
from billing.credits.schemas import CustomerIn, GrantIn, to_pusd
from billing.errors import FieldError, GrantConflict, NotFound, ValidationFailed
from billing.money import pusd_to_decimal, pusd_to_str
from billing.paging import cut_page
from billing.plans.rating import assignment_at
from billing.plans.repository import repository as plans_repository
from billing.plans.service import decode_id_cursor, encode_id_cursor
from billing.storage.models import CreditGrant, Customer
from billing.timefmt import rfc3339

# --- customers -----------------------------------------------------------------------------------


def customer_json(
    session: Session,
    customer_id: str,
    row: Customer | None,
    now: datetime,
    balance_json: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The API form of a customer: its settings (the defaults without a row) and balance
    (``balance_json`` when the caller read it already, ``list_customers``)."""
    return {
        "customer_id": customer_id,
        "name": row.name if row else None,
        "credit_required": bool(row.credit_required) if row else False,
        "low_balance_usd": pusd_to_str(row.low_balance_pusd) if row else None,
        "balance": (
            balance(session, Owner(customer_id, None), now)
            if balance_json is None
            else balance_json
        ),
    }


def put_customer(
    session: Session, customer_id: str, body: CustomerIn, now: datetime
) -> tuple[dict[str, Any], bool]:
    """Create or update the customer's settings; ``(customer, created)``. The caller commits."""
    repo = repository(session)
    row = repo.customer(session, customer_id)
    created = row is None
    if row is None:
        row = Customer(customer_id=customer_id, created_at=now)
    row.name = body.name
    row.credit_required = body.credit_required
    row.low_balance_pusd = None if body.low_balance_usd is None else to_pusd(body.low_balance_usd)
    row.updated_at = now
    repo.save_customer(session, row)
    return customer_json(session, customer_id, row, now), created


def get_customer(session: Session, customer_id: str, now: datetime) -> dict[str, Any]:
    """The customer; ``NotFound`` (404) for one never put nor named by a key or a grant."""
    repo = repository(session)
    if not repo.customer_known(session, customer_id):
        raise NotFound(f"no customer {customer_id!r}: put it, or assign it to a key")
    return customer_json(session, customer_id, repo.customer(session, customer_id), now)


def decode_customer_cursor(text: str) -> str:
    """The customer a page cursor names; ``ValueError`` in words otherwise."""
    return decode_id_cursor("c", text)


def customer_page(session: Session, after: str | None, limit: int) -> tuple[list[str], str | None]:
    """A page of customer ids as ``list_customers`` pages them (a record, a key or a grant
    names each), and the next page's cursor (None: the last); no balance is computed."""
    ids, last = cut_page(repository(session).customer_page(session, after, limit + 1), limit)
    return ids, None if last is None else encode_id_cursor("c", last)


def list_customers(
    session: Session, after: str | None, limit: int, now: datetime
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of customers by ``customer_id`` and the next page's cursor (None: the last): the
    page's balances read together, a few statements whatever its size (``_figures_of``)."""
    ids, cursor = customer_page(session, after, limit)
    rows = repository(session).customers(session, ids)
    owners = [Owner(c, None) for c in ids]
    figured = _figures_of(session, owners, now)
    return [
        customer_json(session, c, rows.get(c), now, _balance_json(o, *figured[o], now))
        for c, o in zip(ids, owners, strict=True)
    ], cursor


def credit_required(session: Session, customer_id: str) -> bool:
    """Whether the customer must hold credit to be admitted (for the authorization check)."""
    return repository(session).credit_required(session, customer_id)


# --- grants --------------------------------------------------------------------------------------


def _grant_body(grant: CreditGrant) -> tuple[Any, ...]:
    return (
        grant.customer_id,
        grant.api_key_id,
        grant.amount_pusd,
        grant.effective_at,
        grant.expires_at,
        grant.priority,
        grant.kind,
        grant.note,
    )


def _invalid(path: str, message: str) -> ValidationFailed:
    return ValidationFailed([FieldError(None, path, message)])


def post_grant(session: Session, body: GrantIn, now: datetime) -> tuple[dict[str, Any], bool]:
    """Store a grant and book its ``grant`` entry; ``(grant, created)``. The same body again is
    a no-op (``created`` False); another body under the same ``grant_id`` raises
    ``GrantConflict`` (409); an unknown customer, a key that has a customer, or an
    ``expires_at`` not after ``effective_at`` raise ``ValidationFailed`` (422). The caller
    commits."""
    repo = repository(session)
    effective_at = body.effective_at or now
    grant = CreditGrant(
        grant_id=body.grant_id,
        customer_id=body.customer_id,
        api_key_id=body.api_key_id,
        amount_pusd=to_pusd(body.amount_usd),
        effective_at=effective_at,
        expires_at=body.expires_at,
        priority=body.priority,
        kind=body.kind,
        note=body.note,
        created_at=now,
    )
    stored = repo.grant(session, body.grant_id)
    if stored is not None:
        return _repeated(session, body, grant, stored, now), False
    if body.expires_at is not None and body.expires_at <= effective_at:
        raise _invalid("body.expires_at", "must be after effective_at (default: now)")
    if body.customer_id is not None and not repo.customer_known(session, body.customer_id):
        raise _invalid(
            "body.customer_id",
            f"no customer {body.customer_id!r}: put it to /v1/customers or assign it to a key "
            "first",
        )
    if body.api_key_id is not None:
        owner = _key_customer(session, body.api_key_id, now)
        if owner is not None:
            raise _invalid(
                "body.api_key_id",
                f"the key is assigned to customer {owner!r}, whose grants its calls draw: "
                "grant the credit to the customer",
            )
    booked = Movement(
        GRANT, now, Owner(grant.customer_id, grant.api_key_id), grant.grant_id,
        grant.amount_pusd, dedupe_key=f"{GRANT}:{grant.grant_id}",
    )  # fmt: skip
    if not repo.add_grant(session, grant, booked):  # posted meanwhile by another request
        stored = repo.grant(session, body.grant_id)
        assert stored is not None
        return _repeated(session, body, grant, stored, now), False
    return grant_json(session, grant.grant_id, now), True


def _repeated(
    session: Session, body: GrantIn, grant: CreditGrant, stored: CreditGrant, now: datetime
) -> dict[str, Any]:
    """The stored grant when ``grant`` (as posted) is the same; else ``GrantConflict`` (409).
    A repeat that leaves ``effective_at`` out means the instant it was stored at."""
    skip = 3 if body.effective_at is None else -1
    mine, theirs = _grant_body(grant), _grant_body(stored)
    if any(a != b for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if i != skip):
        raise GrantConflict(
            f"a different grant {body.grant_id!r} exists; a grant never changes: post a new "
            "grant_id (or void this one)"
        )
    return grant_json(session, stored.grant_id, now)


def void_grant(session: Session, grant_id: str, now: datetime) -> dict[str, Any]:
    """End what is left of a grant now (a ``void`` entry, once); 404 for an unknown grant. A
    grant expired or voided before is answered as it is."""
    repo = repository(session)
    grant = repo.grant(session, grant_id)
    if grant is None:
        raise NotFound(f"no grant {grant_id!r}")
    book_expiries(session, now)
    view = _view(session, grant, lock=True)
    if not view.voided and (view.expires_at is None or now < view.expires_at):
        move = Movement(VOID, now, view.owner, grant_id, view.remaining_pusd,
                        dedupe_key=f"{VOID}:{grant_id}")  # fmt: skip
        if repo.add_once(session, move) and active(view, now):
            ended(session, view.owner, view.remaining_pusd, now)
    return grant_json(session, grant_id, now)


def _grant_view_json(grant: GrantView, now: datetime) -> dict[str, Any]:
    return {
        "grant_id": grant.grant_id,
        "customer_id": grant.owner.customer_id,
        "api_key_id": grant.owner.api_key_id,
        "kind": grant.kind,
        "amount_usd": pusd_to_str(grant.amount_pusd),
        "remaining_usd": pusd_to_str(_left(grant, now)),
        "effective_at": rfc3339(grant.effective_at),
        "expires_at": rfc3339(grant.expires_at) if grant.expires_at else None,
        "priority": grant.priority,
        "note": grant.note,
        "state": _state(grant, now),
    }


def _state(grant: GrantView, now: datetime) -> str:
    if grant.voided:
        return "voided"
    if grant.expires_at is not None and now >= grant.expires_at:
        return "expired"
    return "active" if grant.effective_at <= now else "scheduled"


def _left(grant: GrantView, now: datetime) -> int:
    """What the balance counts of ``grant`` at ``now``: nothing of an expired or voided one
    (its expiry may not be booked yet: a read books nothing)."""
    return grant.remaining_pusd if _state(grant, now) in ("active", "scheduled") else 0


def _view(session: Session, grant: CreditGrant, lock: bool = False) -> GrantView:
    owner = Owner(grant.customer_id, grant.api_key_id)
    (view,) = [
        g
        for g in repository(session).grants(session, [owner], lock)
        if g.grant_id == grant.grant_id
    ]
    return view


def grant_json(session: Session, grant_id: str, now: datetime) -> dict[str, Any]:
    """The API form of a grant, with its remainder and state at ``now``."""
    repo = repository(session)
    grant = repo.grant(session, grant_id)
    if grant is None:
        raise NotFound(f"no grant {grant_id!r}")
    view = _view(session, grant)
    return _grant_view_json(view, now)


# --- balances ------------------------------------------------------------------------------------


def _figures(
    session: Session, owner: Owner, now: datetime
) -> tuple[list[GrantView], dict[str, int]]:
    # One statement: holds, open calls, remainders and overdraft read in one snapshot.
    read = repository(session).balance_figures(session, owner, now)
    grants = sorted(read.grants, key=draw_order)
    balance_pusd = sum(_left(g, now) for g in grants if active(g, now))
    figures = {
        "balance": balance_pusd,
        "held": read.held,
        "pending": read.pending,
        "available": balance_pusd - read.held - read.pending,
        "overdraft": read.overdraft,
    }
    return grants, figures


def _figures_of(
    session: Session, owners: Sequence[Owner], now: datetime
) -> dict[Owner, tuple[list[GrantView], dict[str, int]]]:
    """Each of ``owners``' grants (in draw order) and figures, read for all of them at once:
    one statement each for the holds, the open calls, the grants (and their voids) and the
    overdrafts."""
    if not owners:
        return {}
    repo = repository(session)
    # Holds and open calls first, the remainders after: a step that settles and draws a call
    # in between (PostgreSQL reads each statement's latest commit) then counts it twice for
    # this one read, pending and drawn, never not at all.
    held = held_by_owner(session, owners, now)
    pending = repo.pending_by_owner(session, owners)
    grants: dict[Owner, list[GrantView]] = {owner: [] for owner in owners}
    for grant in repo.grants(session, owners):
        mine = grants.get(Owner.of(grant.owner.customer_id, grant.owner.api_key_id))
        if mine is not None:
            mine.append(grant)
    overdrafts = repo.overdrafts(session, owners)
    figured = {}
    for owner in owners:
        mine = sorted(grants[owner], key=draw_order)
        balance_pusd = sum(_left(g, now) for g in mine if active(g, now))
        held_pusd, pending_pusd = held.get(owner, 0), pending.get(owner, 0)
        figured[owner] = (
            mine,
            {
                "balance": balance_pusd,
                "held": held_pusd,
                "pending": pending_pusd,
                "available": balance_pusd - held_pusd - pending_pusd,
                "overdraft": overdrafts.get(owner, 0),
            },
        )
    return figured


def _key_customer(session: Session, api_key_id: str, now: datetime) -> str | None:
    """The customer of the key's assignment in force at ``now``, if any."""
    history = plans_repository(session).key_history(session, [api_key_id])
    assigned = assignment_at(history.get(api_key_id, []), now)
    return assigned.customer_id if assigned is not None else None


def credit_owner(session: Session, owner: Owner, now: datetime) -> Owner:
    """Whose credit a key's calls draw now: its customer's when it has one, else its own."""
    if owner.api_key_id is not None and owner.customer_id is None:
        return Owner.of(_key_customer(session, owner.api_key_id, now), owner.api_key_id)
    return owner


def balance(session: Session, owner: Owner, now: datetime) -> dict[str, Any]:
    """``GET /v1/credits/balance``: the owner's balance (the remainders of its active grants),
    holds, pending charges of open calls, what is available, its overdraft and its grants. A
    key with a customer answers its customer's (``customer_id`` says so)."""
    owner = credit_owner(session, owner, now)
    return _balance_json(owner, *_figures(session, owner, now), now)


def _balance_json(
    owner: Owner, grants: list[GrantView], figures: dict[str, int], now: datetime
) -> dict[str, Any]:
    return {
        "customer_id": owner.customer_id,
        "api_key_id": owner.api_key_id,
        **{f"{name}_usd": pusd_to_str(value) for name, value in figures.items()},
        "grants": [_grant_view_json(g, now) for g in grants],
        "as_of": rfc3339(now),
    }


def credit_gate(
    session: Session,
    api_key_id: str,
    customer_id: str | None,
    hold_pusd: int,
    now: datetime,
    required: bool | None = None,
) -> bool:
    """Whether a hold of ``hold_pusd`` may be taken for a call of ``api_key_id`` (its customer
    ``customer_id``): always, unless the owner is a ``credit_required`` customer whose available
    credit is below it. The owner's authorizations are decided one after another
    (``lock_owner``); the grants are read without their row locks, so a step drawing them does
    not hold the authorization up. ``required``: ``customer_id``'s ``credit_required`` when the
    caller read it already (the authorization's spend check), else read here."""
    owner = credit_owner(session, Owner.of(customer_id, api_key_id), now)
    if owner.customer_id is None:
        return True
    if required is None or owner.customer_id != customer_id:
        required = credit_required(session, owner.customer_id)
    if not required:
        return True
    repository(session).lock_owner(session, owner)
    return _figures(session, owner, now)[1]["available"] >= hold_pusd


def available_for_owner(
    session: Session, customer_id: str | None, api_key_id: str | None, now: datetime
) -> Decimal:
    """The owner's available credit in USD (balance − held − pending): for the authorization
    check of a ``credit_required`` customer (a key with a customer: its customer's)."""
    owner = credit_owner(session, Owner.of(customer_id, api_key_id), now)
    return pusd_to_decimal(_figures(session, owner, now)[1]["available"])


def entries_json(session: Session, owner: Owner, limit: int, now: datetime) -> list[dict[str, Any]]:
    """The owner's latest credit entries, newest first (the console, ``billing credits list``);
    a key with a customer lists its customer's, as :func:`balance` answers its customer's."""
    owner = credit_owner(session, owner, now)
    return [
        {
            "entry_id": row.entry_id,
            "kind": row.kind,
            "booked_at": rfc3339(row.booked_at),
            "grant_id": row.grant_id,
            "amount_usd": pusd_to_str(row.amount_pusd),
            "request_id": row.request_id,
            "ledger_seq": row.ledger_seq,
        }
        for row in repository(session).owner_entries(session, owner, limit)
    ]
