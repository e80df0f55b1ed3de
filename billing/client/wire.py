"""The wire format of ``POST /v1/events`` as the client sees it: the limits of a post, the fields it
fills in, and what an answer means (CONTRACT "Ingest")."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx

#: The most events the service takes in one post (CONTRACT "Ingest").
MAX_BATCH_EVENTS = 1000
#: The largest request body the service takes, in bytes (CONTRACT "Ingest": 1 MiB).
MAX_BODY_BYTES = 1024 * 1024
#: Bytes of a batch body kept free below :data:`MAX_BODY_BYTES` (wrapper and headroom).
BODY_MARGIN = 1024
#: A batch body is ``HEAD`` + the events' JSON joined by commas + ``TAIL``.
HEAD = b'{"events":['
TAIL = b"]}"


#: The version (4) and variant (RFC 4122) bits of a random UUID, as :func:`uuid.uuid4` sets them.
_UUID4_CLEAR = ~(0xF000 << 64) & ~(0xC000 << 48)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_event_id() -> str:
    """A fresh event id: ``evt_`` followed by 32 hex digits of a random UUID (uuid4).

    The same value as ``uuid.uuid4().hex`` (16 bytes of ``os.urandom`` with the version and
    variant bits set), without building a ``UUID`` (half the cost; it runs for every event)."""
    bits = int.from_bytes(os.urandom(16)) & _UUID4_CLEAR | _UUID4_SET
    return f"evt_{bits:032x}"


#: ``(whole second, its "YYYY-MM-DDTHH:MM:SS" text)`` of the last :func:`utc_now` (one tuple,
#: replaced whole: safe to read and replace from several threads).
_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """Now as RFC 3339 in UTC with microseconds and ``Z`` (``2026-10-15T08:00:00.123456Z``).

    The text of the current second is formatted once per second (this runs for every event)."""
    global _second
    micros = time.time_ns() // 1000
    second, fraction = divmod(micros, 1_000_000)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{fraction:06d}Z"


def rfc3339(value: datetime) -> str:
    """An aware ``datetime`` as RFC 3339 in UTC with microseconds and ``Z``.

    Raises:
        ValueError: ``value`` is naive.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("occurred_at must be a timezone-aware datetime (or an RFC 3339 string)")
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an answer says: ``ok`` (counts in ``accepted``/``duplicates``), ``retry`` (maybe
    after ``retry_after`` seconds), ``refused`` (misconfigured client), ``too_large`` (split the
    batch), ``invalid`` (the events at ``indexes`` are refused) or ``rejected`` (all of them)."""

    kind: Literal["ok", "retry", "refused", "too_large", "invalid", "rejected"]
    status: int | None
    message: str
    detail: Any = None
    retry_after: float | None = None
    indexes: frozenset[int] = frozenset()
    accepted: int = 0
    duplicates: int = 0


def classify(result: object, max_retry_after_s: float) -> Verdict:
    """What an answer to a post (an ``httpx.Response``, or the exception the post raised) says
    to do; a ``Retry-After`` is capped at ``max_retry_after_s`` seconds."""
    if isinstance(result, BaseException):
        return Verdict("retry", None, f"{type(result).__name__}: {result}".rstrip(": "))
    assert isinstance(result, httpx.Response)
    status = result.status_code
    try:
        detail: Any = result.json()
    except ValueError:
        detail = None
    if 200 <= status < 300:
        accepted = duplicates = 0
        if isinstance(detail, dict):
            accepted = _int(detail.get("accepted"))
            duplicates = _int(detail.get("duplicates"))
        return Verdict("ok", status, "ok", detail, accepted=accepted, duplicates=duplicates)
    message = f"HTTP {status}" + _summary(detail)
    if status in (408, 429) or status >= 500:
        wait = retry_after(result.headers.get("retry-after"))
        if wait is not None:
            wait = min(wait, max_retry_after_s)
        return Verdict("retry", status, message, detail, retry_after=wait)
    if status in (401, 403, 404) or 300 <= status < 400 or status < 200:
        return Verdict("refused", status, message, detail)
    if status == 413:
        return Verdict("too_large", status, message, detail)
    if status in (409, 422) and isinstance(detail, dict):
        key = "conflicts" if status == 409 else "errors"
        entries = detail.get(key)
        indexes = frozenset(
            entry["index"]
            for entry in (entries if isinstance(entries, list) else [])
            if isinstance(entry, dict) and type(entry.get("index")) is int
        )
        return Verdict("invalid", status, message, detail, indexes=indexes)
    return Verdict("rejected", status, message, detail)


def _int(value: object) -> int:
    return value if type(value) is int else 0


def _summary(detail: object) -> str:
    """A short excerpt of an error answer, for messages."""
    if not isinstance(detail, dict):
        return ""
    for key in ("errors", "conflicts"):
        entries = detail.get(key)
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            first = entries[0]
            text = first.get("message") or f"event_id {first.get('event_id')} conflicts"
            more = f" (+{len(entries) - 1} more)" if len(entries) > 1 else ""
            return f": {first.get('path', key)}: {text}{more}"
    error = detail.get("error")
    return f": {error}" if isinstance(error, str) else ""


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``None``."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
