"""A budget's periods: calendar day, week (from Monday), month, or the whole time ("total"),
in the budget's IANA time zone; bounds are UTC instants (CONTRACT "Budgets and alerts (v2)")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

PERIODS = ("day", "week", "month", "total")
#: The start of the one period of a ``total`` budget (it has no end).
TOTAL_START = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; raises ``ValueError`` with a sentence for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"{name!r} is not an IANA time zone (such as 'UTC', 'Europe/Paris')"
        ) from None


def _local_midnight(day: datetime, tz: ZoneInfo) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)


def period_bounds(period: str, tz_name: str, instant: datetime) -> tuple[datetime, datetime | None]:
    """``[start, end)`` (UTC) of the ``period`` of ``instant`` in the zone ``tz_name``; ``end`` is
    None for ``total``. Weeks start on Monday."""
    if period == "total":
        return TOTAL_START, None
    tz = zone(tz_name)
    local = instant.astimezone(tz)
    if period == "day":
        first = local
        nxt = local + timedelta(days=1)
    elif period == "week":
        first = local - timedelta(days=local.weekday())
        nxt = first + timedelta(days=7)
    elif period == "month":
        first = local.replace(day=1)
        nxt = (first + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown period {period!r}")
    return _local_midnight(first, tz), _local_midnight(nxt, tz)


def period_start(period: str, tz_name: str, instant: datetime) -> datetime:
    """The UTC start of the period of ``instant`` (see ``period_bounds``)."""
    return period_bounds(period, tz_name, instant)[0]
