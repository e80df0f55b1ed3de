"""Local periods for ``GET /v1/usage`` and the ``usage.csv`` export alike: splitting a range at
the local (zone) hours, days and months, and the labels of those periods.

Pure: no database. The UTC rollup buckets that cover each local period are
``billing.rollups.buckets``.

Labels (the contract's names of local periods, one function per dimension for both callers): an
instant is shown in the zone, then cut to the start of its hour, day or month. ``hour`` is that
local hour's start in RFC 3339 with the zone's offset at that moment
(``2026-10-25T02:00:00+02:00`` and ``2026-10-25T02:00:00+01:00`` are the two 02:00 hours of a
daylight-saving fall-back day), ``day`` is ``YYYY-MM-DD`` and ``month`` is ``YYYY-MM`` of the local
date. ``label`` names the period starting at an instant (``/v1/usage``); ``Buckets`` labels a
stream of stored booking instants (the export), memoised per UTC quarter hour.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from billing.rollups.buckets import QUARTER, QUARTER_HOUR, floor

#: The time dimensions of ``group_by``, finest first.
TIME_DIMS = ("hour", "day", "month")

_TICK = timedelta(microseconds=1)


# --- local periods ------------------------------------------------------------------------------


def _local_midnight(day: date, zone: ZoneInfo) -> datetime:
    # fold=0: where midnight is skipped, this is the instant the day begins; where it repeats,
    # the first one.
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


def period_starts(dim: str, since: datetime, until: datetime, zone: ZoneInfo) -> list[datetime]:
    """The UTC instants at which local ``dim`` periods (hour, day, month) begin, from the start of
    the period holding ``since`` up to (not including) ``until``; in order."""
    if dim == "hour":
        return _hour_starts(since, until, zone)
    local = since.astimezone(zone).date()
    day = local.replace(day=1) if dim == "month" else local
    starts = []
    while (start := _local_midnight(day, zone)) < until:
        starts.append(start)
        if dim == "month":
            day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
        else:
            day += timedelta(days=1)
    if not starts or starts[0] > since:
        starts.insert(0, since)  # never drop the head of the range, whatever the zone does
    return starts


def _hour_starts(since: datetime, until: datetime, zone: ZoneInfo) -> list[datetime]:
    """Local hours begin where the local clock reads minute 0; every offset in use is a multiple
    of 15 minutes, so it suffices to look at 15-minute UTC edges. The first start is the local
    hour holding ``since`` (at most a few hours back, across a daylight-saving change)."""
    t = floor(QUARTER, since) - timedelta(hours=3)
    starts: list[datetime] = []
    while t < until:
        local = t.astimezone(zone)
        if local.minute == 0 and local.second == 0:
            starts.append(t)
        t += QUARTER_HOUR
    first = bisect_right(starts, since) - 1
    return starts[max(first, 0) :] if starts else [since]


@dataclass(frozen=True)
class Segment:
    """The part ``[start, end)`` of the range inside the local period beginning at ``label_at``."""

    label_at: datetime
    start: datetime
    end: datetime


def segments(dim: str | None, since: datetime, until: datetime, zone: ZoneInfo) -> list[Segment]:
    """Split ``[since, until)`` at the local period edges of ``dim`` (None: one segment)."""
    if dim is None:
        return [Segment(since, since, until)]
    starts = period_starts(dim, since, until, zone)
    result = []
    for i, label_at in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else until
        result.append(Segment(label_at, max(label_at, since), min(end, until)))
    return result


# --- labels -------------------------------------------------------------------------------------


def _hour(local: datetime) -> str:
    return local.replace(minute=0, second=0, microsecond=0).isoformat()


def _day(local: datetime) -> str:
    return f"{local.year:04d}-{local.month:02d}-{local.day:02d}"


def _month(local: datetime) -> str:
    return f"{local.year:04d}-{local.month:02d}"


_LABELS: dict[str, Callable[[datetime], str]] = {"hour": _hour, "day": _day, "month": _month}


def label(dim: str, at: datetime, zone: ZoneInfo) -> str:
    """The contract's name of the local ``dim`` period (``hour``, ``day``, ``month``) holding the
    aware instant ``at``: ``hour`` as RFC 3339 with the zone's offset
    (``2026-10-25T02:00:00+01:00``), ``day`` as ``YYYY-MM-DD``, ``month`` as ``YYYY-MM``.
    ``KeyError`` for another ``dim``."""
    return _LABELS[dim](at.astimezone(zone))


def parse_utc_text(text: str) -> datetime:
    """Stored UTC text (``YYYY-MM-DD HH:MM:SS.ffffff``, as SQLite holds ``UTCDateTime``) → an aware
    UTC datetime; ``ValueError`` if it is not such text."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def hour_sort_key(hour: str) -> datetime:
    """The instant an ``hour`` label starts at (aware): hour labels sort by instant, not by text."""
    return datetime.fromisoformat(hour)


class Buckets:
    """Labels of the time dimensions ``keys`` (in that order, names from ``TIME_DIMS``) for
    instants in ``zone``; ``KeyError`` for another name.

    For a long stream of instants in booking order (the ``usage.csv`` export): converting each one
    to the zone would cost more than the rest of a row, so labels are worked out once per UTC
    quarter hour. When the zone's offset is the same at both ends of the quarter and a whole
    number of quarter hours (every zone since the 1970s), no period starts inside it, so the
    labels hold for the whole quarter; anything else is labelled instant by instant.
    """

    def __init__(self, zone: ZoneInfo, keys: tuple[str, ...]) -> None:
        self.zone = zone
        self.keys = keys
        self._label_fns = tuple(_LABELS[k] for k in keys)
        self._minute: str | None = None
        self._minute_labels: tuple[str, ...] = ()
        self._quarter: str | None = None
        self._quarter_labels: tuple[str, ...] | None = None

    def at(self, instant: datetime) -> tuple[str, ...]:
        """The labels (one per key) of one aware instant."""
        local = instant.astimezone(self.zone)
        return tuple(fn(local) for fn in self._label_fns)

    def labels(self, text: str) -> tuple[str, ...]:
        """The labels (one per key) of the instant written as stored UTC text
        ``YYYY-MM-DD HH:MM:SS.ffffff``; consecutive instants in the same minute are answered from
        the previous result, a new minute from the quarter-hour memo."""
        if not self.keys:
            return ()
        minute = text[:16]
        if minute == self._minute:
            return self._minute_labels
        quarter = f"{text[:14]}{int(text[14:16]) // 15 * 15:02d}"
        if quarter != self._quarter:
            self._quarter = quarter
            self._quarter_labels = self._uniform(parse_utc_text(quarter))
        if self._quarter_labels is None:
            # The zone's offset changes inside this quarter hour: label this instant alone.
            self._minute = None
            return self.at(parse_utc_text(text))
        self._minute = minute
        self._minute_labels = self._quarter_labels
        return self._quarter_labels

    def _uniform(self, start: datetime) -> tuple[str, ...] | None:
        first = start.astimezone(self.zone)
        last = (start + QUARTER_HOUR - _TICK).astimezone(self.zone)
        offset = first.utcoffset()
        if offset is None or offset != last.utcoffset() or offset % QUARTER_HOUR:
            return None
        return tuple(fn(first) for fn in self._label_fns)
