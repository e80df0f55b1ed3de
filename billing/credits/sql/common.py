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

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Select,
    Table,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    literal,
    or_,
    select,
    text,
    union,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from billing.budgets.sql.holds import held_total
from billing.credits.rows import (
    DRAW,
    EXPIRY,
    GRANT,
    OVERDRAFT,
    REVERSAL,
    VOID,
    BalanceFigures,
    CommonDraws,
    Drawn,
    DueExpiry,
    EntryRow,
    GrantView,
    Movement,
    Owner,
)
from billing.reconcile.sql.sqlite_fastpath import SCRATCH_COMMON
from billing.rollups.rows import PICO
from billing.storage.dialects import DialectInsert
from billing.storage.lists import ARRAY_LIST, JSON_LIST, Listed
from billing.storage.models import (
    Call,
    CreditEntry,
    CreditGrant,
    CreditOverdraft,
    Customer,
    KeyAssignment,
)
from billing.storage.types import sqlite_text


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


def _owners_in(table: Any, listed: Listed) -> ColumnElement[bool]:
    """The rows of ``table`` that belong to one of the bound owners: the customers ``c`` and
    the keys ``k`` (keys without a customer), each bound as one list (``listed``), so that the
    statement is built and compiled once, whatever the owners."""
    return or_(
        listed(table.customer_id, "c"),
        and_(table.customer_id.is_(None), listed(table.api_key_id, "k")),
    )


def _owner_lists(owners: Iterable[Owner]) -> tuple[list[str], list[str]]:
    """The customers and the keys (without a customer) of ``owners``: ``_owners_in``'s lists."""
    customers: list[str] = []
    keys: list[str] = []
    for customer_id, api_key_id in owners:
        if customer_id is not None:
            customers.append(customer_id)
        elif api_key_id is not None:
            keys.append(api_key_id)
    return customers, keys


#: A grant's remainder as the sum of its entries: its grant less everything else.
SIGNED = case((CreditEntry.kind == GRANT, CreditEntry.amount_pusd), else_=-CreditEntry.amount_pusd)


#: The divisor of ``_split_sum``: an amount's high part is below 2**63 / 10**6, its low part 10**6.
_SPLIT = 10**6


