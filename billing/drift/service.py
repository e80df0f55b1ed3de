"""The drift: our calls against the providers' reports (CONTRACT "Provider reports and drift").

``drift_rows`` is the one answer of ``GET /v1/drift``, ``GET /v1/exports/drift.csv``,
``billing drift`` and the console's drift page.

- **Ours**: the calls by their start (UTC), not by booking, so that a late settlement still
  lands in the provider's bucket; each with its current figures (a settled call's equal its
  ledger entries; an open call's are provisional): ``requests`` = upstream attempts,
  ``input_tokens`` (no cache), ``cache_read_input_tokens``, ``cache_creation_input_tokens``,
  ``output_tokens`` = billed output, ``cost_usd`` from ``/v1/prices``: null when a settled call
  of the group is unpriced (never silently free, as in ``/v1/usage``), and so is its delta,
  which then plays no part in the status.
- **Theirs**: the current version of every stored report bucket starting in the period, in the
  same semantics (``billing.providers.schemas``: OpenAI's cached tokens taken out of its input,
  Anthropic's cents made dollars). A slot's figures come from its finest complete buckets: for
  a day, daily buckets where the day has them, else its hourly (or minute) ones; for an hour,
  buckets of an hour or less (a daily bucket cannot be split).
- The served tier of ours is the one the upstream said it served (``calls.service_tier``, CONTRACT
  "Usage dimensions (v2)"); a call whose upstream named none is under none.
- ``delta`` = theirs − ours per field, ``delta_pct`` = delta / ours × 100 (null when ours is 0
  and theirs is not); ``status``: ``missing_ours`` (the provider billed a group we have no
  calls for), ``missing_theirs`` (no report line for a group we have calls in), else ``match``
  when every figure the report gives is within ``tolerance_pct`` of ours, else ``drift``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from sqlalchemy.orm import Session

from billing.calllog import cursor
from billing.calllog.cursor import Position
from billing.drift.repository import repository as drift_repository
from billing.drift.rows import CallCosts
from billing.drift.schemas import (
    FIELDS,
    MAX_CALLS_LIMIT,
    STATUSES,
    CallDriftQuery,
    DriftQuery,
)
from billing.money import format_usd, pusd_to_decimal
from billing.paging import cut_page
from billing.providers.repository import repository as providers_repository
from billing.providers.rows import CurrentLine
from billing.timefmt import rfc3339

_TOKEN_FIELDS = FIELDS[:-1]
_WIDTH = {"day": timedelta(days=1), "hour": timedelta(hours=1)}
_PCT_PLACES = Decimal("0.0001")


@dataclass
class _Side:
    """One side's sums for a group; a figure stays None until a line gives it."""

    figures: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(FIELDS))
    #: Settled calls without a cost (ours only): the side's cost is then unknown.
    unpriced: int = 0

    def add(self, name: str, value: Any) -> None:
        if value is not None:
            current = self.figures[name]
            self.figures[name] = value if current is None else current + value


def _slot(at: datetime, grain: str) -> datetime:
    at = at.astimezone(UTC)
    if grain == "day":
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    return at.replace(minute=0, second=0, microsecond=0)


def _ours_slot(text: str) -> datetime:
    # "YYYY-MM-DD" or "YYYY-MM-DD HH" (billing.drift.repository.OursRow)
    if len(text) == 10:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    return datetime.fromisoformat(f"{text}:00").replace(tzinfo=UTC)


def _finest_complete(lines: Iterable[CurrentLine], grain: str) -> list[tuple[datetime, Any]]:
    """The lines that count for each slot (see the module docstring), with their slot."""
    width = _WIDTH[grain]
    usable = [(line, _slot(line.start, grain)) for line in lines if line.end - line.start <= width]
    widest: dict[tuple[str, str, datetime], timedelta] = {}
    for line, slot in usable:
        key = (line.provider, line.kind, slot)
        widest[key] = max(widest.get(key, timedelta(0)), line.end - line.start)
    return [
        (slot, line)
        for line, slot in usable
        if line.end - line.start == widest[(line.provider, line.kind, slot)]
    ]


