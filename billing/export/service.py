"""Streaming the finance exports from the ledger (CONTRACT "Export").

Both exports read ``ledger_entries`` booked in ``[since, until)`` — booking time, never call
time — in one read-only transaction, through a raw DB-API cursor (a server-side named cursor on
PostgreSQL, SQLite's lazy cursor) fetching ``CHUNK_ROWS`` plain tuples at a time (no ORM objects):

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
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from queue import Full, Queue
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import TextClause

from billing.calllog.buckets import Buckets, hour_sort_key
from billing.export import sql
from billing.export.columns import CALLS_COLUMNS, TEXT_KEYS, TOKEN_COLUMNS, usage_columns
from billing.export.csvwriter import CallsRenderer, ChunkWriter, neutralise, pusd_cell
from billing.export.params import ExportParams
from billing.storage.db import read_transaction
from billing.storage.types import UTCDateTime

#: Ledger rows fetched (and, for calls.csv, written) per chunk.
CHUNK_ROWS = 5000

#: A callback told how many ledger entries were read so far in this chunk (for a progress bar).
Progress = Callable[[int], None]

_NTOKENS = len(TOKEN_COLUMNS)


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


_TOKENS_SQL = ", ".join(TOKEN_COLUMNS)
_WHERE = "FROM ledger_entries WHERE booked_at >= :since AND booked_at < :until"
_PRICES_SQL = (
    "input_uusd_per_mtok, output_uusd_per_mtok, cache_read_uusd_per_mtok, "
    "cache_creation_uusd_per_mtok"
)


def _bounded(sql_text: str) -> TextClause:
    return text(sql_text).bindparams(
        bindparam("since", type_=UTCDateTime()), bindparam("until", type_=UTCDateTime())
    )


def _calls_sql(dialect: str) -> str:
    """The columns of ``calls.csv`` in order: ``booked_at`` as RFC 3339 text, ``entry_id`` and
    the token counts as decimal text (the database writes integers faster than Python does),
    the prices and the cost as integers."""
    tokens = ", ".join(f"CAST({name} AS TEXT)" for name in TOKEN_COLUMNS)
    return (
        f"SELECT CAST(entry_id AS TEXT), kind, reason, {sql.rfc3339_text('booked_at', dialect)}, "
        f"request_id, api_key_id, model, protocol, status, {tokens}, {_PRICES_SQL}, cost_pusd "
        f"{_WHERE} ORDER BY booked_at, entry_id"
    )


def _usage_sql(dialect: str) -> str:
    return (
        f"SELECT {sql.utc_text('booked_at', dialect)}, api_key_id, model, kind, {_TOKENS_SQL}, "
        f"cost_pusd {_WHERE} ORDER BY booked_at, entry_id"
    )


def _totals_query() -> TextClause:
    # The cost is summed in two parts (cost = high * 10**6 + low, truncating division on both
    # databases), so no SQL integer sum can overflow; the parts are added in Python.
    tokens = ", ".join(f"sum({name})" for name in TOKEN_COLUMNS)
    return _bounded(
        "SELECT count(*), sum(CASE WHEN kind = 'settlement' THEN 1 ELSE 0 END), "
        f"count(*) - count(cost_pusd), sum(cost_pusd / 1000000), sum(cost_pusd % 1000000), "
        f"{tokens} {_WHERE}"
    )


def count_entries(sessions: sessionmaker[Session], params: ExportParams) -> int:
    """How many ledger entries the period holds (for a progress bar's total)."""
    with read_transaction(sessions) as session:
        value = session.execute(
            _bounded(f"SELECT count(*) {_WHERE}"), {"since": params.since, "until": params.until}
        ).scalar_one()
        return int(value)


def _partitions(session: Session, query: str, params: ExportParams) -> Iterator[list[Any]]:
    """The rows of ``query`` as tuples, ``CHUNK_ROWS`` at a time, from a raw DB-API cursor
    inside the session's transaction: a server-side (named) cursor on PostgreSQL, SQLite's lazy
    cursor otherwise. ``query`` takes ``:since`` and ``:until``. Driver errors are raised as
    SQLAlchemy's (``OperationalError`` for an outage), as everywhere else in the service."""
    connection = session.connection()
    dialect = connection.dialect
    driver: Any = connection.connection.driver_connection
    if dialect.name == "postgresql":
        statement = query.replace(":since", "%(since)s").replace(":until", "%(until)s")
        bound: Any = {"since": params.since, "until": params.until}
    else:
        statement = query.replace(":since", "?").replace(":until", "?")
        bound = (sql.sqlite_utc(params.since), sql.sqlite_utc(params.until))
    try:
        if dialect.name == "postgresql":
            cursor = driver.cursor(name="billing_export", binary=True)
        else:
            cursor = driver.cursor()
        try:
            cursor.execute(statement, bound)
            while rows := cursor.fetchmany(CHUNK_ROWS):
                yield rows
        finally:
            cursor.close()
    except dialect.loaded_dbapi.Error as error:
        raise DBAPIError.instance(statement, bound, error, dialect.loaded_dbapi.Error) from error


_DONE = object()


def _rows(session: Session, query: str, params: ExportParams) -> Iterator[list[Any]]:
    """The chunks of ``query``: read ahead on PostgreSQL, where the server then prepares the
    next chunk while Python formats this one; inline on SQLite, which works in this process
    anyway (a reader thread there only adds GIL hand-offs)."""
    chunks = _partitions(session, query, params)
    if session.get_bind().dialect.name == "postgresql":
        return _prefetched(chunks)
    return chunks


def _prefetched(chunks: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``chunks``, read ahead by a thread of its own, at most ``depth`` chunks ahead.

    Stopping early stops and joins the reader, which closes ``chunks`` (and so its cursor)
    itself; its errors are raised here.
    """
    queue: Queue[Any] = Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                queue.put(item, timeout=0.05)
                return True
            except Full:
                continue
        return False

    def read() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
            put(_DONE)
        except BaseException as error:
            put(error)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    reader = threading.Thread(target=read, name="billing-export-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()


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
    row = session.execute(_totals_query(), {"since": params.since, "until": params.until}).one()
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
    pending = writer.header(CALLS_COLUMNS)
    with read_transaction(sessions) as session:
        dialect = session.get_bind().dialect.name
        if stats is not None:
            _calls_totals(session, params, stats)
        render = CallsRenderer()
        for part in _rows(session, _calls_sql(dialect), params):
            if progress is not None:
                progress(len(part))
            yield pending + render.chunk(part).encode("utf-8")
            pending = b""
    if pending:
        yield pending


def _group_getter(params: ExportParams) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """Picks the group key, in ``group_by`` order, out of ``(*time labels, api_key_id, model)``."""
    time_keys = [k for k in params.group_by if k not in TEXT_KEYS]
    place = {k: i for i, k in enumerate(time_keys)}
    place["api_key_id"] = len(time_keys)
    place["model"] = len(time_keys) + 1
    indexes = [place[k] for k in params.group_by]
    if len(indexes) == 1:
        only = indexes[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*indexes)


def _sort_key(params: ExportParams) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    def key(group: tuple[Any, ...]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for name, value in zip(params.group_by, group, strict=True):
            if name in TEXT_KEYS:
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
    header = writer.header(usage_columns(params.group_by))
    buckets = Buckets(params.zone, tuple(k for k in params.group_by if k not in TEXT_KEYS))
    labels_of = buckets.labels
    pick = _group_getter(params)
    # Per group: [settlements, 7 token totals, cost of priced entries, priced entries].
    groups: dict[tuple[Any, ...], list[int]] = {}
    with read_transaction(sessions) as session:
        dialect = session.get_bind().dialect.name
        for part in _rows(session, _usage_sql(dialect), params):
            for booked, key, model, kind, a, b, c, d, e, f, g, cost in part:
                group = pick((*labels_of(booked), key, model))
                acc = groups.get(group)
                if acc is None:
                    acc = groups[group] = [0] * 10
                if kind == "settlement":
                    acc[0] += 1
                acc[1] += a
                acc[2] += b
                acc[3] += c
                acc[4] += d
                acc[5] += e
                acc[6] += f
                acc[7] += g
                if cost is not None:
                    acc[8] += cost
                    acc[9] += 1
            stats.entries += len(part)
            if progress is not None:
                progress(len(part))
    yield header
    n = neutralise
    rows: list[tuple[Any, ...]] = []
    for group in sorted(groups, key=_sort_key(params)):
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
            )
        )
        if len(rows) >= CHUNK_ROWS:
            stats.rows += len(rows)
            yield writer.encode(rows)
            rows = []
    stats.unpriced_entries = stats.entries - sum(acc[9] for acc in groups.values())
    stats.rows += len(rows)
    if rows:
        yield writer.encode(rows)
