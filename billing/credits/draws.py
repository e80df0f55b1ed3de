"""Draws: what each settled charge takes from its owner's grants, booked as credit entries in
the reconciliation step that booked the charge (CONTRACT "Prepaid credits (v3)").

A call's ledger entries are charged to an owner: the entry's customer, else its key (a key
with a customer draws its customer's grants). The owner's charge of a call is the sum of the
charges (``charge_pusd``: the cost where no plan applies) of the call's entries booked since
it first drew. The first entries of a call draw that much; a later entry that changes it (a
late event, a re-rating, a correction) **redraws**: a ``reversal`` of everything the call drew
of each grant and of its overdraft, then a new draw of the new total. A draw takes the active
grants (effective at the booking time, not expired, not voided, something left) in order of
``priority``, earliest ``expires_at`` (none last), oldest ``effective_at``, then ``grant_id``;
what no grant covers is an ``overdraft``. An amount a reversal gives back to a grant that has
expired or was voided since is booked at once as its ``expiry`` / ``void`` again.

Expiries: the remainder of a grant at its ``expires_at`` is booked as an ``expiry`` at
``expires_at``, once (its ``dedupe_key``), by the first step, pass, void or credits export at or
after that instant (``book_expiries``). No draw is booked at or after a grant's expiry (and an
amount given back to it later ends again at once), so the remainder is final by then: whoever
books it books the same amount. A grant is booked (its ``grant`` entry) when it is posted,
whatever its ``effective_at``: a closed period never gains an entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from billing.credits import alerts
from billing.credits.holds import held_by_owner, held_for_owner
from billing.credits.repository import repository
from billing.credits.rows import DRAW, EXPIRY, OVERDRAFT, REVERSAL, VOID, GrantView, Movement, Owner


class ChargedEntry(Protocol):
    """What a draw reads of a new ledger entry (``billing.reconcile.entries.Entry``,
    ``billing.credits.rows.ChargedRow``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def api_key_id(self) -> str | None: ...
    @property
    def customer_id(self) -> str | None: ...
    @property
    def charge_pusd(self) -> int | None: ...


def draw_order(grant: GrantView) -> tuple[int, int, datetime, datetime, str]:
    """The order grants are drawn in: priority, earliest expiry (none last), oldest effective."""
    expires = grant.expires_at or grant.effective_at
    return (grant.priority, grant.expires_at is None, expires, grant.effective_at, grant.grant_id)


def active(grant: GrantView, now: datetime) -> bool:
    """Whether ``grant`` may be drawn at ``now``."""
    return (
        not grant.voided
        and grant.effective_at <= now
        and (grant.expires_at is None or now < grant.expires_at)
    )


def book_expiries(session: Session, now: datetime) -> int:
    """Book the expiry of every grant expired by ``now`` whose expiry is not booked yet: what
    is left of it (locked first: a step drawing it finishes before), booked at its
    ``expires_at`` (or at its own booking, for a grant posted after it expired); how many."""
    repo = repository(session)
    booked = 0
    for grant in repo.due_expiries(session, now):
        assert grant.expires_at is not None
        owner = Owner(grant.customer_id, grant.api_key_id)
        (view,) = (
            g for g in repo.grants(session, [owner], lock=True) if g.grant_id == grant.grant_id
        )
        move = Movement(
            EXPIRY,
            max(grant.expires_at, grant.created_at),
            owner,
            grant.grant_id,
            view.remaining_pusd,
            dedupe_key=f"{EXPIRY}:{grant.grant_id}",
        )
        if repo.add_once(session, move):
            booked += 1
            ended(session, owner, view.remaining_pusd, now)
    return booked


def ended(session: Session, owner: Owner, amount_pusd: int, now: datetime) -> None:
    """The alerts of the owner's balance having lost ``amount_pusd`` (an expiry, a void)."""
    if amount_pusd > 0:
        current = [g for g in repository(session).grants(session, [owner]) if active(g, now)]
        left = sum(g.remaining_pusd for g in current) - _others(session, owner, now)
        alerts.crossings(session, owner, left + amount_pusd, left, now)


def _others(session: Session, owner: Owner, now: datetime) -> int:
    """What the owner's available credit lacks besides its balance: holds and open calls."""
    return held_for_owner(session, owner, now) + repository(session).pending(session, owner)


def after_step(
    session: Session,
    entries: Sequence[ChargedEntry],
    now: datetime,
    settled_in_sql: Sequence[str] = (),
) -> None:
    """Book the draws of the ledger entries a reconciliation step booked (in its transaction):
    ``entries``, the rule's, and those of the calls its fast path settled (``settled_in_sql``,
    read back for the keys that hold grants: the fast path settles no call of a customer). A
    handful of statements a step, whatever its size; nothing at all (one probe) while no grant
    exists."""
    repo = repository(session)
    if not repo.any_grants(session):
        return
    book_expiries(session, now)
    charged: dict[tuple[str, Owner], list[int]] = {}
    every: list[ChargedEntry] = [*repo.charged_by_key_grants(session, settled_in_sql), *entries]
    for entry in every:
        if entry.api_key_id is None and entry.customer_id is None:
            continue
        owner = Owner.of(entry.customer_id, entry.api_key_id)
        total = charged.setdefault((entry.request_id, owner), [0, entry.seq])
        total[0] += entry.charge_pusd or 0
        total[1] = max(total[1], entry.seq)
    holders = repo.owners_with_grants(session, sorted({o for _, o in charged}, key=Owner.sort_key))
    work = {key: value for key, value in charged.items() if key[1] in holders}
    if not work:
        return
    # A call the fast path settled was settled for the first time: it drew nothing before.
    first = set(settled_in_sql)
    drawn = repo.drawn(session, sorted({rid for rid, _ in work if rid not in first}))
    grants = repo.grants(session, sorted(holders, key=Owner.sort_key), lock=True)
    remaining = {g.grant_id: g.remaining_pusd for g in grants}
    by_owner: dict[Owner, list[GrantView]] = {}
    for grant in grants:
        by_owner.setdefault(grant.owner, []).append(grant)
    moves: list[Movement] = []
    for (rid, owner), (delta, seq) in sorted(
        work.items(), key=lambda i: (i[0][0], i[0][1].sort_key())
    ):
        if not delta:
            continue
        before = drawn.get((rid, owner), {})
        owned = by_owner.get(owner, [])
        booking = _Booking(rid, seq, owner, now, remaining)
        if any(before.values()):
            booking.reverse(before, {g.grant_id: g for g in owned})
        booking.draw(sum(before.values()) + delta, owned)
        moves.extend(booking.moves)
    repo.add(session, moves)
    # Alerts reach only the owners with a webhook budget: the others' crossings store nothing,
    # so only those owners' holds and open calls are read (once for all of them).
    watched = sorted({o for _, o in work} & alerts.watched(session), key=Owner.sort_key)
    if not watched:
        return
    held = held_by_owner(session, watched, now)
    pending = repo.pending_by_owner(session, watched)
    for owner in watched:
        owned = [g for g in by_owner.get(owner, []) if active(g, now)]
        was = sum(g.remaining_pusd for g in owned)
        left = sum(remaining[g.grant_id] for g in owned)
        # Holds and open calls are the same before and after the draws.
        others = held.get(owner, 0) + pending.get(owner, 0)
        alerts.crossings(session, owner, was - others, left - others, now)


def credits_exist(session: Session) -> bool:
    """Whether any grant exists (one probe): else a pass has no credit work."""
    return repository(session).any_grants(session)


def on_pass(session: Session, now: datetime) -> None:
    """A reconciliation pass's credit work (once a pass, in its own transaction, when
    ``credits_exist``): the expiries due and the ``credits.expiring`` alerts."""
    book_expiries(session, now)
    alerts.expiring(session, now)


class _Booking:
    """The entries of one call's draw for one owner, keeping ``remaining`` up to date."""

    def __init__(
        self, rid: str, seq: int, owner: Owner, now: datetime, remaining: dict[str, int]
    ) -> None:
        self.rid, self.seq, self.owner, self.now = rid, seq, owner, now
        self.remaining = remaining
        self.moves: list[Movement] = []

    def _book(self, kind: str, grant_id: str | None, amount: int) -> None:
        self.moves.append(
            Movement(kind, self.now, self.owner, grant_id, amount, self.rid, self.seq)
        )

    def reverse(self, before: dict[str | None, int], grants: dict[str, GrantView]) -> None:
        """Take back what the call drew of each grant and its overdraft."""
        for grant_id in sorted(before, key=lambda g: g or ""):
            amount = before[grant_id]
            if not amount:
                continue
            self._book(REVERSAL, grant_id, -amount)
            if grant_id is None:
                continue
            grant = grants.get(grant_id)
            if grant is not None and not active(grant, self.now):
                # Given back to a grant that no longer counts: it ends again at once.
                self._book(VOID if grant.voided else EXPIRY, grant_id, amount)
            else:
                self.remaining[grant_id] += amount

    def draw(self, amount: int, grants: Iterable[GrantView]) -> None:
        """Draw ``amount`` from the active grants in order; the rest is an overdraft."""
        if amount <= 0:
            return
        for grant in sorted(grants, key=draw_order):
            left = self.remaining.get(grant.grant_id, 0)
            if amount <= 0 or left <= 0 or not active(grant, self.now):
                continue
            take = min(left, amount)
            self._book(DRAW, grant.grant_id, take)
            self.remaining[grant.grant_id] = left - take
            amount -= take
        if amount > 0:
            self._book(OVERDRAFT, None, amount)