def _key(query: DriftQuery, values: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(values[name] for name in query.keys)


def _pct(delta: Any, ours: Any) -> str | None:
    """delta / ours × 100 to 4 decimal places (half to even), as plain decimal text."""
    if delta is None:
        return None
    if ours == 0:
        return "0" if delta == 0 else None
    if delta == 0:
        return "0"
    if isinstance(delta, int) and isinstance(ours, int):
        # Counts: integer arithmetic (a row has a dozen of these, a month thousands of rows).
        quotient, remainder = divmod(delta * 1_000_000, ours)
        twice = 2 * remainder
        if twice > ours or (twice == ours and quotient % 2):
            quotient += 1
        return format_usd(Decimal(quotient).scaleb(-4))
    return format_usd((Decimal(delta) * 100 / Decimal(ours)).quantize(_PCT_PLACES, ROUND_HALF_EVEN))


def _within(delta: Any, ours: Any, tolerance_pct: Decimal) -> bool:
    return abs(Decimal(delta)) * 100 <= tolerance_pct * abs(Decimal(ours))


def _row(
    query: DriftQuery, key: tuple[Any, ...], ours: _Side | None, theirs: _Side | None
) -> dict[str, Any]:
    our = ours.figures if ours else {**dict.fromkeys(_TOKEN_FIELDS, 0), "cost_usd": Decimal(0)}
    for name in FIELDS:
        if our[name] is None:
            our[name] = Decimal(0) if name == "cost_usd" else 0
    if ours is not None and ours.unpriced:
        our["cost_usd"] = None
    their: dict[str, Any] = theirs.figures if theirs else dict.fromkeys(FIELDS)
    delta = {
        name: None if their[name] is None or our[name] is None else their[name] - our[name]
        for name in FIELDS
    }
    if theirs is None:
        status = "missing_theirs"
    elif ours is None:
        status = "missing_ours"
    elif all(
        delta[name] is None or _within(delta[name], our[name], query.tolerance_pct)
        for name in FIELDS
    ):
        status = "match"
    else:
        status = "drift"

    def shown(figures: dict[str, Any]) -> dict[str, Any]:
        cost = figures["cost_usd"]
        return {**figures, "cost_usd": None if cost is None else format_usd(cost)}

    row: dict[str, Any] = dict(zip(query.keys, key, strict=True))
    for name in ("day", "hour"):
        if name in row:
            slot: datetime = row[name]
            row[name] = slot.strftime("%Y-%m-%d" if name == "day" else "%Y-%m-%dT%H:00:00Z")
    row["ours"] = shown(our)
    row["theirs"] = shown(their)
    row["delta"] = shown(delta)
    row["delta_pct"] = {name: _pct(delta[name], our[name]) for name in FIELDS}
    row["status"] = status
    return row


def _order(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[Any, ...]:
    return (STATUSES.index(row["status"]), *("" if row[k] is None else row[k] for k in keys))


def _add_tokens(
    sides: dict[tuple[Any, ...], _Side], query: DriftQuery, slot: Any, source: Any
) -> _Side:
    """The side of ``sides`` that ``source`` falls in (a row of ours or a provider's line, with
    its ``provider``, ``model``, ``upstream_account``, ``service_tier`` and token buckets; in
    the time ``slot`` of ``query.grain``), made if new, its tokens added to it."""
    values = {
        "provider": source.provider,
        query.grain: slot,
        "model": source.model,
        "upstream_account": source.upstream_account,
        "service_tier": source.service_tier,
    }
    side = sides.setdefault(_key(query, values), _Side())
    for name in _TOKEN_FIELDS:
        side.add(name, getattr(source, name))
    return side


def drift_rows(session: Session, query: DriftQuery) -> list[dict[str, Any]]:
    """The drift rows of ``query`` as JSON-ready dicts (``billing.drift.schemas.DriftRow``),
    mismatches first (``drift``, ``missing_ours``, ``missing_theirs``, ``match``), then by the
    group keys. Read-only."""
    providers = providers_repository(session)
    grain = query.grain
    ours: dict[tuple[Any, ...], _Side] = {}
    for row in drift_repository(session).ours(
        session, query.since, query.until, query.provider, grain
    ):
        side = _add_tokens(ours, query, _ours_slot(row.slot), row)
        side.add("cost_usd", pusd_to_decimal(row.cost_pusd))
        side.unpriced += row.unpriced
    theirs: dict[tuple[Any, ...], _Side] = {}
    lines = providers.current_lines(session, query.provider, query.since, query.until)
    for slot, line in _finest_complete(lines, grain):
        side = _add_tokens(theirs, query, slot, line)
        if line.cost_usd is not None:
            side.add("cost_usd", Decimal(line.cost_usd))
    rows = [_row(query, key, ours.get(key), theirs.get(key)) for key in {**ours, **theirs}]
    rows.sort(key=lambda r: _order(r, query.keys))
    return rows


def _call_row(call: CallCosts, tolerance_pct: Decimal) -> dict[str, Any]:
    theirs = pusd_to_decimal(call.provider_cost_pusd)
    ours = None if call.cost_pusd is None else pusd_to_decimal(call.cost_pusd)
    if ours is None:
        delta, pct, status = None, None, "missing_ours"
    else:
        delta = theirs - ours
        pct = _pct(delta, ours)
        status = "match" if _within(delta, ours, tolerance_pct) else "drift"
    return {
        "request_id": call.request_id,
        "started_at": rfc3339(call.started_at),
        "provider": call.provider,
        "model": call.model,
        "api_key_id": call.api_key_id,
        "upstream_account": call.upstream_account,
        "settled": call.settled,
        "ours": None if ours is None else format_usd(ours),
        "theirs": format_usd(theirs),
        "delta": None if delta is None else format_usd(delta),
        "delta_pct": pct,
        "status": status,
    }


def call_drift(session: Session, query: CallDriftQuery) -> dict[str, Any]:
    """``GET /v1/drift/calls`` (CONTRACT "Non-streaming calls, hosted-tool fees,
    provider-reported cost (v3)": "drift shows per call where they differ"): one page of the
    calls started in the period whose provider reported a cost (``provider_cost_usd``) that
    is not ours (an unpriced call's included, ``missing_ours``), newest first, each with
    ours, theirs, delta, delta_pct and its status by ``tolerance_pct`` (as ``/v1/drift``'s
    rows: ``delta`` = theirs − ours, ``delta_pct`` = delta / ours × 100). A call whose two
    figures are equal is not listed. Not in the contract's shapes yet (its section names only
    the per-call drift): ``{"data": [row, …], "next_cursor": …}``, ``CallDriftRow``."""
    after = query.after
    before = None
    if after is not None and after.started_at is not None:
        before = (after.started_at, after.request_id)
    found = drift_repository(session).differing_calls(
        session, query.since, query.until, query.provider, before, query.limit + 1
    )
    page, last = cut_page(found, query.limit)
    next_cursor = (
        None
        if last is None
        else cursor.encode(Position(last.started_at, last.request_id), query.scope)
    )
    return {
        "data": [_call_row(call, query.tolerance_pct) for call in page],
        "next_cursor": next_cursor,
    }


def every_call_drift(session: Session, query: CallDriftQuery) -> list[dict[str, Any]]:
    """Every page of ``call_drift`` for ``query`` (from its cursor on), in order
    (``billing drift --calls``), read ``MAX_CALLS_LIMIT`` a statement."""
    rows: list[dict[str, Any]] = []
    query = replace(query, limit=MAX_CALLS_LIMIT)
    while True:
        page = call_drift(session, query)
        rows += page["data"]
        if page["next_cursor"] is None:
            return rows
        query = replace(query, after=cursor.decode(page["next_cursor"], query.scope))
