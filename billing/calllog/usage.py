"""``GET /v1/usage``: usage totals over a period, grouped, in a time zone, on either basis.

Source: CONTRACT "Call log and usage queries". Decisions where the contract is silent:

- ``since`` and ``until`` are required (RFC 3339 with an offset); the period is half-open,
  ``since <= t < until``, ``t`` being the call's start (``call_start``) or the entry's booking time
  (``booked``). A period cut off by ``since``/``until`` in the middle of a local hour, day or month
  is still labelled with that hour, day or month.
- ``cost_usd`` is an exact decimal string. On ``call_start`` it is null when any call of the row
  has no price (never silently free: an unpriced call's cost is unknown, not 0); once the model is
  priced, the calls are re-priced and the row's cost appears. On ``booked`` it is the sum of the
  priced entries' costs, null when no entry of the row has a price: what the ledger, and so the
  CSV export, holds for the period (a later pricing is booked as adjustments in its own period).
- On ``call_start`` a row's model is the call's model (its first ``stream.started``); on
  ``booked`` it is the ledger line's model. A call without ``stream.started`` counts under a null
  key and model.
- Rows are ordered by the group-by keys in the order given: hours, days and months by time,
  ``api_key_id`` and ``model`` by text with null first (as the CSV export). Empty groups (no call,
  or no ledger entry) are left out.

Reads the rollups (``billing.rollups``): each local period is covered by the coarsest UTC
buckets that fit in it (``billing.rollups.buckets.cover``); only a ``since``/``until`` off a
15-minute edge leaves a remainder of under 15 minutes, read from ``calls``/``ledger_entries`` by
their time index. (v2) Units are summed from the calls or entries of the period that have any
(partial indexes of each by time and by key, of calls also by model), placed in their segment and
group as the rollups place them.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from billing.calllog import buckets
from billing.calllog.buckets import Segment
from billing.calllog.params import UNTIL_AFTER_SINCE, QueryReader, parse_timestamp, parse_zone
from billing.calllog.repository import repository
from billing.calllog.rows import RollupSlice
from billing.dimensions import TOKEN_FIELDS
from billing.errors import FieldError, ValidationFailed
from billing.fields import in_range
from billing.money import pusd_to_str
from billing.rollups.buckets import Run, Window, cover
from billing.rollups.rows import BASES, CALL_START, COUNT_FIELDS, PICO
from billing.rollups.service import Placed, Totals, place_call, place_entry
from billing.storage.models import Call, LedgerEntry

UTC_ZONE = ZoneInfo("UTC")
#: The text dimensions a query may group by (v2: the customer charged).
TEXT_DIMS = ("api_key_id", "model", "customer_id")
GROUP_BY = (*TEXT_DIMS, *buckets.TIME_DIMS)
PARAMETERS = ("since", "until", "api_key_id", "model", "customer_id", "group_by", "tz", "basis")
#: The totals of a row, in the contract's order (after the group-by keys).
TOTAL_FIELDS = ("calls", *TOKEN_FIELDS, "cost_usd")
#: The most local periods one query may return (an hour by hour year is 8,760).
MAX_PERIODS = 20_000
#: Rollup runs per statement.
_RUNS_PER_QUERY = 2000
#: Raw windows per statement (see ``_read_raw``).
_WINDOWS_PER_QUERY = 100


@dataclass(frozen=True)
class UsageQuery:
    """A validated usage query; ``group_by`` holds names from ``GROUP_BY`` without repeats."""

    since: datetime
    until: datetime
    api_key_id: str | None = None
    model: str | None = None
    group_by: tuple[str, ...] = ()
    tz: ZoneInfo = UTC_ZONE
    basis: str = CALL_START
    #: (v2) Only what is charged to this customer.
    customer_id: str | None = None
    #: (v3, the console's pages; not a parameter of the API) Only these keys, or these
    #: customers, when not None: the figures of one page of keys or customers.
    api_key_ids: tuple[str, ...] | None = None
    customer_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.since.tzinfo is None or self.until.tzinfo is None:
            raise ValueError("since and until must be timezone-aware")
        if self.until <= self.since:
            raise ValueError("until must be after since")
        if not set(self.group_by) <= set(GROUP_BY) or len(set(self.group_by)) < len(self.group_by):
            raise ValueError(f"group_by takes each of {', '.join(GROUP_BY)} at most once")
        if self.basis not in BASES:
            raise ValueError(f"basis is one of {', '.join(BASES)}")


@dataclass(frozen=True)
class UsageRow:
    """One group: its keys (``group``, in ``group_by`` order), call count, tokens and cost."""

    group: tuple[tuple[str, str | None], ...]
    calls: int
    tokens: dict[str, int]
    cost_pusd: int | None
    #: (v2) Unit name → count summed over the group (CONTRACT "Usage dimensions (v2)").
    units: dict[str, int] = field(default_factory=dict)
    #: (v2) The charge in picodollars (CONTRACT "Keys, customers and plans (v2)"), null as the
    #: cost is (a contribution without a charge).
    charge_pusd: int | None = None
    #: (v3) The cost that charge policies for failed calls left uncharged, in picodollars
    #: (CONTRACT "Charge policy for failed calls (v3)"), null as the cost is.
    leakage_pusd: int | None = None
    #: (v3) The calls (``call_start``) or entries (``booked``) of the group without a cost:
    #: why ``cost_usd`` is null (the console's Overview counts them; not in ``as_json``).
    unpriced: int = 0

    def as_json(self) -> dict[str, Any]:
        """The contract's row: group-by keys, then ``TOTAL_FIELDS``, ``charge_usd``, ``units``."""
        return {
            **dict(self.group),
            "calls": self.calls,
            **self.tokens,
            "cost_usd": pusd_to_str(self.cost_pusd),
            "charge_usd": pusd_to_str(self.charge_pusd),
            "leakage_usd": pusd_to_str(self.leakage_pusd),
            "units": self.units,
        }


