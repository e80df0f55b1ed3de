"""RFC 3339 formatting of timezone-aware timestamps."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from billing.fields import EARLIEST, LATEST


def rfc3339(value: datetime | None) -> str | None:
    """``2026-10-15T08:00:00Z`` (UTC, microseconds only when present); None stays None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


_MONTH = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])")  # ASCII digits: "２026" is no year


def month_bounds(text: str) -> tuple[datetime, datetime]:
    """``YYYY-MM`` → the month in UTC, ``[first day, first day of the next month)``;
    ``ValueError`` for anything else."""
    match = _MONTH.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a month YYYY-MM, such as 2026-11")
    year, month = int(match[1]), int(match[2])
    # The one range of instants (``billing.fields.EARLIEST``..``LATEST``): no month of year 0.
    if not EARLIEST.year <= year < LATEST.year:
        raise ValueError(f"{text!r} is outside {EARLIEST.year}-01 … {LATEST.year - 1}-12")
    since = datetime(year, month, 1, tzinfo=UTC)
    return since, datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
