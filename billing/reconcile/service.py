"""Reconciliation steps against the database: recompute pending calls, settle, write the ledger.

One step handles a bounded batch of calls in one transaction: it locks their rows (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL, so two servers never work on the same call; SQLite has one writer at a
time), recomputes their figures from the events with the pure rule, books the difference in the
ledger, and clears ``pending``. Source: CONTRACT "Reconciliation" and "Cost".
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, false, func, or_, select, true, update
from sqlalchemy.orm import Session

from billing.dimensions import TOKEN_FIELDS, Tokens
from billing.pricing.prices import PriceBook, PriceRow, prices_by_id
from billing.reconcile.common import settle_common
from billing.reconcile.ledger import (
    ENTRY_COLUMNS,
    REVERSAL_PREFIX,
    SETTLED_COMPLETE,
    Line,
    LineKey,
    NewEntry,
    plan_entries,
    settled_timed_out,
)
from billing.reconcile.rule import UNPRICED, CallFigures, reconcile_call
from billing.reconcile.stored import AnyEvent, StoredTokens, check_figures, decode
from billing.rollups import service as rollups
from billing.storage.models import Call, CallAttempt, LedgerEntry
from billing.storage.types import cached_sqlite_text


@dataclass
class StepResult:
    """What one step (or a whole pass) did: calls examined, settled, and adjustments written."""

    examined: int = 0
    settled: int = 0
    adjusted: int = 0
    settled_ids: list[str] = field(default_factory=list)

    def add(self, other: StepResult) -> None:
        self.examined += other.examined
        self.settled += other.settled
        self.adjusted += other.adjusted
        self.settled_ids.extend(other.settled_ids)


def due_calls(
    session: Session,
    now: datetime,
    settle_after_s: float,
    limit: int,
    *,
    lock: bool = True,
    pending_before: datetime | None = None,
) -> list[str]:
    """Lock and return up to ``limit`` calls that need work: open ones whose last event arrived
    ``settle_after_s`` seconds ago or earlier (oldest first), then pending ones (oldest first;
    with ``pending_before``, only those pending since that instant or earlier). Rows locked by
    another reconciler are skipped. With ``lock=False`` the rows are only listed (a read
    transaction).

    Two queries, each a range of one index read in order (``calls(settled, pending,
    last_received_at, request_id)`` and ``calls(pending, last_received_at, request_id)``), so a
    step costs the same however many calls are waiting; one ``OR`` of both conditions can use
    neither index and sorts every waiting call at every step. ``last_received_at`` (see
    ``Call``) is the arrival of the last event of a call that is not pending, and of the events
    that made a pending call pending (so pending calls are taken in the order they started
    waiting).
    """
    cutoff = now - timedelta(seconds=settle_after_s)
    order = (Call.last_received_at, Call.request_id)
    queries = [
        # Open, not pending (reconciled since its last event), and quiet for settle_after.
        select(Call.request_id).where(
            Call.settled == false(), Call.pending == false(), Call.last_received_at <= cutoff
        ),
        select(Call.request_id).where(
            Call.pending == true(),
            *(() if pending_before is None else (Call.last_received_at <= pending_before,)),
        ),
    ]
    found: list[str] = []
    conn = session.connection()  # Core rows: no ORM loading for thousands of ids a step
    for query in queries:
        if len(found) >= limit:
            break
        query = query.order_by(*order).limit(limit - len(found))
        if lock:
            query = query.with_for_update(skip_locked=True)
        found.extend(conn.execute(query).scalars())
    return found


def pending_horizon(session: Session) -> datetime | None:
    """The latest ``last_received_at`` among the calls pending now (None: none is): as
    ``due_calls``' ``pending_before``, it takes every call pending now, whatever the clocks that
    stamped them (a host whose clock runs ahead, a value the reconciler wrote back); a call made
    pending later is left to the next pass unless stamped no later than that. One step of the
    pending index."""
    return session.scalar(select(func.max(Call.last_received_at)).where(Call.pending == true()))


#: The numbers of the calls named by an ``IN (…)`` / ``= ANY(…)`` of request ids: a call's events
#: are found by its number (index ``events(call_no, seq)``, see ``Event``).
_CALL_NOS = "SELECT call_no FROM calls WHERE request_id "


def _read_decoded(
    cursor: Any,
    where: str,
    params: Any,
    tokens_op: str,
    events: dict[str, list[AnyEvent]],
    arrivals: dict[str, Any],
) -> None:
    """Append to ``events`` the decoded events of the calls in ``where`` whose type is (``=``)
    or is not (``<>``) ``stream.tokens``, and keep in ``arrivals`` the latest ``received_at``."""
    cursor.execute(
        f"SELECT request_id, body, received_at FROM events WHERE call_no IN ({_CALL_NOS}{where}) "
        f"AND type {tokens_op} 'stream.tokens'",
        params,
    )
    for request_id, body, received in cursor.fetchall():
        events[request_id].append(decode(body))
        _note_arrival(arrivals, request_id, received)


def _note_arrival(arrivals: dict[str, Any], request_id: str, received: Any) -> None:
    """Keep the latest ``received_at`` per call (as the driver returns it; see load_events)."""
    seen = arrivals.get(request_id)
    if seen is None or received > seen:
        arrivals[request_id] = received


def load_events(
    session: Session, request_ids: Sequence[str], arrivals: dict[str, Any] | None = None
) -> dict[str, list[AnyEvent]]:
    """Every stored event of the given calls as the rule reads them (in no particular order:
    the rule does not depend on it).

    ``arrivals``, when given, receives each call's last arrival: the latest ``received_at`` of
    its events, as the driver returns it (SQLite: text in one fixed format, so text order is
    time order). The ``calls`` row does not have it while the call is pending (ingest leaves a
    pending call's row alone).

    The ``stream.tokens`` events (most of a call's events) are folded by the database
    (``_FOLD_TOKENS``): per call and attempt, the largest of each counter (from the columns
    ingest fills in, see ``Event``) and the earliest and latest ``occurred_at``, given to the rule
    as two events (the earliest and the latest) that carry those largest counters. The rule reads
    nothing else of a ``stream.tokens`` event: it keeps the largest of each counter (a smaller
    one, or one going backwards, changes nothing) and the call's earliest and latest
    ``occurred_at``; so the figures are the same as from every event. A call with a progress
    record stored without those columns (before migration 0005) is read event by event, from the
    bodies, as are the other types.
    """
    events: dict[str, list[AnyEvent]] = {rid: [] for rid in request_ids}
    if arrivals is None:
        arrivals = {}
    conn = session.connection()
    postgres = conn.dialect.name == "postgresql"
    # The driver's own cursor: tens of thousands of rows per step, no result processing.
    cursor = conn.connection.cursor()
    try:
        for start in range(0, len(request_ids), _CHUNK):
            chunk = list(request_ids[start : start + _CHUNK])
            where, params = _in_list(postgres, chunk)
            _read_decoded(cursor, where, params, "<>", events, arrivals)
            cursor.execute(_FOLD_TOKENS.format(where=where), params)
            folds = cursor.fetchall()
            # A call with any row lacking the counters is read from its bodies, all attempts.
            slow = {fold[0] for fold in folds if fold[-1]}
            for request_id, attempt, first, last, delivered, generated, received, _ in folds:
                if request_id in slow:
                    continue
                _note_arrival(arrivals, request_id, received)
                group = events[request_id]
                group.append(_folded(request_id, attempt, first, delivered, generated, "first"))
                group.append(_folded(request_id, attempt, last, delivered, generated, "last"))
            if slow:
                where, params = _in_list(postgres, sorted(slow))
                _read_decoded(cursor, where, params, "=", events, arrivals)
    finally:
        cursor.close()
    return events


#: ``stream.tokens`` folded per call and attempt by the database: the earliest and latest
#: ``occurred_at``, the largest of each counter (from the columns ingest fills in from the
#: validated event), the latest arrival, and how many of the attempt's rows lack the counters
#: (stored before those columns existed: such a call is read event by event instead).
_FOLD_TOKENS = (
    "SELECT min(request_id), attempt, min(occurred_at), max(occurred_at), "
    "max(output_tokens_delivered), max(output_tokens_generated), max(received_at), "
    "count(*) - count(output_tokens_delivered + output_tokens_generated) "
    f"FROM events WHERE call_no IN ({_CALL_NOS}{{where}}) AND type = 'stream.tokens' "
    "GROUP BY call_no, attempt"
)


def _in_list(postgres: bool, chunk: list[str]) -> tuple[str, Any]:
    if postgres:
        return "= ANY(%b)", (chunk,)
    return f"IN ({', '.join('?' * len(chunk))})", tuple(chunk)


def _folded(
    request_id: str, attempt: int, when: Any, delivered: Any, generated: Any, which: str
) -> StoredTokens:
    if isinstance(when, str):  # SQLite: naive UTC text (parsed with its offset: ~7x faster)
        when = datetime.fromisoformat(when + "+00:00")
    elif when.tzinfo is not UTC:
        when = when.astimezone(UTC)
    event = StoredTokens.__new__(StoredTokens)
    event.__dict__ = {
        "type": "stream.tokens",
        # Not an id ingest accepts (it cannot collide with a stored event's).
        "event_id": f"\x00tokens:{attempt}:{which}",
        "request_id": request_id,
        "occurred_at": when,
        "attempt": attempt,
        "output_tokens_delivered": int(delivered),
        "output_tokens_generated": int(generated),
    }
    return event


@dataclass
class _Booked:
    tokens: dict[LineKey, Tokens] = field(default_factory=dict)
    prices: dict[LineKey, PriceRow | None] = field(default_factory=dict)
    closed: set[LineKey] = field(default_factory=set)
    max_seq: int = 0


_SUMS = [func.sum(getattr(LedgerEntry, name)) for name in TOKEN_FIELDS]
_LAST_REVERSAL = func.max(
    case((LedgerEntry.reason.like(f"{REVERSAL_PREFIX}%"), LedgerEntry.seq), else_=None)
)


def _load_booked(session: Session, request_ids: Sequence[str]) -> dict[str, _Booked]:
    booked: dict[str, _Booked] = {}
    rows = session.execute(
        select(
            LedgerEntry.request_id,
            LedgerEntry.api_key_id,
            LedgerEntry.model,
            LedgerEntry.price_id,
            func.max(LedgerEntry.seq),
            _LAST_REVERSAL,
            *_SUMS,
        )
        .where(LedgerEntry.request_id.in_(request_ids))
        .group_by(
            LedgerEntry.request_id, LedgerEntry.api_key_id, LedgerEntry.model, LedgerEntry.price_id
        )
    )
    price_ids: set[int] = set()
    for request_id, key_id, model, price_id, max_seq, last_reversal, *sums in rows:
        entry = booked.setdefault(request_id, _Booked())
        key = LineKey(key_id, model, price_id)
        entry.tokens[key] = Tokens(*(int(s) for s in sums))
        if last_reversal is not None and int(last_reversal) == int(max_seq):
            entry.closed.add(key)
        entry.max_seq = max(entry.max_seq, int(max_seq))
        if price_id is not None:
            price_ids.add(price_id)
    if price_ids:
        prices = prices_by_id(session, price_ids)
        for entry in booked.values():
            for key in entry.tokens:
                entry.prices[key] = prices.get(key.price_id) if key.price_id else None
    return booked


def target_lines(figures: CallFigures, book: PriceBook) -> list[Line]:
    """The call's billable lines: its attempts grouped by model, each priced at the call's start."""
    by_model: dict[str | None, Tokens] = {}
    for attempt in figures.attempts:
        summed = by_model.get(attempt.model)
        by_model[attempt.model] = attempt.tokens if summed is None else summed + attempt.tokens
    lines = []
    for model, tokens in by_model.items():
        price = book.at(model, figures.started_at)
        key = LineKey(figures.api_key_id, model, price.id if price else None)
        lines.append(Line(key, tokens, price))
    return lines


def call_cost(lines: Sequence[Line]) -> int | None:
    """The call's exact cost in picodollars, or None when any line is unpriced."""
    total = 0
    for line in lines:
        if line.price is None:
            return None
        total += line.price.cost_pusd(line.tokens)
    return total


def reconcile_step(
    session: Session,
    now: datetime,
    settle_after_s: float,
    limit: int,
    *,
    common_in_sql: bool = True,
    pending_before: datetime | None = None,
) -> StepResult:
    """Do one bounded step inside the caller's transaction (the caller commits).

    Returns what was done; ``examined`` is 0 when no call needed work. ``common_in_sql``: see
    ``reconcile_calls``; ``pending_before``: see ``due_calls``.
    """
    request_ids = due_calls(session, now, settle_after_s, limit, pending_before=pending_before)
    return reconcile_calls(session, request_ids, now, settle_after_s, common_in_sql=common_in_sql)


#: Calls per ``IN (…)`` list or array parameter.
_CHUNK = 2000

#: The columns of ``calls`` a step reads: what the rollups placed the call under, and the rest
#: of its state that decides the step's writes.
_STATE_COLUMNS = (
    "request_id",
    "settled",
    "last_received_at",
    "started_at",
    "api_key_id",
    "model",
    "anomalies",
    "cost_pusd",
    "attempts",
    *TOKEN_FIELDS,
)


class _CallState:
    """A call's row as a step reads it (before) or writes it (after); see ``rollups.CallLike``.

    Read back, an open call only carries what the step needs (``rollups.place_call`` reads no
    more of a call that is not settled); ``stored`` holds the raw ``last_received_at`` and the
    identity columns (api key, model, start) as the driver returned them.
    """

    __slots__ = (*_STATE_COLUMNS, "arrival", "settling", "stored")

    request_id: str
    settled: bool
    last_received_at: datetime
    started_at: datetime | None
    api_key_id: str | None
    model: str | None
    anomalies: list[str]
    cost_pusd: int | None
    attempts: int
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens_billed: int
    output_tokens_delivered: int
    output_tokens_undelivered: int
    reasoning_tokens: int
    settling: bool
    stored: tuple[Any, ...]
    #: The last arrival among the call's events (as the driver returns times; see load_events).
    arrival: Any


def _load_states(session: Session, request_ids: Sequence[str]) -> dict[str, _CallState]:
    conn = session.connection()
    postgres = conn.dialect.name == "postgresql"
    states: dict[str, _CallState] = {}
    for start in range(0, len(request_ids), _CHUNK):
        chunk = list(request_ids[start : start + _CHUNK])
        head = (
            "SELECT request_id, settled, attempts, last_received_at, api_key_id, model, "
            "started_at FROM calls WHERE request_id "
        )
        where, params = _in_list(postgres, chunk)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(head + where, params)
            rows = cursor.fetchall()
        finally:
            cursor.close()
        for request_id, settled, attempts, *stored in rows:
            state = _CallState()
            state.request_id = request_id
            state.settled = bool(settled)
            state.attempts = attempts
            state.stored = tuple(stored)
            state.settling = False
            states[request_id] = state
    # A settled call's current figures: what the rollups hold for it (read the typed way).
    settled = [rid for rid, state in states.items() if state.settled]
    columns = [getattr(Call, name) for name in _STATE_COLUMNS]
    for start in range(0, len(settled), _CHUNK):
        chunk = settled[start : start + _CHUNK]
        for row in session.execute(select(*columns).where(Call.request_id.in_(chunk))):
            state = states[row.request_id]
            for name, value in zip(_STATE_COLUMNS, row, strict=True):
                setattr(state, name, value)
    return states


def _new_state(
    old: _CallState, fig: CallFigures, cost: int | None, settle: bool, anomalies: list[str]
) -> _CallState:
    new = _CallState()
    new.request_id = old.request_id
    new.settled = old.settled or settle
    new.settling = settle and not old.settled
    new.stored = old.stored
    new.started_at = fig.started_at
    new.api_key_id = fig.api_key_id
    new.model = fig.model
    new.anomalies = anomalies
    new.cost_pusd = cost
    new.attempts = len(fig.attempts)
    tokens = fig.tokens
    new.input_tokens = tokens.input_tokens
    new.cache_read_input_tokens = tokens.cache_read_input_tokens
    new.cache_creation_input_tokens = tokens.cache_creation_input_tokens
    new.output_tokens_billed = tokens.output_tokens_billed
    new.output_tokens_delivered = tokens.output_tokens_delivered
    new.output_tokens_undelivered = tokens.output_tokens_undelivered
    new.reasoning_tokens = tokens.reasoning_tokens
    return new


def _anomalies(fig: CallFigures, cost: int | None) -> list[str]:
    if cost is None and UNPRICED not in fig.anomalies:
        return sorted({*fig.anomalies, UNPRICED})
    return list(fig.anomalies)


def reconcile_calls(
    session: Session,
    request_ids: Sequence[str],
    now: datetime,
    settle_after_s: float,
    *,
    common_in_sql: bool = True,
) -> StepResult:
    """Recompute, settle and book the given (already locked) calls.

    Set-based: the calls of the common shape are settled by the database
    (``billing.reconcile.common``; not with ``common_in_sql=False``, which gives the same rows
    more slowly); the others are read in a few statements for the whole batch, figured by the
    rule, then written with one statement (or one ``executemany``) per table: the calls, their
    attempts, the ledger entries, the rollups.
    """
    result = StepResult(examined=len(request_ids))
    if not request_ids:
        return result
    deltas = rollups.Deltas()
    if common_in_sql:
        common = settle_common(session, request_ids, now, settle_after_s, deltas)
        if common:
            result.settled += len(common)
            result.settled_ids.extend(common)
            done = set(common)
            request_ids = [rid for rid in request_ids if rid not in done]
            if not request_ids:
                rollups.after_step(session, {}, [], [], deltas)
                return result
    states = _load_states(session, request_ids)
    rolled_up = rollups.before_step(session, states.values())
    arrivals: dict[str, Any] = {}
    events = load_events(session, request_ids, arrivals)
    figures = {rid: reconcile_call(rid, evs) for rid, evs in events.items() if evs}
    for figured in figures.values():
        check_figures(figured)
    models = {a.model for f in figures.values() for a in f.attempts if a.model}
    book = PriceBook.load(session, models)
    booked = _load_booked(session, [rid for rid, state in states.items() if state.settled])
    postgres = session.get_bind().dialect.name == "postgresql"
    cutoff_at = now - timedelta(seconds=settle_after_s)
    # Compared with the stored value as the driver returns it (text on SQLite, in one format).
    cutoff: Any = cutoff_at if postgres else _sqlite_time(cutoff_at)
    entries: list[_Entry] = []
    updates: list[tuple[_CallState, _CallState, CallFigures]] = []
    after: list[_CallState] = []
    for request_id in request_ids:
        call = states[request_id]
        fig = figures.get(request_id)
        if fig is None:
            after.append(call)
            continue
        lines = target_lines(fig, book)
        cost = call_cost(lines)
        # The row's last_received_at is not updated by the later events of a pending call.
        arrival = arrivals.get(request_id)
        if arrival is None or arrival < call.stored[0]:
            arrival = call.stored[0]
        timed_out = arrival <= cutoff
        settle = call.settled or fig.complete or timed_out
        if settle:
            record = booked.get(request_id) or _NOTHING_BOOKED
            reason = SETTLED_COMPLETE if fig.complete else settled_timed_out(settle_after_s)
            planned = plan_entries(
                lines, record.tokens, record.prices, request_id in booked, reason, record.closed
            )
            seq = record.max_seq
            for new in planned:
                seq += 1
                entries.append(_Entry(request_id, seq, new, fig, now))
                if new.kind == "adjustment":
                    result.adjusted += 1
            if not call.settled:
                result.settled += 1
                result.settled_ids.append(request_id)
        state = _new_state(call, fig, cost, settle, _anomalies(fig, cost))
        state.arrival = arrival
        updates.append((call, state, fig))
        after.append(state)
    writer = _PgWriter(session) if postgres else None
    if writer is not None:
        writer.calls(updates, now)
        writer.attempts(updates)
        writer.entries(entries)
    else:
        sqlite = _SqliteWriter(session)
        sqlite.calls(updates, now)
        sqlite.attempts(updates)
        sqlite.entries(entries)
    rollups.after_step(session, rolled_up, after, entries, deltas)
    return result


_NOTHING_BOOKED = _Booked()


class _Entry:
    """A new ledger entry (see ``LedgerEntry``; ``rollups.EntryLike``)."""

    __slots__ = (
        "api_key_id",
        "booked_at",
        "call_started_at",
        "cost_pusd",
        "kind",
        "model",
        "price",
        "protocol",
        "reason",
        "request_id",
        "seq",
        "status",
        "tokens",
        *TOKEN_FIELDS,
    )

    def __init__(
        self, request_id: str, seq: int, new: NewEntry, fig: CallFigures, now: datetime
    ) -> None:
        self.request_id = request_id
        self.seq = seq
        self.kind = new.kind
        self.reason = new.reason
        self.booked_at = now
        self.api_key_id = new.key.api_key_id
        self.model = new.key.model
        self.protocol = fig.protocol
        self.status = fig.status
        self.call_started_at = fig.started_at
        self.price = new.price
        self.cost_pusd = new.cost_pusd
        self.tokens = new.tokens
        tokens = new.tokens
        self.input_tokens = tokens.input_tokens
        self.cache_read_input_tokens = tokens.cache_read_input_tokens
        self.cache_creation_input_tokens = tokens.cache_creation_input_tokens
        self.output_tokens_billed = tokens.output_tokens_billed
        self.output_tokens_delivered = tokens.output_tokens_delivered
        self.output_tokens_undelivered = tokens.output_tokens_undelivered
        self.reasoning_tokens = tokens.reasoning_tokens

    def row(self, booked_at: Any, time: Callable[[datetime | None], Any]) -> tuple[Any, ...]:
        """The values of ``ENTRY_COLUMNS`` (``booked_at`` and times as the driver takes them)."""
        price = self.price
        return (
            self.request_id,
            self.seq,
            self.kind,
            self.reason,
            booked_at,
            self.api_key_id,
            self.model,
            self.protocol,
            self.status,
            time(self.call_started_at),
            *self.tokens.values(),
            price.id if price else None,
            price.input if price else None,
            price.output if price else None,
            price.cache_read if price else None,
            price.cache_creation if price else None,
            self.cost_pusd,
        )


_ATTEMPT_COLUMNS = (
    "request_id",
    "attempt",
    "model",
    "status",
    "usage_source",
    "error_type",
    "stop_reason",
    *TOKEN_FIELDS,
)


def _attempt_rows(updates: Sequence[tuple[_CallState, _CallState, CallFigures]]) -> list[Any]:
    """The ``call_attempts`` rows of the calls with more than one attempt (a call with one
    attempt is its attempt: the ``calls`` row holds its figures; see ``CallAttempt``)."""
    return [
        (
            fig.request_id,
            a.attempt,
            a.model,
            a.status,
            a.usage_source,
            a.error_type,
            a.stop_reason,
            *a.tokens.values(),
        )
        for _old, _new, fig in updates
        if len(fig.attempts) > 1
        for a in fig.attempts
    ]


def _had_attempts(updates: Sequence[tuple[_CallState, _CallState, CallFigures]]) -> list[str]:
    """The calls whose attempts were written by an earlier step (to be replaced)."""
    return [old.request_id for old, _new, _fig in updates if old.attempts > 1]


@functools.lru_cache(maxsize=256)
def _json_list(codes: tuple[str, ...]) -> str:
    return json.dumps(list(codes))


def _json_metadata(metadata: dict[str, str] | None) -> str | None:
    return None if metadata is None else json.dumps(metadata)


def _call_values(
    new: _CallState, fig: CallFigures, now: Any, time: Callable[[datetime | None], Any]
) -> tuple[Any, ...]:
    """The values of ``_CALL_SET`` for one call; ``now`` as the driver takes it."""
    return (
        fig.protocol,
        _json_metadata(fig.metadata),
        time(fig.ended_at),
        fig.status if new.settled else "open",
        new.settled,
        now if new.settling else None,
        fig.usage_source,
        new.attempts,
        new.input_tokens,
        new.cache_read_input_tokens,
        new.cache_creation_input_tokens,
        new.output_tokens_billed,
        new.output_tokens_delivered,
        new.output_tokens_undelivered,
        new.reasoning_tokens,
        new.cost_pusd,
        _json_list(tuple(new.anomalies)),
        fig.error_type,
        fig.stop_reason,
        new.arrival,
    )


#: The columns of ``calls`` every step writes, in the order of ``_call_values``; ``pending`` is
#: cleared too: the row is locked by the step, so nothing arrived for it since its events were
#: read. ``settled_at`` is only set when the call settles now (``COALESCE`` keeps an earlier one).
#: ``last_received_at`` gets the call's last arrival, read from its events (a pending call's row
#: is not updated by its later events): as an open call it waits in the due-call index from then.
_CALL_SET = (
    "protocol",
    "metadata",
    "ended_at",
    "status",
    "settled",
    "settled_at",
    "usage_source",
    "attempts",
    *TOKEN_FIELDS,
    "cost_pusd",
    "anomalies",
    "error_type",
    "stop_reason",
    "last_received_at",
)
_CALL_PG_TYPES = (
    "varchar",
    "text",
    "timestamptz",
    "varchar",
    "bool",
    "timestamptz",
    "varchar",
    "int4",
    *("int8" for _ in TOKEN_FIELDS),
    "int8",
    "text",
    "varchar",
    "varchar",
    "timestamptz",
)
#: The identity columns, written as well where they changed (ingest fills them in from the
#: call's first ``stream.started`` already, so that is rare).
_CALL_IDENTITY = ("api_key_id", "model", "started_at")
#: A reconciled call leaves the pending queue.
_DEQUEUE = "pending = false"


def _sqlite_time(value: datetime | None) -> str | None:
    """``sqlite_text`` that lets None through (for nullable columns)."""
    return None if value is None else cached_sqlite_text(value)


def _same(value: datetime | None) -> datetime | None:
    return value


def _set_clause(name: str, value: str) -> str:
    if name == "settled_at":
        return f"settled_at = COALESCE(calls.settled_at, {value})"
    if name in ("metadata", "anomalies") and value.startswith("u."):
        return f"{name} = {value}::json"
    return f"{name} = {value}"


class _SqliteWriter:
    """The step's writes on SQLite: ``executemany`` of prepared statements (one C loop each)."""

    def __init__(self, session: Session) -> None:
        self.conn = session.connection()

    def calls(
        self, updates: Sequence[tuple[_CallState, _CallState, CallFigures]], now: datetime
    ) -> None:
        # SQLite rewrites the index entries of every column a SET names, even to the same value:
        # the indexed identity columns are only named for the calls where they changed.
        plain: list[tuple[Any, ...]] = []
        changed: list[tuple[Any, ...]] = []
        now_text = _sqlite_time(now)
        for old, new, fig in updates:
            values = _call_values(new, fig, now_text, _sqlite_time)
            identity = (new.api_key_id, new.model, _sqlite_time(new.started_at))
            if old.stored[1:] == identity:
                plain.append((*values, new.request_id))
            else:
                changed.append((*values, *identity, new.request_id))
        sets = ", ".join(_set_clause(name, "?") for name in _CALL_SET)
        if plain:
            self.conn.exec_driver_sql(
                f"UPDATE calls SET {sets}, {_DEQUEUE} WHERE request_id = ?", plain
            )
        if changed:
            more = ", ".join(f"{name} = ?" for name in _CALL_IDENTITY)
            self.conn.exec_driver_sql(
                f"UPDATE calls SET {sets}, {more}, {_DEQUEUE} WHERE request_id = ?", changed
            )

    def attempts(self, updates: Sequence[tuple[_CallState, _CallState, CallFigures]]) -> None:
        stale = _had_attempts(updates)
        for start in range(0, len(stale), _CHUNK):
            chunk = stale[start : start + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            self.conn.exec_driver_sql(
                f"DELETE FROM call_attempts WHERE request_id IN ({marks})", tuple(chunk)
            )
        rows = _attempt_rows(updates)
        if rows:
            marks = ", ".join("?" * len(_ATTEMPT_COLUMNS))
            self.conn.exec_driver_sql(
                f"INSERT INTO call_attempts ({', '.join(_ATTEMPT_COLUMNS)}) VALUES ({marks})",
                rows,
            )

    def entries(self, entries: Sequence[_Entry]) -> None:
        if not entries:
            return
        marks = ", ".join("?" * len(ENTRY_COLUMNS))
        # Every entry of a step is booked at the step's clock.
        booked = {at: _sqlite_time(at) for at in {entry.booked_at for entry in entries}}
        self.conn.exec_driver_sql(
            f"INSERT INTO ledger_entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({marks})",
            [entry.row(booked.get(entry.booked_at), _sqlite_time) for entry in entries],
        )


def _unnest(types: Sequence[str], names: Sequence[str]) -> str:
    arrays = ", ".join(f"%b::{t}[]" for t in types)
    return f"unnest({arrays}) AS u({', '.join(names)})"


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> tuple[list[Any], ...]:
    return tuple(list(column) for column in zip(*rows, strict=True)) if rows else ([],) * width


class _PgWriter:
    """The step's writes on PostgreSQL: one statement per table, so a step of thousands of calls
    is a handful of round trips: the ``calls`` UPDATE takes its rows as arrays (``unnest``), the
    attempts and ledger entries are inserted with ``COPY``."""

    def __init__(self, session: Session) -> None:
        self.conn = session.connection()

    def calls(
        self, updates: Sequence[tuple[_CallState, _CallState, CallFigures]], now: datetime
    ) -> None:
        if not updates:
            return
        rows = [
            (
                *_call_values(new, fig, now, _same),
                new.api_key_id,
                new.model,
                new.started_at,
                new.request_id,
            )
            for _old, new, fig in updates
        ]
        names = (*_CALL_SET, *_CALL_IDENTITY, "request_id")
        types = (*_CALL_PG_TYPES, "varchar", "varchar", "timestamptz", "varchar")
        sets = ", ".join(_set_clause(name, f"u.{name}") for name in names[:-1])
        self.conn.exec_driver_sql(
            f"UPDATE calls SET {sets}, {_DEQUEUE} FROM {_unnest(types, names)} "
            "WHERE calls.request_id = u.request_id",
            _columns(rows, len(names)),
        )

    def attempts(self, updates: Sequence[tuple[_CallState, _CallState, CallFigures]]) -> None:
        stale = _had_attempts(updates)
        if stale:
            self.conn.exec_driver_sql(
                "DELETE FROM call_attempts WHERE request_id = ANY(%b::varchar[])", (stale,)
            )
        self._copy("call_attempts", _ATTEMPT_COLUMNS, _attempt_rows(updates))

    def entries(self, entries: Sequence[_Entry]) -> None:
        rows = [entry.row(entry.booked_at, _same) for entry in entries]
        rows.sort(key=operator.itemgetter(0, 1))  # by request_id, seq
        self._copy("ledger_entries", ENTRY_COLUMNS, rows)

    def _copy(self, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` with ``COPY … FROM STDIN``: psycopg formats each row in C, where an
        ``unnest`` of arrays builds every array in Python (about twice the CPU a step)."""
        if not rows:
            return
        cursor = self.conn.connection.cursor()
        try:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        finally:
            cursor.close()


def preview_call(session: Session, call: Call) -> None:
    """Put the call's provisional figures (from its events, not yet reconciled) on ``call``.

    For reading only: the caller must not commit the session afterwards.
    """
    events = load_events(session, [call.request_id])[call.request_id]
    if not events:
        return
    fig = reconcile_call(call.request_id, events)
    check_figures(fig)
    models = {a.model for a in fig.attempts if a.model}
    lines = target_lines(fig, PriceBook.load(session, models))
    _apply(call, fig, call_cost(lines), call.settled, call.settled_at or datetime.now(UTC))


def _apply(call: Call, fig: CallFigures, cost: int | None, settle: bool, now: datetime) -> None:
    call.api_key_id = fig.api_key_id
    call.model = fig.model
    call.protocol = fig.protocol
    call.metadata_ = fig.metadata
    call.started_at = fig.started_at
    call.ended_at = fig.ended_at
    call.status = fig.status if settle else "open"
    if settle and not call.settled:
        call.settled = True
        call.settled_at = now
    call.usage_source = fig.usage_source
    call.attempts = len(fig.attempts)
    for name, value in fig.tokens.as_dict().items():
        setattr(call, name, value)
    call.cost_pusd = cost
    call.anomalies = _anomalies(fig, cost)
    call.error_type = fig.error_type
    call.stop_reason = fig.stop_reason
    call.pending = False


def mark_model_pending(session: Session, model: str, effective_from: datetime) -> int:
    """Mark the calls of ``model`` started at or after ``effective_from`` for re-reconciliation
    (a new price may now apply to them). Returns how many calls were marked."""
    # An attempt is priced by its own model, which may differ from the call's (a fallback model);
    # a call with one attempt has no attempt row: its attempt's model is the call's.
    with_attempt = select(CallAttempt.request_id).where(CallAttempt.model == model)
    marked = session.execute(
        update(Call)
        .where(
            or_(Call.model == model, Call.request_id.in_(with_attempt)),
            Call.started_at >= effective_from,
        )
        .values(pending=True, change_seq=Call.change_seq + 1)
    )
    return int(getattr(marked, "rowcount", 0) or 0)


def lock_call(session: Session, request_id: str) -> bool:
    """Lock one call's row for this transaction; False when another reconciler holds it."""
    query = (
        select(Call.request_id)
        .where(Call.request_id == request_id)
        .with_for_update(skip_locked=True)
    )
    return session.scalar(query) is not None
