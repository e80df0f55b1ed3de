"""Column types that keep their meaning on both SQLite and PostgreSQL."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp.

    PostgreSQL stores ``timestamptz``; SQLite stores naive UTC text in one fixed format, so that
    text order is time order. Values come back aware, in UTC. Raises ``ValueError`` for a naive
    value: the service never guesses a zone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # pragma: no cover - raw text from SQLite functions
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def sqlite_text(value: datetime) -> str:
    """The text ``UTCDateTime`` stores on SQLite for an aware instant, for driver-level
    statements: naive UTC ``YYYY-MM-DD HH:MM:SS.ffffff``, always with microseconds (one fixed
    format, so text order is time order)."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    if type(value) is not datetime:  # a subclass (a test clock's, say): orjson refuses it
        return value.isoformat(" ", "microseconds")[:26]
    # orjson writes "YYYY-MM-DDTHH:MM:SS[.ffffff]Z" (the fraction only when not zero) faster than
    # ``isoformat``, and ingest pays this on every event.
    text = orjson.dumps(value, option=orjson.OPT_UTC_Z).decode()
    return f"{text[1:11]} {text[12:20]}{text[20:27] if len(text) > 22 else '.000000'}"


#: ``sqlite_text`` remembering recent instants, for a reconciliation step, which writes the same
#: few instants many times (a call's start on its row and its ledger entry; rollup buckets).
cached_sqlite_text = functools.lru_cache(maxsize=4096)(sqlite_text)
