"""The holds of authorizations and the calls of the budgets no counter keeps
(``billing.budgets.repository``), built with SQLAlchemy on the ORM tables (the same on both
databases)."""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Select,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from billing.budgets.measure import AMOUNT_COLUMNS
from billing.budgets.rows import CallAmount, LiveHold, StepCall, StoredHold, Unstepped
from billing.budgets.sql.common import DialectBase
from billing.storage.models import BudgetHold, BudgetSpend, Call, Event
from billing.storage.types import UTCDateTime

_C = Call.__table__.c
_H = BudgetHold.__table__.c
_E = Event.__table__.c

#: A call no reconciliation step has read yet: as the partial index ``ix_calls_unstepped``
#: states it (SQLite matches the predicate term by term: no bound value).
_UNSTEPPED = text("calls.attempts = 0")

#: A hold's call: none, not yet read by a reconciliation step (no attempt written: the hold
#: stands for its figure), or read by a step and still open (it counts at no less than its
#: hold). A hold whose call settled is not read at all (``_COUNTED``).
_CALL_STATE = case(
    (_C.request_id.is_(None), None),
    (_C.attempts == 0, "unstepped"),
    else_="open",
)

#: The holds that still count: their call not stored yet, or not settled. The step that settles
#: a call marks its hold settled (``settle_holds``), which takes it out of the live holds'
#: indexes (``_NOT_DONE``); this leaves out a hold stored after its call settled.
_COUNTED = or_(_C.request_id.is_(None), _C.settled.is_(False))
#: Neither released nor marked settled (``settle_holds``): the predicate of the live holds'
#: partial indexes, term by term (SQLite uses such an index only so).
_NOT_DONE = and_(_H.released_at.is_(None), _H.settled_at.is_(None))

#: Whether any hold is live at ``now`` (``settle_holds``: the live holds' index, one row).
_ANY_LIVE = select(_H.request_id).where(_NOT_DONE, _H.expires_at > bindparam("now")).limit(1)

#: A stored authorization by its ``request_id`` (``hold``): Core, no ORM object to load.
_STORED = select(
    _H.request_id, _H.hold_pusd, _H.body_hash, _H.answer, _H.expires_at, _H.released_at
).where(_H.request_id == bindparam("request_id"))


@functools.cache
def _live(keys: bool, customers: bool) -> Select[Any]:
    """The live holds that still count (``live_holds``): every one, or those of the bound
    ``keys`` and/or ``customers`` (expanding lists), built once per shape (a statement built
    per authorization cost more CPU than the database's reading it)."""
    query = (
        select(
            _H.request_id,
            _H.api_key_id,
            _H.customer_id,
            _H.tags,
            _H.model,
            _H.hold_pusd,
            _H.expires_at,
            _CALL_STATE,
            _H.created_at,
            _C.cost_pusd,
            _C.charge_pusd,
        )
        .select_from(BudgetHold.__table__.outerjoin(Call, _C.request_id == _H.request_id))
        .where(_NOT_DONE, _H.expires_at > bindparam("now"), _COUNTED)
    )
    owners = []
    if keys:
        owners.append(_H.api_key_id.in_(bindparam("keys", expanding=True)))
    if customers:
        owners.append(_H.customer_id.in_(bindparam("customers", expanding=True)))
    return query.where(or_(*owners)) if owners else query


@functools.cache
def held_total(of_customer: bool) -> Select[Any]:
    """What the live holds of one owner take from its credit, as a scalar ``SELECT`` (0 for
    none): a customer's holds (``of_customer``), else a key's, bound as ``owner_id``, live at
    ``now``. The sum of ``billing.credits.holds.held_by_owner``'s amounts in SQL: a hold whose
    call is not stored or no step has read counts whole; one whose call is open counts what it
    adds to the call's figure so far (``LiveHold.beyond_call("charge")``)."""
    figure = func.coalesce(_C.charge_pusd, _C.cost_pusd, 0)
    amount = case(
        (or_(_C.request_id.is_(None), _C.attempts == 0), _H.hold_pusd),
        (_H.hold_pusd > figure, _H.hold_pusd - figure),
        else_=0,
    )
    owner = _H.customer_id if of_customer else _H.api_key_id
    return (
        select(func.coalesce(func.sum(amount), 0))
        .select_from(BudgetHold.__table__.outerjoin(Call, _C.request_id == _H.request_id))
        .where(
            owner == bindparam("owner_id"),
            _NOT_DONE,
            _H.expires_at > bindparam("now"),
            _COUNTED,
        )
    )


