"""The finance exports on PostgreSQL (``billing.export.repository``).

``booked_at`` is a ``timestamptz``, written as text by ``to_char`` in UTC, out of Python's
per-row path. The chunked reads use a server-side (named) cursor, read ahead by a thread of
their own: the server prepares the next chunk while Python formats this one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from queue import Full, Queue
from typing import Any

from billing.export.sql.common import (
    EXPORT_TOKEN_SUMS,
    EXPORT_TOKENS,
    LEDGER_PRICES,
    TOKENS_AS_TEXT,
    SqlExport,
)

_PERIOD = "FROM ledger_entries WHERE booked_at >= %(since)s AND booked_at < %(until)s"

COUNT = f"SELECT count(*) {_PERIOD}"
TOTALS = (
    "SELECT count(*), sum(CASE WHEN kind = 'settlement' THEN 1 ELSE 0 END), "
    "count(*) - count(cost_pusd), sum(cost_pusd / 1000000), sum(cost_pusd %% 1000000), "
    f"{EXPORT_TOKEN_SUMS} {_PERIOD}"
)
#: ``booked_at`` as RFC 3339: microseconds only when they are not zero.
_BOOKED_RFC3339 = (
    "to_char(booked_at AT TIME ZONE 'UTC', CASE WHEN date_trunc('second', booked_at) = booked_at "
    """THEN 'YYYY-MM-DD"T"HH24:MI:SS"Z"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"' END)"""
)
CALLS = (
    f"SELECT CAST(entry_id AS TEXT), kind, reason, {_BOOKED_RFC3339}, request_id, api_key_id, "
    f"model, protocol, status, {TOKENS_AS_TEXT}, {LEDGER_PRICES}, cost_pusd{{extra}} {_PERIOD} "
    "ORDER BY booked_at, entry_id"
)
#: ``booked_at`` as SQLite stores it (``YYYY-MM-DD HH:MM:SS.ffffff``), as the labels read it.
USAGE = (
    "SELECT to_char(booked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), api_key_id, "
    f"model, kind, {EXPORT_TOKENS}, cost_pusd{{extra}} {_PERIOD} ORDER BY booked_at, entry_id"
)
#: Chunks read ahead of the one being formatted.
_READ_AHEAD = 2


class PostgresExport(SqlExport):
    """``ExportRepository`` on PostgreSQL: a named (server-side) cursor, read ahead."""

    COUNT, TOTALS, CALLS, USAGE = COUNT, TOTALS, CALLS, USAGE

    def period(self, since: datetime, until: datetime) -> dict[str, datetime]:
        return {"since": since, "until": until}

    def cursor(self, driver: Any) -> Any:
        return driver.cursor(name="billing_export", binary=True)

    def read(self, chunks: Iterator[list[Any]]) -> Iterator[list[Any]]:
        return _prefetched(chunks)


_DONE = object()


def _prefetched(chunks: Iterator[Any]) -> Iterator[Any]:
    """``chunks``, read ahead by a thread of its own, at most ``_READ_AHEAD`` chunks ahead.

    Stopping early stops and joins the reader, which closes ``chunks`` (and so its cursor)
    itself; its errors are raised here.
    """
    queue: Queue[Any] = Queue(maxsize=_READ_AHEAD)
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
