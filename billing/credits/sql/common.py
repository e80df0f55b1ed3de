"""The statements of prepaid credits (``billing.credits.repository``), written with SQLAlchemy
alike for SQLite and PostgreSQL: ``CoreCredits`` serves both, given each database's
``INSERT … ON CONFLICT`` (``SQLITE``, ``POSTGRES``). Grants and customers are small tables read
by owner; credit entries are read by call and by booking time. What is left of a grant
(``credit_grants.remaining_pusd``) and an owner's overdraft (``credit_overdrafts``) are the sums
of their entries, kept by ``add`` / ``add_once`` in the statement's transaction: a balance reads
them, never the draws. ``FOR UPDATE`` (PostgreSQL; SQLite has one writer at a time, and
SQLAlchemy leaves it out there) locks an owner's grants while a step draws them; authorizations
of one owner are decided one at a time under an advisory lock of the owner's (``lock_owner``),
not under the grants' row locks, so that an authorization never waits for a step's draws."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Table,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    union,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from billing.credits.rows import (
    DRAW,
    EXPIRY,
    GRANT,
    OVERDRAFT,
    REVERSAL,
    VOID,
    ChargedRow,
    Drawn,
    GrantView,
    Movement,
    Owner,
)
from billing.storage.models import (
    Call,
    CreditEntry,
    CreditGrant,
    CreditOverdraft,
    Customer,
    KeyAssignment,
    LedgerEntry,
)


def owned_by(table: Any, owner: Owner) -> ColumnElement[bool]:
    """The rows of ``table`` (a grant, an entry, a call) that belong to ``owner``."""
    if owner.customer_id is not None:
        return table.customer_id == owner.customer_id  # type: ignore[no-any-return]
    return and_(table.api_key_id == owner.api_key_id, table.customer_id.is_(None))


def _any_owner(table: Any, owners: Iterable[Owner]) -> ColumnElement[bool]:
    """The rows of ``table`` that belong to any of ``owners`` (``owned_by`` each): the
    customers' and the keys' each as one ``IN`` list."""
    owners = list(owners)
    customers = sorted({o.customer_id for o in owners if o.customer_id is not None})
    keys = sorted({o.api_key_id for o in owners if o.customer_id is None and o.api_key_id})
    parts: list[ColumnElement[bool]] = []
    if customers:
        parts.append(table.customer_id.in_(customers))
    if keys:
        parts.append(and_(table.api_key_id.in_(keys), table.customer_id.is_(None)))
    return or_(false(), *parts)


#: A grant's remainder as the sum of its entries: its grant less everything else.
SIGNED = case((CreditEntry.kind == GRANT, CreditEntry.amount_pusd), else_=-CreditEntry.amount_pusd)

_ENTRIES = cast(Table, CreditEntry.__table__)
_OVERDRAFTS = cast(Table, CreditOverdraft.__table__)
_GRANTS = cast(Table, CreditGrant.__table__)
#: What a ``GrantView`` reads of a grant.
_GRANT_COLUMNS = (
    CreditGrant.grant_id,
    CreditGrant.customer_id,
    CreditGrant.api_key_id,
    CreditGrant.amount_pusd,
    CreditGrant.remaining_pusd,
    CreditGrant.effective_at,
    CreditGrant.expires_at,
    CreditGrant.priority,
    CreditGrant.kind,
    CreditGrant.note,
)
#: ``_keep_sums``' statement for the grants (executemany: ``g`` the grant, ``d`` the change).
_ADD_TO_REMAINING = (
    update(_GRANTS)
    .where(_GRANTS.c.grant_id == bindparam("g"))
    .values(remaining_pusd=_GRANTS.c.remaining_pusd + bindparam("d"))
)


def entry_row(move: Movement) -> dict[str, Any]:
    """The ``credit_entries`` values of ``move``."""
    return {
        "kind": move.kind,
        "booked_at": move.booked_at,
        "customer_id": move.owner.customer_id,
        "api_key_id": move.owner.api_key_id,
        "grant_id": move.grant_id,
        "amount_pusd": move.amount_pusd,
        "request_id": move.request_id,
        "ledger_seq": move.ledger_seq,
        "dedupe_key": move.dedupe_key,
    }


class _Insert(Protocol):
    def __call__(self, table: Any) -> Any: ...


class CoreCredits:
    """``CreditsRepository`` on both databases, with the database's ``INSERT`` construct (its
    ``ON CONFLICT DO NOTHING``)."""

    def __init__(self, insert: _Insert) -> None:
        self._insert = insert

    def lock_owner(self, session: Session, owner: Owner) -> None:
        """SQLite: nothing to do, its one writer decides one authorization at a time."""

    def add_once(self, session: Session, move: Movement) -> bool:
        statement = self._insert(CreditEntry).values(entry_row(move)).on_conflict_do_nothing()
        result: CursorResult[Any] = session.execute(statement)  # type: ignore[assignment]
        if not result.rowcount:
            return False
        self._keep_sums(session, [move])
        return True

    def _keep_sums(self, session: Session, moves: Sequence[Movement]) -> None:
        """Add the booked ``moves`` to their grants' remainders and owners' overdrafts: one
        ``UPDATE`` (executemany) for the grants, one upsert for the overdrafts."""
        grants: dict[str, int] = {}
        overdrafts: dict[Owner, int] = {}
        for move in moves:
            if move.grant_id is None:
                overdrafts[move.owner] = overdrafts.get(move.owner, 0) + move.amount_pusd
            else:
                signed = move.amount_pusd if move.kind == GRANT else -move.amount_pusd
                grants[move.grant_id] = grants.get(move.grant_id, 0) + signed
        changed = [{"g": g, "d": d} for g, d in sorted(grants.items()) if d]
        if changed:
            session.execute(_ADD_TO_REMAINING, changed)
        if overdrafts:
            rows = [
                {
                    "owner": owner.account(),
                    "customer_id": owner.customer_id,
                    "api_key_id": owner.api_key_id,
                    "overdraft_pusd": amount,
                }
                for owner, amount in sorted(overdrafts.items(), key=lambda i: i[0].sort_key())
            ]
            upsert = self._insert(_OVERDRAFTS)
            upsert = upsert.on_conflict_do_update(
                index_elements=[_OVERDRAFTS.c.owner],
                set_={
                    "overdraft_pusd": _OVERDRAFTS.c.overdraft_pusd + upsert.excluded.overdraft_pusd
                },
            )
            session.execute(upsert, rows)

    def any_grants(self, session: Session) -> bool:
        return bool(session.scalar(select(exists().select_from(CreditGrant))))

    def customer(self, session: Session, customer_id: str) -> Customer | None:
        return session.get(Customer, customer_id)

    def customers(self, session: Session, ids: Sequence[str]) -> dict[str, Customer]:
        if not ids:
            return {}
        rows = session.scalars(select(Customer).where(Customer.customer_id.in_(list(ids))))
        return {row.customer_id: row for row in rows}

    def save_customer(self, session: Session, row: Customer) -> None:
        session.add(row)
        session.flush()

    def customer_known(self, session: Session, customer_id: str) -> bool:
        return bool(
            session.scalar(
                select(
                    exists().where(Customer.customer_id == customer_id)
                    | exists().where(KeyAssignment.customer_id == customer_id)
                    | exists().where(CreditGrant.customer_id == customer_id)
                )
            )
        )

    def customer_page(self, session: Session, after: str | None, limit: int) -> list[str]:
        parts = [
            select(Customer.customer_id.label("id")),
            select(KeyAssignment.customer_id).where(KeyAssignment.customer_id.is_not(None)),
            select(CreditGrant.customer_id).where(CreditGrant.customer_id.is_not(None)),
        ]
        if after is not None:
            parts[0] = parts[0].where(Customer.customer_id > after)
            parts[1] = parts[1].where(KeyAssignment.customer_id > after)
            parts[2] = parts[2].where(CreditGrant.customer_id > after)
        ids = union(*parts).subquery()
        return list(session.scalars(select(ids.c.id).order_by(ids.c.id).limit(limit)))

    def grant(self, session: Session, grant_id: str) -> CreditGrant | None:
        return session.get(CreditGrant, grant_id)

    def add_grant(self, session: Session, grant: CreditGrant, booked: Movement) -> bool:
        try:
            # A savepoint: a grant_id posted meanwhile fails this insert only.
            with session.begin_nested():
                session.add(grant)
                session.flush()
        except IntegrityError:
            return False
        self.add(session, [booked])
        return True

    def grants(
        self, session: Session, owners: Sequence[Owner], lock: bool = False
    ) -> list[GrantView]:
        if not owners:
            return []
        # Columns, not entities: a grant loaded in the session before would keep the remainder
        # it had then (``_keep_sums`` updates the table, not the identity map).
        query = (
            select(*_GRANT_COLUMNS)
            .where(_any_owner(CreditGrant, owners))
            .order_by(CreditGrant.grant_id)
        )
        if lock:
            query = query.with_for_update()
        rows = list(session.execute(query))
        voided: set[str] = set()
        if rows:
            # A grant's void is booked once, under its dedupe key (a unique index).
            keys = {f"{VOID}:{row.grant_id}": row.grant_id for row in rows}
            voids = select(CreditEntry.dedupe_key).where(CreditEntry.dedupe_key.in_(list(keys)))
            voided = {keys[key] for key in session.scalars(voids) if key is not None}
        return [
            GrantView(
                row.grant_id,
                Owner(row.customer_id, row.api_key_id),
                row.amount_pusd,
                row.remaining_pusd,
                row.effective_at,
                row.expires_at,
                row.priority,
                row.kind,
                row.note,
                row.grant_id in voided,
            )
            for row in rows
        ]

    def owners_with_grants(self, session: Session, owners: Sequence[Owner]) -> set[Owner]:
        if not owners:
            return set()
        query = select(CreditGrant.customer_id, CreditGrant.api_key_id).where(
            _any_owner(CreditGrant, owners)
        )
        return {Owner(c, k) for c, k in session.execute(query.distinct())}

    def drawn(self, session: Session, request_ids: Sequence[str]) -> Drawn:
        found: Drawn = {}
        if not request_ids:
            return found
        query = (
            select(
                CreditEntry.request_id,
                CreditEntry.customer_id,
                CreditEntry.api_key_id,
                CreditEntry.grant_id,
                func.sum(CreditEntry.amount_pusd),
            )
            .where(
                CreditEntry.request_id.in_(list(request_ids)),
                CreditEntry.kind.in_((DRAW, REVERSAL, OVERDRAFT)),
            )
            .group_by(
                CreditEntry.request_id,
                CreditEntry.customer_id,
                CreditEntry.api_key_id,
                CreditEntry.grant_id,
            )
        )
        for rid, customer_id, api_key_id, grant_id, total in session.execute(query):
            key = (str(rid), Owner(customer_id, api_key_id))
            found.setdefault(key, {})[grant_id] = int(total)
        return found

    def add(self, session: Session, moves: Sequence[Movement]) -> None:
        if moves:
            # Core (not the ORM's bulk insert): one executemany, nothing read back.
            session.execute(insert(_ENTRIES), [entry_row(m) for m in moves])
            self._keep_sums(session, moves)

    def due_expiries(self, session: Session, now: datetime) -> list[CreditGrant]:
        booked = select(CreditEntry.entry_id).where(
            CreditEntry.dedupe_key.in_(
                (
                    literal(f"{EXPIRY}:") + CreditGrant.grant_id,
                    literal(f"{VOID}:") + CreditGrant.grant_id,
                )
            )
        )
        query = (
            select(CreditGrant)
            .where(CreditGrant.expires_at <= now, ~booked.exists())
            .order_by(CreditGrant.expires_at, CreditGrant.grant_id)
        )
        return list(session.scalars(query))

    def expiring_owners(
        self, session: Session, after: datetime, until: datetime
    ) -> dict[Owner, set[str]]:
        query = select(CreditGrant.customer_id, CreditGrant.api_key_id, CreditGrant.grant_id).where(
            CreditGrant.expires_at > after, CreditGrant.expires_at <= until
        )
        found: dict[Owner, set[str]] = {}
        for customer_id, api_key_id, grant_id in session.execute(query):
            found.setdefault(Owner(customer_id, api_key_id), set()).add(grant_id)
        return found

    def overdraft(self, session: Session, owner: Owner) -> int:
        return self.overdrafts(session, [owner]).get(owner, 0)

    def overdrafts(self, session: Session, owners: Sequence[Owner]) -> dict[Owner, int]:
        if not owners:
            return {}
        by_account = {owner.account(): owner for owner in owners}
        query = select(CreditOverdraft.owner, CreditOverdraft.overdraft_pusd).where(
            CreditOverdraft.owner.in_(list(by_account))
        )
        return {by_account[account]: int(amount) for account, amount in session.execute(query)}

    def pending(self, session: Session, owner: Owner) -> int:
        return self.pending_by_owner(session, [owner]).get(owner, 0)

    def pending_by_owner(self, session: Session, owners: Sequence[Owner]) -> dict[Owner, int]:
        if not owners:
            return {}
        figure = func.coalesce(Call.charge_pusd, Call.cost_pusd, 0)
        query = (
            select(Call.customer_id, Call.api_key_id, func.sum(figure))
            .where(_any_owner(Call, owners), Call.settled.is_(False))
            .group_by(Call.customer_id, Call.api_key_id)
        )
        found: dict[Owner, int] = {}
        for customer_id, api_key_id, total in session.execute(query):
            owner = Owner.of(customer_id, api_key_id)
            found[owner] = found.get(owner, 0) + int(total or 0)
        return found

    def charged_by_key_grants(
        self, session: Session, request_ids: Sequence[str]
    ) -> list[ChargedRow]:
        if not request_ids:
            return []
        holders = select(CreditGrant.api_key_id).where(
            CreditGrant.api_key_id.is_not(None), CreditGrant.customer_id.is_(None)
        )
        query = (
            select(
                LedgerEntry.request_id,
                LedgerEntry.seq,
                LedgerEntry.api_key_id,
                LedgerEntry.customer_id,
                LedgerEntry.charge_pusd,
            )
            .where(
                LedgerEntry.request_id.in_(list(request_ids)),
                LedgerEntry.api_key_id.in_(holders),
            )
            .order_by(LedgerEntry.request_id, LedgerEntry.seq)
        )
        return [ChargedRow(*row) for row in session.execute(query)]

    def entries_between(
        self, session: Session, since: datetime, until: datetime
    ) -> list[CreditEntry]:
        query = (
            select(CreditEntry)
            .where(CreditEntry.booked_at >= since, CreditEntry.booked_at < until)
            .order_by(CreditEntry.booked_at, CreditEntry.entry_id)
        )
        return list(session.scalars(query))

    def kind_totals(
        self, session: Session, since: datetime | None, until: datetime
    ) -> dict[tuple[str, bool], int]:
        query = select(
            CreditEntry.kind,
            CreditEntry.grant_id.is_not(None),
            func.sum(CreditEntry.amount_pusd),
        ).where(CreditEntry.booked_at < until)
        if since is not None:
            query = query.where(CreditEntry.booked_at >= since)
        query = query.group_by(CreditEntry.kind, CreditEntry.grant_id.is_not(None))
        return {
            (kind, bool(of_grant)): int(total) for kind, of_grant, total in session.execute(query)
        }

    def balances_before(self, session: Session, until: datetime) -> dict[str, int]:
        query = (
            select(CreditEntry.grant_id, func.sum(SIGNED))
            .where(CreditEntry.grant_id.is_not(None), CreditEntry.booked_at < until)
            .group_by(CreditEntry.grant_id)
        )
        return {str(grant_id): int(total) for grant_id, total in session.execute(query)}

    def owner_entries(self, session: Session, owner: Owner, limit: int) -> list[CreditEntry]:
        query = (
            select(CreditEntry)
            .where(owned_by(CreditEntry, owner))
            .order_by(CreditEntry.booked_at.desc(), CreditEntry.entry_id.desc())
            .limit(limit)
        )
        return list(session.scalars(query))


#: The class of the owners' authorization locks ("cred"), the first of the two 32-bit keys of
#: ``pg_advisory_xact_lock`` (a key space apart from the budgets' one-key locks).
OWNER_LOCKS = 0x6372_6564


class PostgresCredits(CoreCredits):
    """``CoreCredits`` with PostgreSQL's advisory lock per owner."""

    def lock_owner(self, session: Session, owner: Owner) -> None:
        """Until the transaction ends, no other authorization of ``owner`` decides: a
        transaction-level advisory lock on (``OWNER_LOCKS``, the hash of the owner's key)."""
        session.execute(
            text("SELECT pg_advisory_xact_lock(:kind, hashtext(:owner))"),
            {"kind": OWNER_LOCKS, "owner": owner.account()},
        )


#: ``CoreCredits`` on SQLite and on PostgreSQL.
SQLITE = CoreCredits(sqlite.insert)
POSTGRES = PostgresCredits(postgresql.insert)