def parse_group_by(text: str) -> tuple[str, ...]:
    """``"day,api_key_id"`` → ``("day", "api_key_id")``; ``ValueError`` in words."""
    names = tuple(part.strip() for part in text.split(","))
    unknown = [name for name in names if name not in GROUP_BY]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} cannot be grouped by; use a comma list of "
            f"{', '.join(GROUP_BY)}"
        )
    if len(set(names)) != len(names):
        raise ValueError("names a key more than once; name each once")
    return names


_SINCE = "the period's start (inclusive) with an offset, such as 2026-03-01T00:00:00Z"
_UNTIL = "the period's end (exclusive) with an offset, such as 2026-04-01T00:00:00Z"


def _period_edge(text: str) -> datetime:
    return in_range(parse_timestamp(text))


def parse_usage_query(items: Iterable[tuple[str, str]]) -> UsageQuery:
    """The query string's (name, value) pairs → ``UsageQuery``; ``ValidationFailed`` (422) lists
    every unknown, repeated, missing or malformed parameter."""
    reader = QueryReader(items, PARAMETERS)
    since = reader.parsed("since", _period_edge, required=_SINCE)
    until = reader.parsed("until", _period_edge, required=_UNTIL)
    api_key_id = reader.text("api_key_id", 128)
    model = reader.text("model")
    customer_id = reader.text("customer_id", 128)
    group_by = reader.parsed("group_by", parse_group_by) or ()
    tz = reader.parsed("tz", parse_zone) or UTC_ZONE
    basis = reader.choice("basis", BASES) or CALL_START
    if since is not None and until is not None and until <= since:
        reader.fail("until", UNTIL_AFTER_SINCE)
    reader.done()
    assert since is not None and until is not None
    return UsageQuery(since, until, api_key_id, model, group_by, tz, basis, customer_id)


