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

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.credits import alerts
from billing.credits.holds import held_by_owner, held_for_owner
from billing.credits.repository import repository
from billing.credits.rows import (
    DRAW,
    EXPIRY,
    OVERDRAFT,
    REVERSAL,
    VOID,
    CommonDraws,
    Drawn,
    EntryRow,
    GrantView,
    Movement,
    Owner,
)
from billing.reconcile.rows import CommonCharge


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
        owner = grant.owner
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
    call_numbers: Mapping[str, int],
    now: datetime,
    settled_in_sql: Sequence[CommonCharge] = (),
) -> None:
    """Book the draws of the ledger entries a reconciliation step booked (in its transaction):
    ``entries``, the rule's (``call_numbers``: each of their calls' ``calls.call_no``, which
    their credit entries carry), and those of the calls its fast path settled
    (``settled_in_sql``: each one settlement entry, seq 1, charging its key its cost; the fast
    path settles no call of a customer), taken as the fast path gave them, not read back. A
    handful of statements a step, whatever its size; nothing at all (one probe) while no grant
    exists. Raises ``KeyError`` for an entry of a call not in ``call_numbers``."""
    repo = repository(session)
    if not repo.any_grants(session):
        return
    book_expiries(session, now)
    owners: dict[tuple[str | None, str | None], Owner] = {}
    for entry in entries:
        if entry.api_key_id is not None or entry.customer_id is not None:
            pair = (entry.customer_id, entry.api_key_id)
            if pair not in owners:
                owners[pair] = Owner.of(*pair)
    fast_keys = {key for _, key, _, _ in settled_in_sql}
    candidates = {*owners.values(), *(Owner(None, key) for key in fast_keys)}
    holders = repo.owners_with_grants(session, sorted(candidates, key=Owner.sort_key))
    if not holders:
        return
    # The fast path's calls of keys with grants, by call (a call settled there was settled for
    # the first time: it drew nothing before).
    drawing = {owner.api_key_id for owner in holders if owner.customer_id is None} & fast_keys
    fast = sorted(
        (c for c in settled_in_sql if c[1] in drawing)
        if len(drawing) < len(fast_keys)
        else settled_in_sql,
        key=_REQUEST_ID,
    )
    # The rule's: (call, owner's sort key) → [the owner's charge of the call's new entries, the
    # last entry's seq, the owner, the call's number].
    work: dict[tuple[str, str, str], list[Any]] = {}
    for entry in entries:
        charged = owners.get((entry.customer_id, entry.api_key_id))
        if charged is None or charged not in holders:
            continue
        place = (entry.request_id, *charged.sort_key())
        total = work.get(place)
        if total is None:
            total = work[place] = [0, entry.seq, charged, call_numbers[entry.request_id]]
        total[0] += entry.charge_pusd or 0
        total[1] = max(total[1], entry.seq)
    if not work and not fast:
        return
    drawn = repo.drawn(session, sorted({rid for rid, _, _ in work}))
    holding = sorted(holders, key=Owner.sort_key)
    at = repo.entry_time(now)
    if repo.draws_before_lock:
        # Steps run at once (PostgreSQL) draw the same grants: each holds their row locks from
        # its locked read to its commit, so whatever it does in between, the other waits for.
        # The rows are planned from the grants as they are and inserted (in a savepoint) before
        # the lock; then, locked, they are kept when the grants as locked give the same rows
        # (the usual case: the same grants, each with enough left for what the step takes of
        # it), else rolled back and planned again from the locked grants: the booked rows are
        # always those of the grants as locked, as without this.
        seen = repo.grants(session, holding)
        plan = _plan(work, fast, drawn, seen, now, at)
        savepoint = session.begin_nested()
        repo.insert_draws(session, plan.rows, plan.draws)
        grants = repo.grants(session, holding, lock=True)
        if grants == seen:
            savepoint.commit()
        elif plan.holds_for(grants):
            savepoint.commit()
            plan = plan.rebased(grants)
        else:
            locked = _plan(work, fast, drawn, grants, now, at)
            if locked.same_rows(plan):
                savepoint.commit()
            else:
                savepoint.rollback()
                repo.insert_draws(session, locked.rows, locked.draws)
            plan = locked
    else:
        grants = repo.grants(session, holding, lock=True)
        plan = _plan(work, fast, drawn, grants, now, at)
        repo.insert_draws(session, plan.rows, plan.draws)
    remaining, by_owner = plan.remaining, plan.by_owner
    # A grant's remainder moved as its entries did (``remaining`` followed each of them); an
    # owner's overdraft by its entries of no grant (never a common draw).
    overdrafts: dict[Owner, int] = {}
    for row in plan.rows:
        if row[4] is None:
            owner = Owner(row[2], row[3])
            overdrafts[owner] = overdrafts.get(owner, 0) + row[5]
    before_step = {g.grant_id: g.remaining_pusd for g in grants}
    changed = {g: left - before_step[g] for g, left in remaining.items()}
    repo.add_to_sums(session, changed, overdrafts)
    # Alerts reach only the owners with a webhook budget: the others' crossings store nothing,
    # so only those owners' holds and open calls are read (once for all of them).
    mine = {owner for _, _, owner, _ in work.values()} | {Owner(None, key) for key in drawing}
    watched = sorted(mine & alerts.watched(session), key=Owner.sort_key)
    if not watched:
        return
    held = held_by_owner(session, watched, now)
    pending = repo.pending_by_owner(session, watched)
    for owner in watched:
        current = [g for g in by_owner.get(owner, []) if active(g, now)]
        was = sum(g.remaining_pusd for g in current)
        left = sum(remaining[g.grant_id] for g in current)
        # Holds and open calls are the same before and after the draws.
        others = held.get(owner, 0) + pending.get(owner, 0)
        alerts.crossings(session, owner, was - others, left - others, now)


