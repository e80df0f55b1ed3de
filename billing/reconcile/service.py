"""Reconciliation steps against the database: recompute pending calls, settle, write the ledger.

One step handles a bounded batch of calls in one transaction: it locks their rows (``FOR UPDATE
SKIP LOCKED`` on PostgreSQL, so two servers never work on the same call; SQLite has one writer at a
time), recomputes their figures from the events with the pure rule, books the difference in the
ledger, and clears ``pending``. Source: CONTRACT "Reconciliation" and "Cost".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import TypeAdapter
from sqlalchemy import case, delete, func, or_, select, update
from sqlalchemy.orm import Session

from billing.calllog import rollups
from billing.ingest.schemas import Event as EventModel
from billing.pricing.prices import PriceBook, PriceRow, prices_by_id
from billing.reconcile.ledger import REVERSAL_PREFIX, Line, LineKey, NewEntry, plan_entries
from billing.reconcile.rule import TOKEN_FIELDS, UNPRICED, CallFigures, Tokens, reconcile_call
from billing.storage.models import Call, CallAttempt, Event, LedgerEntry

_event_adapter: TypeAdapter[EventModel] = TypeAdapter(EventModel)


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
    session: Session, now: datetime, settle_after_s: float, limit: int, *, lock: bool = True
) -> list[str]:
    """Lock and return up to ``limit`` calls that need work: pending ones, and open ones whose
    last event arrived ``settle_after_s`` seconds ago or earlier. Rows locked by another
    reconciler are skipped. With ``lock=False`` the rows are only listed (a read transaction)."""
    cutoff = now - timedelta(seconds=settle_after_s)
    query = (
        select(Call.request_id)
        .where(
            or_(
                Call.pending.is_(True),
                (Call.settled.is_(False)) & (Call.last_received_at <= cutoff),
            )
        )
        .order_by(Call.last_received_at, Call.request_id)
        .limit(limit)
    )
    if lock:
        query = query.with_for_update(skip_locked=True)
    return list(session.scalars(query))


def load_events(session: Session, request_ids: Sequence[str]) -> dict[str, list[EventModel]]:
    """Every stored event of the given calls, parsed back into event models, in arrival order."""
    events: dict[str, list[EventModel]] = {rid: [] for rid in request_ids}
    rows = session.execute(
        select(Event.request_id, Event.body)
        .where(Event.request_id.in_(request_ids))
        .order_by(Event.seq)
    )
    for request_id, body in rows:
        events[request_id].append(_event_adapter.validate_json(body))
    return events


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
        by_model[attempt.model] = by_model.get(attempt.model, Tokens()) + attempt.tokens
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
    session: Session, now: datetime, settle_after_s: float, limit: int
) -> StepResult:
    """Do one bounded step inside the caller's transaction (the caller commits).

    Returns what was done; ``examined`` is 0 when no call needed work.
    """
    request_ids = due_calls(session, now, settle_after_s, limit)
    return reconcile_calls(session, request_ids, now, settle_after_s)


def reconcile_calls(
    session: Session, request_ids: Sequence[str], now: datetime, settle_after_s: float
) -> StepResult:
    """Recompute, settle and book the given (already locked) calls."""
    result = StepResult(examined=len(request_ids))
    if not request_ids:
        return result
    calls = {
        c.request_id: c
        for c in session.scalars(select(Call).where(Call.request_id.in_(request_ids)))
    }
    rolled_up = rollups.before_step(session, calls.values())
    events = load_events(session, request_ids)
    figures = {rid: reconcile_call(rid, evs) for rid, evs in events.items() if evs}
    models = {a.model for f in figures.values() for a in f.attempts if a.model}
    book = PriceBook.load(session, models)
    booked = _load_booked(session, request_ids)
    cutoff = now - timedelta(seconds=settle_after_s)
    entries: list[LedgerEntry] = []
    for request_id in request_ids:
        call = calls[request_id]
        fig = figures.get(request_id)
        if fig is None:
            continue
        lines = target_lines(fig, book)
        cost = call_cost(lines)
        timed_out = call.last_received_at <= cutoff
        settle = call.settled or fig.complete or timed_out
        if settle:
            record = booked.get(request_id, _Booked())
            reason = (
                "settled: upstream usage for every attempt"
                if fig.complete
                else f"settled: no event for {settle_after_s:g} s"
            )
            planned = plan_entries(
                lines, record.tokens, record.prices, request_id in booked, reason, record.closed
            )
            seq = record.max_seq
            for new in planned:
                seq += 1
                entries.append(_entry(request_id, seq, new, fig, now))
                if new.kind == "adjustment":
                    result.adjusted += 1
            if not call.settled:
                result.settled += 1
                result.settled_ids.append(request_id)
        _apply(call, fig, cost, settle, now)
        _write_attempts(session, fig)
    session.add_all(entries)
    session.flush()
    rollups.after_step(session, rolled_up, calls.values(), entries)
    return result


def _entry(
    request_id: str, seq: int, new: NewEntry, fig: CallFigures, now: datetime
) -> LedgerEntry:
    price = new.price
    return LedgerEntry(
        request_id=request_id,
        seq=seq,
        kind=new.kind,
        reason=new.reason,
        booked_at=now,
        api_key_id=new.key.api_key_id,
        model=new.key.model,
        protocol=fig.protocol,
        status=fig.status,
        call_started_at=fig.started_at,
        **new.tokens.as_dict(),
        price_id=price.id if price else None,
        input_uusd_per_mtok=price.input if price else None,
        output_uusd_per_mtok=price.output if price else None,
        cache_read_uusd_per_mtok=price.cache_read if price else None,
        cache_creation_uusd_per_mtok=price.cache_creation if price else None,
        cost_pusd=new.cost_pusd,
    )


def preview_call(session: Session, call: Call) -> None:
    """Put the call's provisional figures (from its events, not yet reconciled) on ``call``.

    For reading only: the caller must not commit the session afterwards.
    """
    events = load_events(session, [call.request_id])[call.request_id]
    if not events:
        return
    fig = reconcile_call(call.request_id, events)
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
    anomalies = set(fig.anomalies)
    if cost is None:
        anomalies.add(UNPRICED)
    call.anomalies = sorted(anomalies)
    call.error_type = fig.error_type
    call.stop_reason = fig.stop_reason
    # The row is locked by this step, so nothing arrived for it since we read its events.
    call.pending = False


def _write_attempts(session: Session, fig: CallFigures) -> None:
    session.execute(delete(CallAttempt).where(CallAttempt.request_id == fig.request_id))
    session.add_all(
        CallAttempt(
            request_id=fig.request_id,
            attempt=a.attempt,
            model=a.model,
            status=a.status,
            usage_source=a.usage_source,
            error_type=a.error_type,
            stop_reason=a.stop_reason,
            **a.tokens.as_dict(),
        )
        for a in fig.attempts
    )


def mark_model_pending(session: Session, model: str, effective_from: datetime) -> int:
    """Mark the calls of ``model`` started at or after ``effective_from`` for re-reconciliation
    (a new price may now apply to them). Returns how many calls were marked."""
    # An attempt is priced by its own model, which may differ from the call's (a fallback model).
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