def usage_rows(
    session: Session, query: UsageQuery, units: Sequence[Any] | None = None
) -> list[UsageRow]:
    """The usage totals of ``query``, one row per non-empty group, in order (see the module).

    Each ``UsageRow`` holds its group-by keys (labels from ``billing.calllog.buckets.label``),
    the call count, token totals and cost in picodollars. ``basis="booked"`` is what the
    ``usage.csv`` export holds for the same period (the export sums the ledger itself; tests
    compare the two), but for ``hour`` groups across an offset change that is not a whole hour
    (Australia/Lord_Howe, Pacific/Chatham, Antarctica/Casey), where the two still cut hours
    differently. Raises ``ValidationFailed`` (422) when the grouping would make more than
    ``MAX_PERIODS`` periods; database errors come as SQLAlchemy's. ``units``: ``query``'s
    ``units_of`` when the caller read them already (the Overview's groupings of one period
    share them), else read here.
    """
    dims = [name for name in query.group_by if name in TEXT_DIMS]
    times = [name for name in query.group_by if name in buckets.TIME_DIMS]
    finest = min(times, key=buckets.TIME_DIMS.index) if times else None
    _check_size(query, finest)
    segments = buckets.segments(finest, query.since, query.until, query.tz)
    runs, windows = cover([(s.start, s.end) for s in segments])
    groups = _Groups(dims)
    _read_rollups(session, query, runs, dims, groups)
    starts = [s.start for s in segments]
    for placed in _read_raw(session, query, windows):
        named = {
            "api_key_id": placed.api_key_id,
            "model": placed.model,
            "customer_id": placed.customer_id,
        }
        groups.add(
            bisect_right(starts, placed.at) - 1, tuple(named[d] for d in dims), placed.totals
        )
    for at, key, model, text, customer in units_of(session, query) if units is None else units:
        named = {"api_key_id": key or None, "model": model or None, "customer_id": customer}
        groups.add_units(
            bisect_right(starts, at) - 1, tuple(named[d] for d in dims), _units_of(text)
        )
    return groups.rows(query, segments, times)


def units_of(session: Session, query: UsageQuery) -> list[Any]:
    """``CalllogRepository.units_in``'s rows for ``query``'s basis, period and filters (its
    grouping is not used): ``(at, api_key_id, model, units, customer_id)``."""
    return repository(session).units_in(
        session,
        query.basis,
        query.since,
        query.until,
        query.api_key_id,
        query.model,
        query.customer_id,
    )


def usage_top(
    session: Session,
    query: UsageQuery,
    dim: str,
    limit: int,
    units: Sequence[Any] | None = None,
) -> list[UsageRow]:
    """(v3, the console's Overview) The rows of ``query`` grouped by ``dim`` (a ``TEXT_DIMS``
    name; ``query``'s own grouping and filters are not used) for the ``limit`` values with the
    greatest ``call_start`` cost, and any other value that could be among them: ranked by the
    rollups in one statement (``CalllogRepository.rollup_ranking``: floating point, so that the
    caller sorts the exact figures again), then the values of the minutes off the 15-minute
    grid (which the rollups do not hold) whose cost there could lift them into the ``limit``.
    Each row's figures are ``usage_rows``' exactly: the rollup sums, the calls of the minutes
    off the grid and the units (``units``: ``units_of`` the unfiltered ``call_start`` period,
    when the caller read them already)."""
    grouped = UsageQuery(query.since, query.until, group_by=(dim,), tz=query.tz)
    segments = buckets.segments(None, grouped.since, grouped.until, grouped.tz)
    runs, windows = cover([(s.start, s.end) for s in segments])
    rows = RollupSlice(dim != "model", grouped.basis, None, None, (dim,))
    store = repository(session)
    groups = _Groups((dim,))
    inner: dict[str | None, int] = {}  # the ranked values' rollup cost
    # One segment: its cover is a few runs per level (the coarsest buckets that fit).
    for value, *sums in store.rollup_ranking(session, runs, rows, limit):
        totals = _rollup_totals(sums)
        inner[value or None] = totals.cost_pusd
        groups.add(0, (value or None,), totals)
    placed_off_grid = _read_raw(session, grouped, windows)
    edge: dict[str | None, int] = {}  # every value's cost off the grid
    for placed in placed_off_grid:
        value = _named(placed.api_key_id, placed.model, placed.customer_id)[dim]
        edge[value] = edge.get(value, 0) + placed.totals.cost_pusd
    chosen = set(inner)
    extra = [value for value in edge if value not in inner]
    if extra and len(inner) == limit:
        # A value the ranking left out has at most the least ranked rollup cost (compared in
        # floating point: a margin) and its cost off the grid: only those that could then
        # reach the least ranked value's whole cost are read.
        least = min(inner.values())
        floor_cost = min(cost + edge.get(value, 0) for value, cost in inner.items())
        extra = [v for v in extra if (least + edge[v]) * (1 + 1e-9) + 1 >= floor_cost]
    if extra:
        # their rollup rows ('' is how the rollups hold a null key or customer)
        listed = tuple(v or "" for v in extra)
        slice_ = RollupSlice(
            dim != "model",
            grouped.basis,
            None,
            None,
            (dim,),
            api_key_ids=listed if dim == "api_key_id" else None,
            customer_ids=listed if dim == "customer_id" else None,
        )
        wanted = set(extra)
        for i in range(0, len(runs), _RUNS_PER_QUERY):
            for _seg, value, *sums in store.rollup_sums(
                session, runs[i : i + _RUNS_PER_QUERY], slice_
            ):
                if (value or None) in wanted:
                    groups.add(0, (value or None,), _rollup_totals(sums))
        chosen.update(extra)
    for placed in placed_off_grid:
        value = _named(placed.api_key_id, placed.model, placed.customer_id)[dim]
        if value in chosen:
            groups.add(0, (value,), placed.totals)
    if units is None:
        units = units_of(session, grouped)
    for _at, key, model, text, customer in units:
        value = _named(key or None, model or None, customer)[dim]
        if value in chosen:
            groups.add_units(0, (value,), _units_of(text))
    return groups.rows(grouped, segments, ())