def _unstepped(everything: bool) -> Select[Any]:
    """The calls no step has read yet (``unstepped_calls``): every one, or those of the bound
    ``keys`` (an expanding list)."""
    started = (
        select(_E.body)
        .where(_E.call_no == _C.call_no, _E.type == "stream.started")
        .order_by(_E.seq)
        .limit(1)
        .scalar_subquery()
    )
    generated = (
        select(func.max(_E.output_tokens_generated))
        .where(_E.call_no == _C.call_no)
        .scalar_subquery()
    )
    query = select(
        _C.request_id,
        _C.api_key_id,
        _C.model,
        _C.started_at,
        _C["metadata"],
        started,
        generated,
    ).where(_UNSTEPPED)  # (the rest in Python: a term more may turn SQLite to a full index)
    if everything:
        return query
    return query.where(_C.api_key_id.in_(bindparam("keys", expanding=True)))


_UNSTEPPED_ALL = _unstepped(True)
_UNSTEPPED_OF_KEYS = _unstepped(False)

#: The counters of (budget row, period start) pairs read by ``spend_reads``' statement at most
#: (more: ``Counters.spend``' own statements, in slices).
READ_PAIRS = 500


def _pad(kind: Any) -> Any:
    return cast(null(), kind)


@functools.cache
def _spend_reads(holds: tuple[bool, bool] | None, calls: bool | None, counters: bool) -> Any:
    """``spend_reads``' one statement, built once per shape: a ``UNION ALL`` of the live holds
    (``_live``; ``holds``: (of keys, of customers), (False, False) every one, None none), the
    calls not yet stepped (``_unstepped``; ``calls``: every one, or of the keys; None none) and
    the counters of the bound ``pairs`` (``counters``), a kind per row (0, 1, 2) and the columns
    side by side (each member pads the others' with typed nulls)."""
    s, t, n = String, UTCDateTime, BigInteger
    members = []
    if holds is not None:
        members.append(
            _live(*holds).with_only_columns(
                literal(0),
                _H.request_id,
                _H.api_key_id,
                _H.customer_id,
                _H.tags,
                _H.model,
                _CALL_STATE,
                _H.expires_at,
                _H.created_at,
                _H.hold_pusd,
                _C.cost_pusd,
                _C.charge_pusd,
                _pad(n),
                _pad(JSON),
            )
        )
    if calls is not None:
        unstepped = _unstepped(calls)
        request_id, key, model, started_at, metadata, body, generated = unstepped.selected_columns
        members.append(
            unstepped.with_only_columns(
                literal(1),
                request_id,
                key,
                model,
                body,
                _pad(s),
                _pad(s),
                started_at,
                _pad(t),
                generated,
                _pad(n),
                _pad(n),
                _pad(n),
                metadata,
            )
        )
    if counters:
        members.append(
            select(
                literal(2),
                _pad(s),
                _pad(s),
                _pad(s),
                _pad(s),
                _pad(s),
                _pad(s),
                BudgetSpend.period_start,
                _pad(t),
                BudgetSpend.settled_pusd,
                BudgetSpend.provisional_pusd,
                _pad(n),
                BudgetSpend.budget_row,
                _pad(JSON),
            ).where(
                tuple_(BudgetSpend.budget_row, BudgetSpend.period_start).in_(
                    bindparam("pairs", expanding=True)
                )
            )
        )
    return union_all(*members)


def _unstepped_call(
    rid: str,
    key: str | None,
    model: str | None,
    at: datetime | None,
    metadata: dict[str, Any] | None,
    body: str | None,
    output: int | None,
) -> Unstepped | None:
    """A row of ``_unstepped`` as ``Unstepped`` (None before its ``stream.started``)."""
    if at is None:  # no stream.started yet: no start, no estimate
        return None
    start = json.loads(body) if body else {}
    return Unstepped(
        rid,
        key,
        model,
        at,
        (metadata or {}).get("tags"),
        int(start.get("input_tokens") or 0),
        int(output or 0),
    )


