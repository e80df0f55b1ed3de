"""Streaming the finance exports from the ledger (CONTRACT "Export").

Both exports read ``ledger_entries`` booked in ``[since, until)`` — booking time, never call
time — in one read-only transaction, through the store's raw cursor
(``billing.export.repository``) fetching ``CHUNK_ROWS`` plain tuples at a time (no ORM objects):

- ``calls.csv`` writes each chunk as it arrives, ordered by ``booked_at`` then ``entry_id``: memory
  stays constant whatever the number of rows.
- ``usage.csv`` adds the entries into one running total per group (memory grows with the number
  of groups, not of rows), then writes the groups ordered by their keys ascending, in ``group_by``
  order: ``api_key_id`` and ``model`` by text (an empty key, null, first), ``day`` and ``month`` by
  date, ``hour`` by the instant it starts.

``usage.csv`` holds what ``GET /v1/usage?basis=booked`` (:func:`billing.calllog.usage.usage_rows`)
answers, its buckets named by the same functions (:mod:`billing.calllog.buckets`), but summed here
from the ledger itself rather than from the usage rollups: the finance record does not rest on
derived tables (a test compares the two paths), and each entry is labelled by its own instant,
with no limit on the number of periods.

Costs are summed as integer picodollars (exact, no overflow) and written as exact decimals. A
group's ``cost_usd`` is the sum of its priced entries; it is empty when every entry of the group is
unpriced (as ``SUM`` over nulls is null). An unpriced entry leaves its own price and cost cells
empty in ``calls.csv``.

Since every entry is immutable and booked once, the bytes of a period whose end is older than
``BILLING_CLOSE_LAG_S`` never change: later corrections are booked, and exported, in later periods.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from billing.calllog.buckets import Buckets, hour_sort_key
from billing.export.columns import (
    TEXT_KEYS,
    TOKEN_COLUMNS,
    V2_USAGE_GROUPS,
    calls_added,
    calls_columns,
    usage_added,
    usage_columns,
    v2_groups,
)
from billing.export.csvwriter import (
    CallsRenderer,
    ChunkWriter,
    V2Cells,
    merge_units,
    neutralise,
    pusd_cell,
)
from billing.export.params import ExportParams
from billing.export.repository import repository
from billing.storage.db import read_transaction

#: Ledger rows fetched (and, for calls.csv, written) per chunk.
CHUNK_ROWS = 5000

#: A callback told how many ledger entries were read so far in this chunk (for a progress bar).
Progress = Callable[[int], None]

_NTOKENS = len(TOKEN_COLUMNS)
#: A usage group's running totals: settlements, the token totals, the cost of its priced entries
#: and their number.
_COST, _PRICED = _NTOKENS + 1, _NTOKENS + 2
_ACC_WIDTH = _NTOKENS + 3


def _add_entry(
    groups: dict[tuple[Any, ...], list[int]],
    group: tuple[Any, ...],
    kind: str,
    tokens: list[int],
    cost: int | None,
) -> None:
    """Add one ledger entry (its ``kind``, its ``TOKEN_COLUMNS`` counts in tokens, its cost in
    picodollars or None) to the running totals of ``group`` in ``groups``: ``[settlements,
    *token totals, cost of the priced entries, priced entries]``, made at 0."""
    acc = groups.get(group)
    if acc is None:
        acc = groups[group] = [0] * _ACC_WIDTH
    if kind == "settlement":
        acc[0] += 1
    for i, count in enumerate(tokens, 1):
        acc[i] += count
    if cost is not None:
        acc[_COST] += cost
        acc[_PRICED] += 1


def add_part(
    part: list[Any],
    groups: dict[tuple[Any, ...], list[int]],
    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    labels_of: Callable[[Any], tuple[Any, ...]],
) -> None:
    """Add each ledger row of ``part`` (``booked_at``, ``api_key_id``, ``model``, ``kind``, the
    ``TOKEN_COLUMNS`` counts, ``cost_pusd``) to its group's totals (``_add_entry``); the group
    is ``pick`` of the row's time labels (``labels_of(booked_at)``), key and model."""
    for booked, key, model, kind, *tokens, cost in part:
        _add_entry(groups, pick((*labels_of(booked), key, model)), kind, tokens, cost)


