"""Reading query strings into typed values, with every problem reported at once in words.

The query endpoints answer the contract's 422 shape (``{"errors": [{"index": null, "path":
"query.x", "message": …}]}``) for unknown parameters, repeated ones and bad values.
:func:`query_problems` is the one check of unknown and repeated parameters, shared by
:class:`QueryReader` (``/v1/calls``, ``/v1/usage``) and the exports (``billing.export.params``).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from billing.errors import FieldError, ValidationFailed

T = TypeVar("T")

#: What an ``until`` at or before ``since`` is told (usage and the exports).
UNTIL_AFTER_SINCE = "must be after since: periods are [since, until)"

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:[0-5]\d)?", re.ASCII
)
_MICROSECOND = timedelta(microseconds=1)
#: A ``+hh:mm`` offset sent unencoded in a query string arrives as `` hh:mm``.
_PLUS_AS_SPACE = re.compile(r"(.*:\d{2}(?:\.\d+)?) (\d{2}:\d{2})", re.ASCII)


def parse_timestamp(text: str) -> datetime:
    """An RFC 3339 timestamp with an offset → an aware UTC datetime; ``ValueError`` in words.

    The one reading of a timestamp in a query string (``/v1/calls``, ``/v1/usage``, the exports
    and ``billing export``): ``T``, ``t`` or a space between date and time; an offset whose ``+``
    arrived as a space (a ``+`` in a URL query means a space) is read as the ``+`` it was. More
    than 6 fraction digits are rounded up to the next microsecond (instants are stored to the
    microsecond, so for a bound of a half-open period ``[since, until)`` the stored instants on
    either side of it stay on the same side).
    """
    text = text.strip()
    fixed = _PLUS_AS_SPACE.fullmatch(text)
    if fixed:
        text = f"{fixed.group(1)}+{fixed.group(2)}"
    match = _RFC3339.fullmatch(text)
    if not match:
        raise ValueError(
            f"{text!r} is not an RFC 3339 timestamp; send one such as 2026-03-08T00:00:00Z"
        )
    if match.group(2) is None:
        raise ValueError(
            f"{text!r} has no UTC offset; add one, such as 2026-03-08T00:00:00Z or "
            "2026-03-08T00:00:00%2B05:30 (a + in a query string is written %2B)"
        )
    fraction = match.group(1) or ""
    beyond = fraction[7:]  # Python keeps microseconds
    if beyond:
        text = text.replace(fraction, fraction[:7], 1)
    try:
        at = datetime.fromisoformat(text.upper().replace(" ", "T")).astimezone(UTC)
        return at + _MICROSECOND if beyond.strip("0") else at
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a valid date and time (or out of range)") from None


def parse_zone(text: str) -> ZoneInfo:
    """An IANA zone name (``Asia/Kolkata``, ``UTC``, ``Etc/GMT+5``) → ``ZoneInfo``;
    ``ValueError`` in words. Only the names of the time zone database (``localtime``, which is
    the server's own zone, and files such as ``posix/…`` or ``right/…`` are not: the same query
    must give the same answer on every server); a ``+`` that arrived as a space is read as ``+``
    (zone names have no spaces)."""
    name = text.strip().replace(" ", "+")
    if name not in _zone_names():
        raise ValueError(
            f"unknown time zone {text!r}: send an IANA zone name such as UTC, Europe/Berlin or "
            "Asia/Kolkata (a + in a query string is written %2B)"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # pragma: no cover - listed but unreadable
        raise ValueError(f"time zone {text!r} cannot be read on this server") from None


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones() - {"localtime"})


#: The longest query parameter value read (longer ones are refused, not echoed back).
MAX_VALUE_LENGTH = 256


def length_problem(value: str, max_length: int = MAX_VALUE_LENGTH) -> str | None:
    """The error message for a query value that is empty or longer than ``max_length``."""
    if not 1 <= len(value) <= max_length:
        return f"must be 1 to {max_length} characters long"
    return None


def query_problems(items: Iterable[tuple[str, str]], known: Sequence[str]) -> list[FieldError]:
    """A ``query.<name>`` error for each parameter of ``items`` (the query string as (name, value)
    pairs) that is not in ``known`` or is given more than once, in the order they first appear.

    A repeated parameter is refused rather than one of its values silently chosen."""
    errors: list[FieldError] = []
    for name, count in Counter(name for name, _ in items).items():
        if name not in known:
            message = f"is not a known query parameter; the known ones are {', '.join(known)}"
        elif count > 1:
            message = f"is given {count} times; give it once"
        else:
            continue
        errors.append(FieldError(None, f"query.{name}", message))
    return errors


class QueryReader:
    """Takes values out of a query string, collecting every error; ``done()`` raises them all.

    Parameters not in ``known`` and parameters given more than once are errors from the start
    (:func:`query_problems`); reading a repeated one gives None.
    """

    def __init__(self, items: Iterable[tuple[str, str]], known: Sequence[str]) -> None:
        pairs = list(items)
        self.values: dict[str, list[str]] = {}
        for name, value in pairs:
            self.values.setdefault(name, []).append(value)
        self.errors: list[FieldError] = query_problems(pairs, known)

    def fail(self, name: str, message: str) -> None:
        self.errors.append(FieldError(None, f"query.{name}", message))

    def text(self, name: str, max_length: int = MAX_VALUE_LENGTH) -> str | None:
        """The parameter's text, or None when absent."""
        values = self.values.get(name)
        if not values:
            return None
        if len(values) > 1:  # already an error (query_problems)
            return None
        value = values[0]
        problem = length_problem(value, max_length)
        if problem:
            self.fail(name, problem)
            return None
        return value

    def parsed(self, name: str, parse: Callable[[str], T], required: str | None = None) -> T | None:
        """``parse(text)``; its ``ValueError`` becomes this parameter's error message. When
        ``required`` (what to send) is given, a missing parameter is an error too."""
        value = self.text(name)
        if value is None:
            if required and name not in self.values:
                self.fail(name, f"is required: send {required}")
            return None
        try:
            return parse(value)
        except ValueError as error:
            self.fail(name, str(error))
            return None

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        """One of ``choices``, or None when absent."""
        value = self.text(name)
        if value is not None and value not in choices:
            self.fail(name, f"must be one of {', '.join(choices)}, not {value!r}")
            return None
        return value

    def integer(self, name: str, low: int, high: int) -> int | None:
        """An integer in ``[low, high]``, or None when absent."""
        value = self.text(name)
        if value is None:
            return None
        if not re.fullmatch(r"[0-9]{1,10}", value, re.ASCII) or not low <= int(value) <= high:
            self.fail(name, f"must be a whole number from {low} to {high}, not {value!r}")
            return None
        return int(value)

    def done(self) -> None:
        """Raise ``ValidationFailed`` (422) with every error found, if any."""
        if self.errors:
            raise ValidationFailed(self.errors)