def _named(api_key_id: str | None, model: str | None, customer_id: str | None) -> dict[str, Any]:
    return {"api_key_id": api_key_id, "model": model, "customer_id": customer_id}


def settled_statuses(session: Session, since: datetime, until: datetime) -> dict[str, int]:
    """(0021, the console's Overview) The settled calls that started in ``[since, until)`` by
    status, placed as the call_start rollups place them: ``call_status_rollups`` over the
    period's cover, the minutes off the 15-minute grid from ``calls`` (an open call is never
    rolled up: its caller counts those from ``calls``)."""
    runs, windows = cover([(since, until)])
    counts = repository(session).status_sums(session, runs)
    for placed in _read_raw(session, UsageQuery(since, until), windows):
        for status, count in placed.statuses:
            counts[status] = counts.get(status, 0) + count
    return counts


def _units_of(value: Any) -> dict[str, int]:
    """Units as stored: a JSON object (a dict on ``calls``, JSON text on ``ledger_entries``)."""
    if isinstance(value, str):
        value = json.loads(value)
    return {str(name): int(count) for name, count in (value or {}).items()}


def _check_size(query: UsageQuery, finest: str | None) -> None:
    span = query.until - query.since
    approx = {
        "hour": span / timedelta(hours=1),
        "day": span / timedelta(days=1),
        "month": span / timedelta(days=28),
    }
    if finest in approx and approx[finest] > MAX_PERIODS:
        raise ValidationFailed(
            [
                FieldError(
                    None,
                    "query.group_by",
                    f"grouping by {finest} over this period makes more than {MAX_PERIODS} periods; "
                    "shorten the period or group by a longer period",
                )
            ]
        )


class _Groups:
    """Sums contributions per (segment, key, model), keeping the group-by dimensions only."""

    def __init__(self, dims: Sequence[str]) -> None:
        self.dims = dims
        self.totals: dict[tuple[int, tuple[str | None, ...]], Totals] = {}
        self.units: dict[tuple[int, tuple[str | None, ...]], dict[str, int]] = {}

    def add_units(self, seg: int, values: tuple[str | None, ...], units: dict[str, int]) -> None:
        """Add ``units`` (name → count) to the group of segment ``seg`` and ``values``."""
        into = self.units.setdefault((seg, values), {})
        for name, count in units.items():
            into[name] = into.get(name, 0) + count

    def add(self, seg: int, values: tuple[str | None, ...], totals: Totals) -> None:
        """Add ``totals`` to the group of segment ``seg`` and the ``dims`` ``values``."""
        group = (seg, values)
        known = self.totals.get(group)
        if known is None:
            self.totals[group] = totals
        else:
            known.add(totals)

    def rows(
        self, query: UsageQuery, segments: Sequence[Segment], times: Sequence[str]
    ) -> list[UsageRow]:
        def order(group: tuple[int, tuple[str | None, ...]]) -> tuple[Any, ...]:
            seg, values = group
            by_name = dict(zip(self.dims, values, strict=True))
            return tuple(
                seg if name in times else (by_name[name] is not None, by_name[name] or "")
                for name in query.group_by
            )

        labels: dict[int, dict[str, str]] = {}
        result = []
        for group in sorted(self.totals, key=order):
            totals = self.totals[group]
            count = dict(zip(COUNT_FIELDS, totals.values, strict=True))
            if count["members"] == 0:
                continue
            seg, values = group
            if seg not in labels:
                at = segments[seg].label_at
                labels[seg] = {dim: buckets.label(dim, at, query.tz) for dim in times}
            named = {**dict(zip(self.dims, values, strict=True)), **labels[seg]}
            unpriced, uncharged = count["unpriced"], count["uncharged"]
            unknown = unpriced > 0 if query.basis == CALL_START else unpriced == count["members"]
            no_charge = (
                uncharged > 0 if query.basis == CALL_START else uncharged == count["members"]
            )
            result.append(
                UsageRow(
                    group=tuple((name, named[name]) for name in query.group_by),
                    calls=count["calls"],
                    tokens={name: count[name] for name in TOKEN_FIELDS},
                    cost_pusd=None if unknown else totals.cost_pusd,
                    units={name: n for name, n in sorted(self.units.get(group, {}).items()) if n},
                    charge_pusd=None if no_charge else totals.charge_pusd,
                    leakage_pusd=None if unknown else totals.leakage_pusd,
                    unpriced=unpriced,
                )
            )
        return result