def _add_extended(
    part: list[Any],
    width: int,
    params: ExportParams,
    groups: dict[tuple[Any, ...], list[int]],
    added: dict[tuple[Any, ...], list[Any]],
    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    labels_of: Callable[[Any], tuple[Any, ...]],
) -> int:
    """Add each row (the v1 cells, then ``customer_id``, ``plan_id``, then in v2 the sources of
    ``V2_USAGE_ADDED``) to its group: by ``group_by`` (``customer_id`` among them), then in v2
    by the customer and plan not in it (``v2_groups``); only the customer's rows with
    ``params.customer_id``. Returns how many rows were added."""
    v2 = params.format != "v1"
    kinds = [c.kind for c in usage_added(params.format)]
    extra_groups = [V2_USAGE_GROUPS.index(n) for n in v2_groups(params.group_by)] if v2 else []
    only = params.customer_id
    taken = 0
    for row in part:
        booked, key, model, kind, *rest = row[:width]
        customer, plan = row[width], row[width + 1]
        if only is not None and customer != only:
            continue
        taken += 1
        named = (customer, plan)
        group = (
            *pick((*labels_of(booked), key, model, customer)),
            *(named[i] for i in extra_groups),
        )
        *tokens, cost = rest
        _add_entry(groups, group, kind, tokens, cost)
        if not v2:
            continue
        cells = added.get(group)
        if cells is None:
            cells = added[group] = [
                {} if k == "units" else [0, 0] if k == "money" else 0 for k in kinds
            ]
        for i, (k, value) in enumerate(zip(kinds, row[width + 2 :], strict=True)):
            if k == "units":
                merge_units(cells[i], value)
            elif k == "money":
                if value is not None:
                    cells[i][0] += value
                    cells[i][1] += 1
            else:
                cells[i] += int(value or 0)
    return taken


def is_closed(until: datetime, now: datetime, close_lag_s: float) -> bool:
    """Whether the period ending at ``until`` is closed at ``now``: older than the lag."""
    return now - until > timedelta(seconds=close_lag_s)


def period_label(params: ExportParams, now: datetime, close_lag_s: float) -> str:
    """``closed`` or ``provisional``: the ``X-Billing-Period`` of an export made at ``now``."""
    return "closed" if is_closed(params.until, now, close_lag_s) else "provisional"


@dataclass
class ExportStats:
    """What an export wrote (for the manifest).

    ``rows`` counts data rows (the header excluded), ``entries`` the ledger entries read,
    ``settlements`` the settlement entries (the sum of the ``calls`` column), ``tokens`` the token
    totals in column order, ``cost_pusd`` the sum of every priced entry's cost and
    ``unpriced_entries`` the entries without a price.
    """

    rows: int = 0
    entries: int = 0
    settlements: int = 0
    tokens: list[int] = field(default_factory=lambda: [0] * _NTOKENS)
    cost_pusd: int = 0
    unpriced_entries: int = 0

    def as_json(self) -> dict[str, Any]:
        """The totals as written in a manifest."""
        return {
            "rows": self.rows,
            "ledger_entries": self.entries,
            "calls": self.settlements,
            "tokens": dict(zip(TOKEN_COLUMNS, self.tokens, strict=True)),
            "cost_usd": pusd_cell(self.cost_pusd),
            "unpriced_entries": self.unpriced_entries,
        }


def count_entries(sessions: sessionmaker[Session], params: ExportParams) -> int:
    """How many ledger entries the period holds (for a progress bar's total)."""
    with read_transaction(sessions) as session:
        return repository(session).count(session, params.since, params.until)


def export_chunks(
    sessions: sessionmaker[Session],
    params: ExportParams,
    stats: ExportStats | None = None,
    progress: Progress | None = None,
) -> Iterator[bytes]:
    """The export's CSV as UTF-8 byte chunks: the header first, then the rows.

    The same generator serves ``GET /v1/exports/…`` and ``billing export``, so both give the same
    bytes for the same parameters. ``stats`` (if given) receives the totals of what is written
    (for calls.csv from one aggregate query in the same snapshot, before the rows; for usage.csv
    from the groups, as they are written); ``progress`` is called with the number of ledger
    entries read after every chunk. Nothing touches the database until the first chunk is asked
    for, and that first chunk runs the query.
    """
    if params.kind == "calls":
        return _calls_chunks(sessions, params, stats, progress)
    return _usage_chunks(sessions, params, stats if stats is not None else ExportStats(), progress)


def _calls_totals(session: Session, params: ExportParams, stats: ExportStats) -> None:
    row = repository(session).totals(session, params.since, params.until)
    entries, settlements, unpriced, high, low, *tokens = (int(v or 0) for v in row)
    stats.rows = stats.entries = entries
    stats.settlements = settlements
    stats.unpriced_entries = unpriced
    stats.cost_pusd = high * 1_000_000 + low
    stats.tokens = tokens