_REQUEST_ID = itemgetter(0)


class _Plan:
    """A step's draws planned from the owners' grants (``_plan``): the entry rows of the rule's
    calls and of the fast path's calls that are not common draws, in the order they are drawn;
    the common draws (``CommonDraws``: each of the other fast path's calls drawn whole from its
    key's first grant in order), each grant's remainder after them all, the grants by owner, and
    whether every row is a common draw (one grant covering a first draw; no reversal,
    overdraft or split)."""

    __slots__ = ("by_owner", "common", "draws", "remaining", "rows")

    def __init__(
        self,
        rows: list[EntryRow],
        draws: CommonDraws,
        remaining: dict[str, int],
        by_owner: dict[Owner, list[GrantView]],
        common: bool,
    ) -> None:
        self.rows = rows
        self.draws = draws
        self.remaining = remaining
        self.by_owner = by_owner
        self.common = common

    def same_rows(self, other: _Plan) -> bool:
        """Whether both plans book the same rows (from the same calls)."""
        return self.rows == other.rows and self.draws.grants == other.draws.grants

    def holds_for(self, grants: Sequence[GrantView]) -> bool:
        """Whether planning from ``grants`` (the same owners' grants, read again) gives the
        same rows, without planning again: when every row is a common draw, the grants are the
        same but for their remainders, and each still has what the step takes of it (then
        each call's first grant in order covers it again, in the same order)."""
        if not self.common:
            return False
        before = {g.grant_id: g for owned in self.by_owner.values() for g in owned}
        if len(before) != len(grants):
            return False
        for grant in grants:
            was = before.get(grant.grant_id)
            if was is None or was._replace(remaining_pusd=grant.remaining_pusd) != grant:
                return False
            if grant.remaining_pusd < was.remaining_pusd - self.remaining[grant.grant_id]:
                return False
        return True

    def rebased(self, grants: Sequence[GrantView]) -> _Plan:
        """The same rows over ``grants`` (for which ``holds_for``): the remainders after them
        and the grants by owner as read."""
        before = {g.grant_id: g.remaining_pusd for owned in self.by_owner.values() for g in owned}
        remaining: dict[str, int] = {}
        by_owner: dict[Owner, list[GrantView]] = {}
        for grant in grants:
            grant_id = grant.grant_id
            remaining[grant_id] = grant.remaining_pusd - (
                before[grant_id] - self.remaining[grant_id]
            )
            by_owner.setdefault(grant.owner, []).append(grant)
        return _Plan(self.rows, self.draws, remaining, by_owner, self.common)