def _split_sum(
    amount: ColumnElement[Any] | InstrumentedAttribute[int],
) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """``amount`` summed in two parts, ``high * 10**6 + low`` (each amount divided with
    truncation, its remainder of the same sign, on both databases), so that no SQL integer sum
    overflows: SQLite's ``sum`` of 64-bit integers raises past 2**63 (about 9.2 million USD in
    picodollars, less than the grants of a few large customers together); ``_joined`` puts
    them back together in Python."""
    return func.sum(amount // _SPLIT), func.sum(amount % _SPLIT)


def _joined(high: Any, low: Any) -> int:
    """The total that ``_split_sum``'s parts make (0 for none)."""
    return int(high or 0) * _SPLIT + int(low or 0)


_OVERDRAFTS = cast(Table, CreditOverdraft.__table__)
_CUSTOMERS = cast(Table, Customer.__table__)
#: A customer's ``credit_required`` (each authorization of a key with a customer): Core on the
#: table, built once (through the ORM session the statement cost ten times its reading).
_CREDIT_REQUIRED = select(_CUSTOMERS.c.credit_required).where(
    _CUSTOMERS.c.customer_id == bindparam("customer_id")
)
_GRANTS = cast(Table, CreditGrant.__table__)
_ENTRIES = cast(Table, CreditEntry.__table__)
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
#: Whether a grant was voided: its void is booked once, under its dedupe key (a unique index).
#: A scalar subquery with ``LIMIT 1``, probed per grant: as an ``EXISTS``, PostgreSQL reads the
#: grants of a step's owners with a hashed subplan, a scan of every credit entry (all of a
#: year's draws: 4 ms at 30,000 entries, twice a step, growing with the table).
_VOIDED = (
    select(literal(1))
    .where(CreditEntry.dedupe_key == literal(f"{VOID}:") + CreditGrant.grant_id)
    .limit(1)
    .scalar_subquery()
    .is_not(None)
)


def _owner_statements(listed: Listed) -> _OwnerStatements:
    """The grants of the bound owners (``_owners_in``) with their remainders and whether
    voided, the same locked, and those of the owners that hold any grant."""
    owners_in = _owners_in(CreditGrant, listed)
    grants = select(*_GRANT_COLUMNS, _VOIDED).where(owners_in).order_by(CreditGrant.grant_id)
    holders = select(CreditGrant.customer_id, CreditGrant.api_key_id).where(owners_in)
    return _OwnerStatements(grants, grants.with_for_update(of=CreditGrant), holders.distinct())


class _OwnerStatements(NamedTuple):
    """``_owner_statements``: the owners' grants (each row ``_GRANT_COLUMNS`` and whether
    voided), the same locked, and the owners holding any grant (customer, key)."""

    grants: Select[*tuple[Any, ...]]
    locked_grants: Select[*tuple[Any, ...]]
    holders: Select[str | None, str | None]


#: The grants expired at ``now`` whose expiry (or void) is not booked yet, by expiry.
_DUE_EXPIRIES = (
    select(
        _GRANTS.c.grant_id,
        _GRANTS.c.customer_id,
        _GRANTS.c.api_key_id,
        _GRANTS.c.expires_at,
        _GRANTS.c.created_at,
    )
    .where(
        _GRANTS.c.expires_at <= bindparam("now"),
        ~select(CreditEntry.entry_id)
        .where(
            CreditEntry.dedupe_key.in_(
                (
                    literal(f"{EXPIRY}:") + _GRANTS.c.grant_id,
                    literal(f"{VOID}:") + _GRANTS.c.grant_id,
                )
            )
        )
        .exists(),
    )
    .order_by(_GRANTS.c.expires_at, _GRANTS.c.grant_id)
)
#: The grants whose ``expires_at`` is in (``after``, ``until``].
_EXPIRING = select(_GRANTS.c.customer_id, _GRANTS.c.api_key_id, _GRANTS.c.grant_id).where(
    _GRANTS.c.expires_at > bindparam("after"), _GRANTS.c.expires_at <= bindparam("until")
)


def _drawn_by_call(listed: Listed) -> Select[Any]:
    """What each of the bound calls (``ids``: request ids) drew of each grant (or its
    overdraft), by owner: its draws, reversals and overdrafts summed, found by the calls'
    numbers (the entries' index)."""
    e = _ENTRIES.c
    numbers = select(Call.call_no).where(listed(Call.request_id, "ids"))
    return (
        select(e.request_id, e.customer_id, e.api_key_id, e.grant_id, func.sum(e.amount_pusd))
        .where(e.call_no.in_(numbers), e.kind.in_((DRAW, REVERSAL, OVERDRAFT)))
        .group_by(e.request_id, e.customer_id, e.api_key_id, e.grant_id)
    )


#: The columns ``credit_entries`` rows are inserted with (``_insert_entries``).
_ENTRY_COLUMNS = (
    "kind", "booked_at", "customer_id", "api_key_id", "grant_id", "amount_pusd", "request_id",
    "ledger_seq", "dedupe_key", "call_no",
)  # fmt: skip


#: SQLite's insert of credit entries (``EntryRow``s, executemany).
_SQLITE_INSERT_ENTRIES = (
    f"INSERT INTO credit_entries ({', '.join(_ENTRY_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_ENTRY_COLUMNS))})"
)


#: SQLite's common draws (``SqliteCredits.insert_draws``): each key's grant, in the connection's
#: in-memory ``scratch`` database (``billing.storage.db``), cleared before each use.
_SQLITE_FIRST_GRANTS = (
    "CREATE TABLE IF NOT EXISTS scratch.credit_first_grants "
    "(api_key_id TEXT PRIMARY KEY, grant_id TEXT NOT NULL)"
)
_SQLITE_CLEAR_FIRST_GRANTS = "DELETE FROM scratch.credit_first_grants"
_SQLITE_ADD_FIRST_GRANT = "INSERT INTO scratch.credit_first_grants VALUES (?, ?)"
#: The step's other rows, numbered in the order drawn (``n``, the rowid).
_SQLITE_DRAW_ROWS = (
    f"CREATE TABLE IF NOT EXISTS scratch.credit_draw_rows (n INTEGER PRIMARY KEY, "
    f"{', '.join(_ENTRY_COLUMNS)})"
)
_SQLITE_CLEAR_DRAW_ROWS = "DELETE FROM scratch.credit_draw_rows"
_SQLITE_ADD_DRAW_ROW = (
    f"INSERT INTO scratch.credit_draw_rows ({', '.join(_ENTRY_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_ENTRY_COLUMNS))})"
)
#: One draw of each fast path call of a key with a first grant, and a charge (as
#: ``CommonDraws.rows``); the parameter is ``booked_at``.
_SQLITE_COMMON_DRAWS = (
    "SELECT 'draw' AS kind, ? AS booked_at, NULL AS customer_id, f.api_key_id AS api_key_id, "
    "g.grant_id AS grant_id, f.cost_pusd AS amount_pusd, f.request_id AS request_id, "
    "1 AS ledger_seq, NULL AS dedupe_key, f.call_no AS call_no{n} "
    f"FROM {SCRATCH_COMMON} AS f "
    "JOIN scratch.credit_first_grants AS g ON g.api_key_id = f.api_key_id "
    "WHERE f.cost_pusd > 0"
)
_SQLITE_INSERT_DRAWS = (
    f"INSERT INTO credit_entries ({', '.join(_ENTRY_COLUMNS)}) "
    + _SQLITE_COMMON_DRAWS.format(n="")
    + " ORDER BY f.request_id"
)
#: With the other rows: by call, a call's rows in the order drawn.
_SQLITE_INSERT_DRAWS_AND_ROWS = (
    f"INSERT INTO credit_entries ({', '.join(_ENTRY_COLUMNS)}) "
    f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM ("
    + _SQLITE_COMMON_DRAWS.format(n=", 0 AS n")
    + f" UNION ALL SELECT {', '.join(_ENTRY_COLUMNS)}, n FROM scratch.credit_draw_rows"
    ") ORDER BY request_id, n"
)


@functools.cache
def _balance(of_customer: bool) -> Select[Any]:
    """One owner's balance in one statement (``balance_figures``): a row with its holds,
    pending charges and overdraft, joined to each of its grants (one row with null grant
    columns for none). The owner is bound as ``owner_id`` (a customer, else a key without one),
    its account as ``account``, the instant as ``now``."""
    held = held_total(of_customer).scalar_subquery()
    if of_customer:
        calls_of = Call.customer_id == bindparam("owner_id")
        grants_of = CreditGrant.customer_id == bindparam("owner_id")
    else:
        calls_of = and_(Call.api_key_id == bindparam("owner_id"), Call.customer_id.is_(None))
        grants_of = and_(
            CreditGrant.api_key_id == bindparam("owner_id"), CreditGrant.customer_id.is_(None)
        )
    # As ``pending_by_owner`` (the predicate of the partial index ix_calls_open_owner).
    pending = (
        select(func.coalesce(func.sum(func.coalesce(Call.charge_pusd, Call.cost_pusd, 0)), 0))
        .where(calls_of, Call.settled.is_(False))
        .scalar_subquery()
    )
    overdraft = select(CreditOverdraft.overdraft_pusd).where(
        CreditOverdraft.owner == bindparam("account")
    )
    # The overdraft's two parts (``CreditOverdraft``), joined in Python: no 64-bit sum in SQL.
    whole = overdraft.with_only_columns(CreditOverdraft.overdraft_whole_usd).scalar_subquery()
    figures = select(
        held.label("held"),
        pending.label("pending"),
        overdraft.scalar_subquery().label("overdraft"),
        whole.label("overdraft_whole"),
    ).subquery("f")
    return (
        select(
            figures.c.held,
            figures.c.pending,
            figures.c.overdraft,
            figures.c.overdraft_whole,
            *_GRANT_COLUMNS,
            _VOIDED,
        )
        .select_from(figures.outerjoin(CreditGrant, grants_of))
        .order_by(CreditGrant.grant_id)
    )


def _grant_view(row: Any) -> GrantView:
    """A ``GrantView`` of a row of ``_GRANT_COLUMNS`` followed by whether it was voided."""
    (grant_id, customer_id, api_key_id, amount, remaining, effective_at, expires_at, priority,
     kind, note, voided) = row  # fmt: skip
    return GrantView(
        grant_id, Owner(customer_id, api_key_id), amount, remaining, effective_at, expires_at,
        priority, kind, note, bool(voided),
    )  # fmt: skip


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
        "call_no": move.call_no,
    }


class CoreCredits:
    """``CreditsRepository`` on both databases, with the database's ``INSERT`` construct (its
    ``ON CONFLICT DO NOTHING``)."""

    #: SQLite: one writer at a time, nothing to gain (``CreditsRepository.draws_before_lock``).
    draws_before_lock = False

    def __init__(self, insert: DialectInsert, listed: Listed) -> None:
        self._insert = insert
        self._listed = listed
        self._grants, self._locked_grants, self._holders = _owner_statements(listed)
        self._drawn = _drawn_by_call(listed)

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
        """Add the booked ``moves`` to their grants' remainders and owners' overdrafts."""
        grants: dict[str, int] = {}
        overdrafts: dict[Owner, int] = {}
        for move in moves:
            if move.grant_id is None:
                overdrafts[move.owner] = overdrafts.get(move.owner, 0) + move.amount_pusd
            else:
                signed = move.amount_pusd if move.kind == GRANT else -move.amount_pusd
                grants[move.grant_id] = grants.get(move.grant_id, 0) + signed
        self.add_to_sums(session, grants, overdrafts)

    def add_to_sums(
        self, session: Session, grants: dict[str, int], overdrafts: dict[Owner, int]
    ) -> None:
        """One ``UPDATE`` (executemany) for the grants, one upsert for the overdrafts."""
        changed = [(g, d) for g, d in sorted(grants.items()) if d]
        if changed:
            self._add_to_remaining(session, changed)
        if overdrafts:
            rows = [
                {
                    "owner": owner.account(),
                    "customer_id": owner.customer_id,
                    "api_key_id": owner.api_key_id,
                    "overdraft_whole_usd": amount // PICO,
                    "overdraft_pusd": amount % PICO,
                }
                for owner, amount in sorted(overdrafts.items(), key=lambda i: i[0].sort_key())
            ]
            # Each part as kept (0 <= part < 10**12) plus the change's: below 2 * 10**12, its
            # dollars carried (a change's whole dollars may be negative: a reversal).
            upsert = self._insert(_OVERDRAFTS)
            fraction = _OVERDRAFTS.c.overdraft_pusd + upsert.excluded.overdraft_pusd
            upsert = upsert.on_conflict_do_update(
                index_elements=[_OVERDRAFTS.c.owner],
                set_={
                    "overdraft_whole_usd": _OVERDRAFTS.c.overdraft_whole_usd
                    + upsert.excluded.overdraft_whole_usd
                    + fraction // PICO,
                    "overdraft_pusd": fraction % PICO,
                },
            )
            session.execute(upsert, rows)

    def _add_to_remaining(self, session: Session, changed: Sequence[tuple[str, int]]) -> None:
        """Add to each grant's remainder its change ((grant id, change), by grant id): one
        ``UPDATE`` (executemany)."""
        session.execute(_ADD_TO_REMAINING, [{"g": g, "d": d} for g, d in changed])

    def any_grants(self, session: Session) -> bool:
        return bool(session.scalar(select(exists().select_from(CreditGrant))))

    def customer(self, session: Session, customer_id: str) -> Customer | None:
        return session.get(Customer, customer_id)

    def credit_required(self, session: Session, customer_id: str) -> bool:
        found = session.connection().execute(_CREDIT_REQUIRED, {"customer_id": customer_id})
        return bool(found.scalar())

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
        query = self._locked_grants if lock else self._grants
        # On the connection: the ORM session's execution of a select of columns adds its
        # loading of each row (500 grants: ~1 ms).
        found = session.connection().execute(query, self._lists(owners))
        return [_grant_view(row) for row in found]

    def owners_with_grants(self, session: Session, owners: Sequence[Owner]) -> set[Owner]:
        if not owners:
            return set()
        found = session.connection().execute(self._holders, self._lists(owners))
        return {Owner(c, k) for c, k in found}

    def _lists(self, owners: Iterable[Owner]) -> dict[str, Any]:
        """``_owners_in``'s parameters for ``owners``."""
        customers, keys = _owner_lists(owners)
        return {"c": self._listed.value(customers), "k": self._listed.value(keys)}

    def balance_figures(self, session: Session, owner: Owner, now: datetime) -> BalanceFigures:
        of_customer = owner.customer_id is not None
        params = {
            "owner_id": owner.customer_id if of_customer else owner.api_key_id,
            "account": owner.account(),
            "now": now,
        }
        # On the connection: the statement is Core, and the ORM session's execution of it
        # (its compile state, its result) cost many times its reading (each balance, and each
        # authorization of a ``credit_required`` customer).
        rows = session.connection().execute(_balance(of_customer), params).all()
        held, pending, overdraft, whole = rows[0][:4]
        grants = [_grant_view(row[4:]) for row in rows if row[4] is not None]
        overdraft_pusd = int(whole or 0) * PICO + int(overdraft or 0)
        return BalanceFigures(int(held), int(pending), overdraft_pusd, grants)

    def drawn(self, session: Session, request_ids: Sequence[str]) -> Drawn:
        found: Drawn = {}
        if not request_ids:
            return found
        ids = self._listed.value(list(request_ids))
        for rid, customer_id, api_key_id, grant_id, total in session.connection().execute(
            self._drawn, {"ids": ids}
        ):
            key = (str(rid), Owner(customer_id, api_key_id))
            found.setdefault(key, {})[grant_id] = int(total)
        return found

    def add(self, session: Session, moves: Sequence[Movement]) -> None:
        if moves:
            self.insert_entries(session, [self._row(m) for m in moves])
            self._keep_sums(session, moves)

    def _row(self, move: Movement) -> EntryRow:
        kind, at, (customer_id, api_key_id), grant_id, amount, rid, seq, dedupe, call_no = move
        return (kind, self.entry_time(at), customer_id, api_key_id, grant_id, amount, rid, seq,
                dedupe, call_no)  # fmt: skip

    def entry_time(self, at: datetime) -> Any:
        """SQLite: ``UTCDateTime``'s text."""
        return sqlite_text(at)

    def insert_entries(self, session: Session, rows: Sequence[EntryRow]) -> None:
        """SQLite: one executemany of the driver (thousands of draws a step: SQLAlchemy's bind
        processing of each row's values cost more than the insert), nothing read back."""
        if rows:
            session.connection().exec_driver_sql(_SQLITE_INSERT_ENTRIES, list(rows))

    def insert_draws(self, session: Session, rows: Sequence[EntryRow], common: CommonDraws) -> None:
        self.insert_entries(session, common.merged(list(rows)))

    def due_expiries(self, session: Session, now: datetime) -> list[DueExpiry]:
        # On the connection (each step asks): the ORM session's first compile of a grant
        # entity's select cost 20-40 ms of a process, each later one its loading.
        found = session.connection().execute(_DUE_EXPIRIES, {"now": now})
        return [
            DueExpiry(grant_id, Owner(customer_id, api_key_id), expires_at, created_at)
            for grant_id, customer_id, api_key_id, expires_at, created_at in found
        ]

    def expiring_owners(
        self, session: Session, after: datetime, until: datetime
    ) -> dict[Owner, set[str]]:
        found: dict[Owner, set[str]] = {}
        rows = session.connection().execute(_EXPIRING, {"after": after, "until": until})
        for customer_id, api_key_id, grant_id in rows:
            found.setdefault(Owner(customer_id, api_key_id), set()).add(grant_id)
        return found

    def overdraft(self, session: Session, owner: Owner) -> int:
        return self.overdrafts(session, [owner]).get(owner, 0)

    def overdrafts(self, session: Session, owners: Sequence[Owner]) -> dict[Owner, int]:
        if not owners:
            return {}
        by_account = {owner.account(): owner for owner in owners}
        query = select(
            CreditOverdraft.owner,
            CreditOverdraft.overdraft_whole_usd,
            CreditOverdraft.overdraft_pusd,
        ).where(CreditOverdraft.owner.in_(list(by_account)))
        return {
            by_account[account]: int(whole) * PICO + int(fraction)
            for account, whole, fraction in session.execute(query)
        }

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
        of_grant = CreditEntry.grant_id.is_not(None)
        query = select(CreditEntry.kind, of_grant, *_split_sum(CreditEntry.amount_pusd))
        query = query.where(CreditEntry.booked_at < until)
        if since is not None:
            query = query.where(CreditEntry.booked_at >= since)
        query = query.group_by(CreditEntry.kind, of_grant)
        return {
            (kind, bool(of_grant)): _joined(high, low)
            for kind, of_grant, high, low in session.execute(query)
        }

    def balances_before(self, session: Session, until: datetime) -> dict[str, int]:
        query = (
            select(CreditEntry.grant_id, *_split_sum(SIGNED))
            .where(CreditEntry.grant_id.is_not(None), CreditEntry.booked_at < until)
            .group_by(CreditEntry.grant_id)
        )
        return {str(grant_id): _joined(high, low) for grant_id, high, low in session.execute(query)}

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


#: PostgreSQL's insert of credit entries (``EntryRow``s, in their order). ``COPY``: psycopg
#: formats each row in C and the server parses it as the columns' text; one JSON array through
#: ``jsonb_array_elements`` cost the server about 2.4 µs more a row (the JSON parsed, then each
#: value taken out and cast), and arrays a column cost psycopg more CPU to write (every text
#: element escaped through a regex).
_PG_COPY_ENTRIES = f"COPY credit_entries ({', '.join(_ENTRY_COLUMNS)}) FROM STDIN"

#: PostgreSQL's ``_add_to_remaining``: one statement over two arrays (grant ids, changes). An
#: executemany of ``_ADD_TO_REMAINING`` (a step changes up to a grant a call) cost about 6 ms
#: of the reconciler's CPU and 8 ms of the server's for 500 grants, this 0.8 and 5 ms, under
#: the grants' locks (the other reconcile thread waits for them).
_PG_ADD_TO_REMAINING = (
    "UPDATE credit_grants AS g SET remaining_pusd = g.remaining_pusd + v.d "
    "FROM unnest(%s::text[], %s::bigint[]) AS v(grant_id, d) WHERE g.grant_id = v.grant_id"
)


class PostgresCredits(CoreCredits):
    """``CoreCredits`` with PostgreSQL's advisory lock per owner and its array insert."""

    #: Steps run at once: a step's draws are inserted before it locks the grants.
    draws_before_lock = True

    def entry_time(self, at: datetime) -> Any:
        """PostgreSQL: the instant in RFC 3339 with its offset (``COPY`` reads it as the column's
        text)."""
        if at.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return at.isoformat()

    def insert_entries(self, session: Session, rows: Sequence[EntryRow]) -> None:
        """One ``COPY … FROM STDIN`` (``_PG_COPY_ENTRIES``): the rows in their order, one round
        trip, nothing read back."""
        if not rows:
            return
        cursor = session.connection().connection.cursor()
        try:
            with cursor.copy(_PG_COPY_ENTRIES) as copy:
                for row in rows:
                    copy.write_row(row)
        finally:
            cursor.close()

    def _add_to_remaining(self, session: Session, changed: Sequence[tuple[str, int]]) -> None:
        """One ``UPDATE … FROM unnest(…)`` (``_PG_ADD_TO_REMAINING``): each grant once (the
        changes are summed by grant)."""
        grant_ids = [g for g, _ in changed]
        session.connection().exec_driver_sql(
            _PG_ADD_TO_REMAINING, (grant_ids, [d for _, d in changed])
        )

    def lock_owner(self, session: Session, owner: Owner) -> None:
        """Until the transaction ends, no other authorization of ``owner`` decides: a
        transaction-level advisory lock on (``OWNER_LOCKS``, the hash of the owner's key)."""
        # On the connection, the text built once (each authorization of a ``credit_required``
        # customer): the ORM session's execution of it cost more than the lock.
        session.connection().execute(_LOCK_OWNER, {"kind": OWNER_LOCKS, "owner": owner.account()})


_LOCK_OWNER = text("SELECT pg_advisory_xact_lock(:kind, hashtext(:owner))")


#: ``CoreCredits`` on SQLite and on PostgreSQL.
class SqliteCredits(CoreCredits):
    """``CoreCredits`` with SQLite's insert of a step's draws from the fast path's table."""

    def insert_draws(self, session: Session, rows: Sequence[EntryRow], common: CommonDraws) -> None:
        """SQLite: the common draws read from the fast path's table of the step's calls
        (``billing.reconcile.sql.sqlite_fastpath.SCRATCH_TABLE``, which holds exactly the
        calls of ``common.calls`` and more, of keys without grants) joined to their keys' grants,
        ``rows`` from a table of their own, in one ``INSERT … SELECT`` by ``request_id`` (the
        fast path's calls settle there for the first time: at most one draw each); nothing read
        back. An executemany of the rows cost about 4 times as much CPU a row (each bound,
        each a statement). Raises ``RuntimeError`` when it inserted other than
        ``common.drawn`` + ``len(rows)`` rows (not the step's calls: the step fails)."""
        if not common.drawn:
            self.insert_entries(session, rows)
            return
        conn = session.connection()
        conn.exec_driver_sql(_SQLITE_FIRST_GRANTS)
        conn.exec_driver_sql(_SQLITE_CLEAR_FIRST_GRANTS)
        conn.exec_driver_sql(_SQLITE_ADD_FIRST_GRANT, list(common.grants.items()))
        if rows:
            conn.exec_driver_sql(_SQLITE_DRAW_ROWS)
            conn.exec_driver_sql(_SQLITE_CLEAR_DRAW_ROWS)
            conn.exec_driver_sql(_SQLITE_ADD_DRAW_ROW, list(rows))
            insert = _SQLITE_INSERT_DRAWS_AND_ROWS
        else:
            insert = _SQLITE_INSERT_DRAWS
        inserted = conn.exec_driver_sql(insert, (common.at,)).rowcount
        if inserted != common.drawn + len(rows):
            raise RuntimeError(
                f"credit draws: {inserted} rows inserted, {common.drawn} + {len(rows)} planned"
            )


SQLITE = SqliteCredits(sqlite.insert, JSON_LIST)
POSTGRES = PostgresCredits(postgresql.insert, ARRAY_LIST)