def _read_rollups(
    session: Session,
    query: UsageQuery,
    runs: Sequence[Run],
    dims: Sequence[str],
    groups: _Groups,
) -> None:
    """Sum the rollup rows of every run per (segment, group-by keys), in SQL (the store's
    ``rollup_sums``), ``_RUNS_PER_QUERY`` runs per statement."""
    by_key = (
        query.api_key_id is not None
        or query.customer_id is not None
        or "api_key_id" in dims
        or "customer_id" in dims
    )
    by_key = by_key or query.api_key_ids is not None or query.customer_ids is not None
    rows = RollupSlice(
        by_key,
        query.basis,
        query.api_key_id,
        query.model,
        tuple(dims),
        query.customer_id,
        query.api_key_ids,
        query.customer_ids,
    )
    store = repository(session)
    width = len(dims)
    for i in range(0, len(runs), _RUNS_PER_QUERY):
        for seg, *row in store.rollup_sums(session, runs[i : i + _RUNS_PER_QUERY], rows):
            # '' is how the rollups hold a null key, model or customer
            groups.add(
                seg, tuple(value or None for value in row[:width]), _rollup_totals(row[width:])
            )


def _rollup_totals(sums: Sequence[Any]) -> Totals:
    """A rollup row's summed columns (``ROLLUP_SUMMED``, null as 0) as ``Totals``."""
    *counts, whole, frac, charge_whole, charge_frac, leak_whole, leak_frac = (
        int(value or 0) for value in sums
    )
    return Totals(
        counts,
        whole * PICO + frac,
        charge_whole * PICO + charge_frac,
        leak_whole * PICO + leak_frac,
    )


def _read_raw(session: Session, query: UsageQuery, windows: Sequence[Window]) -> list[Placed]:
    """Contributions inside the short windows the rollup buckets cannot cover, from the source
    rows, placed exactly as the rollups place them."""
    if not windows:
        return []
    source: Any = Call if query.basis == CALL_START else LedgerEntry
    column = Call.started_at if query.basis == CALL_START else LedgerEntry.booked_at
    base = select(source)
    if query.basis == CALL_START:
        base = base.where(Call.settled.is_(True))
    if query.api_key_id is not None:
        base = base.where(source.api_key_id == query.api_key_id)
    if query.model is not None:
        base = base.where(source.model == query.model)
    if query.customer_id is not None:
        base = base.where(source.customer_id == query.customer_id)
    placed = []
    # Windows per statement: one OR of them all is an expression SQLite refuses past ~1,000
    # terms (a zone with a historic offset off the 15-minute grid has a window at every edge).
    for start in range(0, len(windows), _WINDOWS_PER_QUERY):
        chunk = windows[start : start + _WINDOWS_PER_QUERY]
        statement = base.where(or_(*(and_(column >= w.start, column < w.end) for w in chunk)))
        placed += [
            place_call(row) if query.basis == CALL_START else place_entry(row)
            for row in session.scalars(statement)
        ]
    return [
        p
        for p in placed
        if p is not None
        and (query.api_key_id is None or p.api_key_id == query.api_key_id)
        and (query.model is None or p.model == query.model)
        and (query.customer_id is None or p.customer_id == query.customer_id)
        # ('' names none, as in the rollups)
        and (query.api_key_ids is None or (p.api_key_id or "") in query.api_key_ids)
        and (query.customer_ids is None or (p.customer_id or "") in query.customer_ids)
    ]
