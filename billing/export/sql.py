"""The little SQL that differs between SQLite and PostgreSQL in the exports: timestamps as text.

SQLite stores a ``UTCDateTime`` as UTC text ``YYYY-MM-DD HH:MM:SS.ffffff`` (fixed width, so text
order is time order); PostgreSQL stores ``timestamptz``. Reading ``booked_at`` as text in the
database keeps the conversion out of Python's per-row path.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339_text(column: str, dialect: str) -> str:
    """The UTC timestamp ``column`` as RFC 3339: ``2026-10-15T08:00:00Z``, ``…:00.000005Z``.

    The same text as :func:`billing.timefmt.rfc3339` (microseconds only when not zero).
    """
    if dialect == "postgresql":
        whole = """'YYYY-MM-DD"T"HH24:MI:SS"Z"'"""
        micro = """'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"""
        return (
            f"to_char({column} AT TIME ZONE 'UTC', CASE WHEN date_trunc('second', {column}) = "
            f"{column} THEN {whole} ELSE {micro} END)"
        )
    return (
        f"CASE WHEN substr({column}, 21) IN ('', '000000') "
        f"THEN substr({column}, 1, 10) || 'T' || substr({column}, 12, 8) || 'Z' "
        f"ELSE substr({column}, 1, 10) || 'T' || substr({column}, 12) || 'Z' END"
    )


def utc_text(column: str, dialect: str) -> str:
    """The UTC timestamp ``column`` as ``YYYY-MM-DD HH:MM:SS.ffffff`` (as SQLite stores it)."""
    if dialect == "postgresql":
        return f"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
    return column


def sqlite_utc(value: datetime) -> str:
    """An aware datetime as SQLite stores ``UTCDateTime`` (``YYYY-MM-DD HH:MM:SS.ffffff``)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