def _plan(
    work: dict[tuple[str, str, str], list[Any]],
    fast: list[CommonCharge],
    drawn: Drawn,
    grants: Sequence[GrantView],
    now: datetime,
    at: Any,
) -> _Plan:
    """The entries of the step's draws from the owners' ``grants`` as read (``work``: the
    rule's, (call, owner's sort key) → [the owner's charge of the call's new entries, the last
    entry's seq, the owner, the call's number]; ``fast``: the fast path's calls of keys with
    grants, by call; ``drawn``: what the rule's calls drew before); ``at``: the booking time as
    the repository takes it. Thousands of draws a step: no object a draw. The fast path's calls
    of a key whose first grant in order has enough left for all of the step's calls of that key
    (its rule calls too, when each is a first draw) draw each whole from it (as ``_draw`` would,
    in any order): those are ``CommonDraws``, given by key, not row by row; the rows are the
    rest's (the rule's calls of such a key included), in the order they are drawn."""
    remaining = {g.grant_id: g.remaining_pusd for g in grants}
    by_owner: dict[Owner, list[GrantView]] = {}
    for grant in grants:
        by_owner.setdefault(grant.owner, []).append(grant)
    # What each owner's draws take, in order: its active grants (the same all step long).
    drawable = {
        owner: [g for g in sorted(owned, key=draw_order) if active(g, now)]
        for owner, owned in by_owner.items()
    }
    first_grants: dict[str, str] = {}
    count = 0
    if fast:
        # Each key's charges: [their sum, how many] (a charge of 0 draws nothing).
        totals: dict[str, list[int]] = {}
        for _, key, charge, _ in fast:
            if charge > 0:
                summed = totals.get(key)
                if summed is None:
                    totals[key] = [charge, 1]
                else:
                    summed[0] += charge
                    summed[1] += 1
        # What the rule's calls of those keys take, when each is a first draw (else None):
        # their draws come from the same first grant when it has enough left for all.
        ruled: dict[str, int | None] = {}
        for (rid, _, key), (delta, _, owner, _) in work.items():
            if owner.customer_id is None and key in totals:
                before = drawn.get((rid, owner)) if drawn else None
                took = ruled.get(key, 0)
                if took is None or delta < 0 or (before and any(before.values())):
                    ruled[key] = None
                else:
                    ruled[key] = took + delta
        for key, (total, calls) in totals.items():
            order = drawable.get(Owner(None, key))
            took = ruled.get(key, 0)
            if order and took is not None and remaining[order[0].grant_id] >= total + took:
                first_grants[key] = order[0].grant_id
                remaining[order[0].grant_id] -= total
                count += calls
        if len(first_grants) < len(totals):
            # The others' calls are planned one by one, with the rule's.
            work = dict(work)
            for rid, key, charge, call_no in fast:
                if key not in first_grants:
                    work[rid, "", key] = [charge, 1, Owner(None, key), call_no]
    rows: list[EntryRow] = []
    common = True
    for place in sorted(work):
        delta, seq, owner, call_no = work[place]
        if not delta:
            continue
        rid = place[0]
        before = drawn.get((rid, owner)) if drawn else None
        if delta > 0 and not (before and any(before.values())):
            # The common draw: the first grant in order covers it all (``_draw``'s first take).
            order = drawable.get(owner)
            grant_id = order[0].grant_id if order else None
            if grant_id is not None and remaining.get(grant_id, 0) >= delta:
                customer_id, api_key_id = owner
                rows.append(
                    (DRAW, at, customer_id, api_key_id, grant_id, delta, rid, seq, None, call_no)
                )
                remaining[grant_id] -= delta
                continue
        common = False
        like = (DRAW, at, owner.customer_id, owner.api_key_id, None, 0, rid, seq, None, call_no)
        if before and any(before.values()):
            owned = {g.grant_id: g for g in by_owner.get(owner, [])}
            _reverse(rows, like, before, owned, remaining, now)
            delta += sum(before.values())
        if delta > 0:
            _draw(rows, like, delta, drawable.get(owner, ()), remaining)
    return _Plan(rows, CommonDraws(at, fast, first_grants, count), remaining, by_owner, common)


def _reverse(
    rows: list[EntryRow],
    like: EntryRow,
    before: dict[str | None, int],
    grants: dict[str, GrantView],
    remaining: dict[str, int],
    now: datetime,
) -> None:
    """Take back what the call (``like``'s) drew of each grant and its overdraft, keeping
    ``remaining`` up to date."""
    _, at, customer_id, api_key_id, _, _, rid, seq, _, call_no = like
    for grant_id in sorted(before, key=lambda g: g or ""):
        amount = before[grant_id]
        if not amount:
            continue
        rows.append(
            (REVERSAL, at, customer_id, api_key_id, grant_id, -amount, rid, seq, None, call_no)
        )
        if grant_id is None:
            continue
        grant = grants.get(grant_id)
        if grant is not None and not active(grant, now):
            # Given back to a grant that no longer counts: it ends again at once.
            ended = VOID if grant.voided else EXPIRY
            rows.append(
                (ended, at, customer_id, api_key_id, grant_id, amount, rid, seq, None, call_no)
            )
        else:
            remaining[grant_id] += amount


def _draw(
    rows: list[EntryRow],
    like: EntryRow,
    amount: int,
    drawable: Iterable[GrantView],
    remaining: dict[str, int],
) -> None:
    """Draw ``amount`` (> 0) for the call (``like``'s) from the ``drawable`` grants in order
    (active, in ``draw_order``), keeping ``remaining`` up to date; the rest is an overdraft."""
    _, at, customer_id, api_key_id, _, _, rid, seq, _, call_no = like
    for grant in drawable:
        grant_id = grant.grant_id
        left = remaining.get(grant_id, 0)
        if left <= 0:
            continue
        take = left if left < amount else amount
        rows.append((DRAW, at, customer_id, api_key_id, grant_id, take, rid, seq, None, call_no))
        remaining[grant_id] = left - take
        amount -= take
        if amount <= 0:
            return
    rows.append((OVERDRAFT, at, customer_id, api_key_id, None, amount, rid, seq, None, call_no))


def credits_exist(session: Session) -> bool:
    """Whether any grant exists (one probe): else a pass has no credit work."""
    return repository(session).any_grants(session)


def on_pass(session: Session, now: datetime) -> None:
    """A reconciliation pass's credit work (once a pass, in its own transaction, when
    ``credits_exist``): the expiries due and the ``credits.expiring`` alerts."""
    book_expiries(session, now)
    alerts.expiring(session, now)
