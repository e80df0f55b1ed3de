"""The finance exports on SQLite (``billing.export.repository``).

SQLite keeps ``booked_at`` as UTC text ``YYYY-MM-DD HH:MM:SS.ffffff`` (fixed width, so text order
is time order): the period's bounds are bound as that text, ``usage.csv`` reads it as it is and
``calls.csv`` cuts it into RFC 3339 in the database, out of Python's per-row path. SQLite's
cursor is lazy: the rows are read as they are fetched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from billing.export.sql.common import (
    EXPORT_TOKEN_SUMS,
    EXPORT_TOKENS,
    LEDGER_PRICES,
    TOKENS_AS_TEXT,
    SqlExport,
)
from billing.storage.types import sqlite_text

_PERIOD = "FROM ledger_entries WHERE booked_at >= ? AND booked_at < ?"

COUNT = f"SELECT count(*) {_PERIOD}"
TOTALS = (
    "SELECT count(*), sum(CASE WHEN kind = 'settlement' THEN 1 ELSE 0 END), "
    "count(*) - count(cost_pusd), sum(cost_pusd / 1000000), sum(cost_pusd % 1000000), "
    f"{EXPORT_TOKEN_SUMS} {_PERIOD}"
)
#: ``booked_at`` as RFC 3339: microseconds only when they are not zero.
_BOOKED_RFC3339 = (
    "CASE WHEN substr(booked_at, 21) IN ('', '000000') "
    "THEN substr(booked_at, 1, 10) || 'T' || substr(booked_at, 12, 8) || 'Z' "
    "ELSE substr(booked_at, 1, 10) || 'T' || substr(booked_at, 12) || 'Z' END"
)
CALLS = (
    f"SELECT CAST(entry_id AS TEXT), kind, reason, {_BOOKED_RFC3339}, request_id, api_key_id, "
    f"model, protocol, status, {TOKENS_AS_TEXT}, {LEDGER_PRICES}, cost_pusd{{extra}} {_PERIOD} "
    "ORDER BY booked_at, entry_id"
)
USAGE = (
    f"SELECT booked_at, api_key_id, model, kind, {EXPORT_TOKENS}, cost_pusd{{extra}} {_PERIOD} "
    "ORDER BY booked_at, entry_id"
)


class SqliteExport(SqlExport):
    """``ExportRepository`` on SQLite: the period bound as stored text, a plain cursor."""

    COUNT, TOTALS, CALLS, USAGE = COUNT, TOTALS, CALLS, USAGE

    def period(self, since: datetime, until: datetime) -> tuple[str, str]:
        return sqlite_text(since), sqlite_text(until)

    def cursor(self, driver: Any) -> Any:
        return driver.cursor()