def _calls_chunks(
    sessions: sessionmaker[Session],
    params: ExportParams,
    stats: ExportStats | None,
    progress: Progress | None,
) -> Iterator[bytes]:
    writer = ChunkWriter()
    # The header goes out with the first rows, so a failing query fails before any byte is sent.
    pending = writer.header(calls_columns(params.format))
    v2 = params.format != "v1"
    added = calls_added(params.format)
    extra = [c.source for c in added]
    with read_transaction(sessions) as session:
        if stats is not None:
            _calls_totals(session, params, stats)
        render = CallsRenderer()
        cells = V2Cells(added)
        chunks = repository(session).calls_chunks
        for part in chunks(session, params.since, params.until, CHUNK_ROWS, extra):
            if progress is not None:
                progress(len(part))
            if v2:
                # v2: the reference rendering (csv.writer) of the v1 cells and the v2 cells.
                width = len(part[0]) - len(extra)
                text = writer.text(
                    [(*render.cells(row[:width]), *cells.cells(row[width:])) for row in part]
                )
            else:
                text = render.chunk(part)
            yield pending + text.encode("utf-8")
            pending = b""
    if pending:
        yield pending


def _group_getter(params: ExportParams) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """Picks the group key, in ``group_by`` order, out of ``(*time labels, api_key_id, model)``
    (and ``customer_id`` after them when grouped by it)."""
    time_keys = [k for k in params.group_by if k not in TEXT_KEYS]
    place = {k: i for i, k in enumerate(time_keys)}
    place["api_key_id"] = len(time_keys)
    place["model"] = len(time_keys) + 1
    place["customer_id"] = len(time_keys) + 2
    indexes = [place[k] for k in params.group_by]
    if len(indexes) == 1:
        only = indexes[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*indexes)


def _sort_key(
    params: ExportParams, v2: bool = False
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    names = (*params.group_by, *v2_groups(params.group_by)) if v2 else params.group_by

    def key(group: tuple[Any, ...]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for name, value in zip(names, group, strict=True):
            if name in TEXT_KEYS or name in V2_USAGE_GROUPS:
                parts.append((0, "") if value is None else (1, value))
            elif name == "hour":
                parts.append(hour_sort_key(value))
            else:
                parts.append(value)
        return tuple(parts)

    return key


def _usage_chunks(
    sessions: sessionmaker[Session],
    params: ExportParams,
    stats: ExportStats,
    progress: Progress | None,
) -> Iterator[bytes]:
    writer = ChunkWriter()
    header = writer.header(usage_columns(params.group_by, params.format))
    buckets = Buckets(params.zone, tuple(k for k in params.group_by if k not in TEXT_KEYS))
    labels_of = buckets.labels
    pick = _group_getter(params)
    v2 = params.format != "v1"
    added_columns = usage_added(params.format)
    # v2, a customer group or a customer filter read the customer and plan of every entry (and
    # v2 its columns) and go through ``_add_extended``; v1's other exports are v1's hot loop.
    extended = v2 or "customer_id" in params.group_by or params.customer_id is not None
    extra = [*V2_USAGE_GROUPS, *(c.source for c in added_columns)] if extended else []
    # Per group: [settlements, the token totals, cost of priced entries, priced entries].
    groups: dict[tuple[Any, ...], list[int]] = {}
    # v2: per group, the v2 columns' totals (a count summed, units merged by name).
    added: dict[tuple[Any, ...], list[Any]] = {}
    with read_transaction(sessions) as session:
        chunks = repository(session).usage_chunks
        for part in chunks(session, params.since, params.until, CHUNK_ROWS, extra):
            if extended:
                width = len(part[0]) - len(extra)
                stats.entries += _add_extended(part, width, params, groups, added, pick, labels_of)
            else:
                add_part(part, groups, pick, labels_of)
                stats.entries += len(part)
            if progress is not None:
                progress(len(part))
    yield header
    cells = V2Cells(added_columns)
    n = neutralise
    rows: list[tuple[Any, ...]] = []
    for group in sorted(groups, key=_sort_key(params, v2)):
        acc = groups[group]
        settlements, *token_totals, cost_sum, priced = acc
        stats.settlements += settlements
        for i, total in enumerate(token_totals):
            stats.tokens[i] += total
        stats.cost_pusd += cost_sum
        rows.append(
            (
                *(n(v) for v in group),
                settlements,
                *token_totals,
                pusd_cell(cost_sum) if priced else None,
                *(cells.totals(added[group]) if v2 else ()),
            )
        )
        if len(rows) >= CHUNK_ROWS:
            stats.rows += len(rows)
            yield writer.encode(rows)
            rows = []
    stats.unpriced_entries = stats.entries - sum(acc[_PRICED] for acc in groups.values())
    stats.rows += len(rows)
    if rows:
        yield writer.encode(rows)