def _live_hold(
    rid: str, key: str, customer: str | None, tags: str, model: str, held: Any, *rest: Any
) -> LiveHold:
    return LiveHold(rid, key, customer, tuple(json.loads(tags)), model, int(held), *rest)


class Holds(DialectBase):
    """Holds: stored once per ``request_id``, released, read while live; the calls' amounts of
    a budget read at the time asked."""

    def hold(self, session: Session, request_id: str) -> StoredHold | None:
        row = session.connection().execute(_STORED, {"request_id": request_id}).first()
        return None if row is None else StoredHold(*row)

    def insert_hold(self, session: Session, values: dict[str, Any]) -> bool:
        # One statement (no savepoint, no ORM flush): a concurrent authorization of the same
        # request_id that committed first makes it insert nothing (PostgreSQL waits for it).
        found = session.connection().execute(self._insert_hold_statement(), values).first()
        return found is not None

    def _insert_hold_statement(self) -> Any:
        """``INSERT … ON CONFLICT (request_id) DO NOTHING RETURNING request_id``, built once."""
        built = self.__dict__.get("_insert_hold")
        if built is None:
            built = (
                self.insert(BudgetHold.__table__)
                .on_conflict_do_nothing(index_elements=["request_id"])
                .returning(_H.request_id)
            )
            self.__dict__["_insert_hold"] = built
        return built

    def call_exists(self, session: Session, request_id: str) -> bool:
        found = session.scalar(select(_C.request_id).where(_C.request_id == request_id))
        return found is not None

    def settle_holds(self, session: Session, request_ids: Sequence[str], now: datetime) -> None:
        # One probe while no hold is live (the reconciler's pass without holds); else one
        # UPDATE of the step's calls' holds, the ids bound as one list.
        conn = session.connection()
        if not request_ids or conn.execute(_ANY_LIVE, {"now": now}).first() is None:
            return
        built = self.__dict__.get("_settle_holds")
        if built is None:
            built = (
                update(BudgetHold)
                .where(
                    self.listed(_H.request_id, "ids"),
                    _NOT_DONE,
                    _H.expires_at > bindparam("now"),
                )
                .values(settled_at=bindparam("at"))
            )
            self.__dict__["_settle_holds"] = built
        conn.execute(built, {"ids": self.listed.value(list(request_ids)), "now": now, "at": now})

    def release_hold(self, session: Session, request_id: str, now: datetime) -> None:
        session.execute(
            update(BudgetHold).where(BudgetHold.request_id == request_id).values(released_at=now)
        )

    def live_holds(
        self,
        session: Session,
        now: datetime,
        keys: Collection[str],
        customers: Collection[str],
        everything: bool,
    ) -> list[LiveHold]:
        params: dict[str, Any] = {"now": now}
        if everything:
            query = _live(False, False)
        else:
            if not keys and not customers:
                return []
            query = _live(bool(keys), bool(customers))
            if keys:
                params["keys"] = sorted(keys)
            if customers:
                params["customers"] = sorted(customers)
        return [_live_hold(*row) for row in session.connection().execute(query, params)]

    def spend_reads(
        self,
        session: Session,
        now: datetime,
        keys: Collection[str],
        customers: Collection[str],
        everything: bool,
        calls_of_all: bool,
        pairs: Sequence[tuple[int, datetime]],
    ) -> tuple[list[LiveHold], list[Unstepped], dict[tuple[int, datetime], tuple[int, int]] | None]:
        holds: tuple[bool, bool] | None = None
        if everything:
            holds = (False, False)
        elif keys or customers:
            holds = (bool(keys), bool(customers))
        calls = True if calls_of_all else (False if keys else None)
        read_pairs = len(pairs) <= READ_PAIRS
        counters = bool(pairs) and read_pairs
        found_holds: list[LiveHold] = []
        found_calls: list[Unstepped] = []
        found_counters: dict[tuple[int, datetime], tuple[int, int]] = {}
        if holds is not None or calls is not None or counters:
            params: dict[str, Any] = {"now": now}
            if keys:
                params["keys"] = sorted(keys)
            if customers:
                params["customers"] = sorted(customers)
            if counters:
                params["pairs"] = list(pairs)
            for kind, *row in session.connection().execute(
                _spend_reads(holds, calls, counters), params
            ):
                if kind == 0:
                    rid, key, customer, tags, model, state, expires, created, held, cost, charge = (
                        row[:11]
                    )
                    found_holds.append(
                        _live_hold(
                            rid,
                            key,
                            customer,
                            tags,
                            model,
                            held,
                            expires,
                            state,
                            created,
                            cost,
                            charge,
                        )
                    )
                elif kind == 1:
                    rid, key, model, body, _, _, at, _, output = row[:9]
                    call = _unstepped_call(rid, key, model, at, row[12], body, output)
                    if call is not None:
                        found_calls.append(call)
                else:
                    start, settled, provisional = row[6], row[8], row[9]
                    found_counters[(int(row[11]), start)] = (int(settled), int(provisional))
        return found_holds, found_calls, found_counters if read_pairs else None

    def call_amounts(
        self,
        session: Session,
        measure: str,
        start: datetime,
        end: datetime | None,
        *,
        rolling: bool,
        key: str | None = None,
        customer: str | None = None,
        tag: str | None = None,
        model: str | None = None,
    ) -> list[CallAmount]:
        """The calls started in the span (``[start, end)``; rolling: after ``start``), of
        ``key`` / ``customer`` / ``model`` (a prefix ending in ``*``) when given: their sums by
        settled or not; with ``tag``, each call whose metadata or authorization tags may hold
        it (the caller keeps those that do)."""
        amount = func.coalesce(_C[AMOUNT_COLUMNS[measure]], 0)
        where: list[Any] = [_C.started_at > start if rolling else _C.started_at >= start]
        if end is not None and not rolling:
            where.append(_C.started_at < end)
        if key is not None:
            where.append(_C.api_key_id == key)
        if customer is not None:
            where.append(_C.customer_id == customer)
        if model is not None:
            if model.endswith("*"):
                where.append(_C.model.startswith(model[:-1], autoescape=True))
            else:
                where.append(_C.model == model)
        if tag is None:
            sums = select(_C.settled, func.sum(amount)).where(*where).group_by(_C.settled)
            return [
                CallAmount(bool(settled), int(total or 0), None, None)
                for settled, total in session.execute(sums)
            ]
        metadata_tags = _C["metadata"]["tags"].as_string()
        rows = (
            select(_C.settled, amount, metadata_tags, _H.tags)
            .select_from(Call.__table__.outerjoin(BudgetHold, _H.request_id == _C.request_id))
            .where(
                *where,
                or_(
                    metadata_tags.contains(tag, autoescape=True),
                    _H.tags.contains(json.dumps(tag), autoescape=True),
                ),
            )
        )
        return [
            CallAmount(bool(settled), int(value), tags, held)
            for settled, value, tags, held in session.execute(rows)
        ]

    def step_calls(self, session: Session, ids: Sequence[str]) -> list[StepCall]:
        """The calls ``ids`` with what a budget no counter keeps matches (one statement)."""
        query = (
            select(
                _C.api_key_id,
                _C.customer_id,
                _C.model,
                _C.started_at,
                _C["metadata"]["tags"].as_string(),
                _H.tags,
            )
            .select_from(Call.__table__.outerjoin(BudgetHold, _H.request_id == _C.request_id))
            .where(self.among(_C.request_id, ids))
        )
        return [StepCall(*row) for row in session.execute(query)]

    def unstepped_calls(
        self, session: Session, keys: Collection[str], everything: bool
    ) -> list[Unstepped]:
        if everything:
            rows = session.connection().execute(_UNSTEPPED_ALL)
        elif not keys:
            return []
        else:
            rows = session.connection().execute(_UNSTEPPED_OF_KEYS, {"keys": sorted(keys)})
        found = []
        for row in rows:
            call = _unstepped_call(*row)
            if call is not None:
                found.append(call)
        return found
