"""Time buckets, for ``GET /v1/usage`` and the ``usage.csv`` export alike: the UTC rollup levels,
local (zone) periods, splitting a range into buckets, and the labels of local hours, days and
months.

Pure: no database. The rollups hold UTC buckets of four widths (``LEVELS``). Every zone in use
today is offset from UTC by a multiple of 15 minutes, so each local hour, day and month starts on
a 15-minute UTC edge; a range is then covered exactly by whole rollup buckets, the coarsest that
fit (``cover``). Instants off a 15-minute edge (a ``since`` of 10:07, or a historic offset) leave
a short remainder that is read from the raw rows (at most 15 minutes at each such edge).

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

QUARTER, HOUR, DAY, MONTH = 0, 1, 2, 3
#: The rollup levels, finest first.
LEVELS = (QUARTER, HOUR, DAY, MONTH)
#: The time dimensions of ``group_by``, finest first.
TIME_DIMS = ("hour", "day", "month")

_Q = timedelta(minutes=15)
_TICK = timedelta(microseconds=1)


def floor(level: int, t: datetime) -> datetime:
    """The start of the UTC bucket of ``level`` that holds ``t`` (aware, returned in UTC)."""
    t = t.astimezone(UTC)
    if level == QUARTER:
        return t.replace(minute=t.minute - t.minute % 15, second=0, microsecond=0)
    if level == HOUR:
        return t.replace(minute=0, second=0, microsecond=0)
    if level == DAY:
        return t.replace(hour=0, minute=0, second=0, microsecond=0)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def step(level: int, start: datetime) -> datetime:
    """The start of the bucket after the one starting at ``start``."""
    if level == QUARTER:
        return start + _Q
    if level == HOUR:
        return start + timedelta(hours=1)
    if level == DAY:
        return start + timedelta(days=1)
    return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)


def ceil(level: int, t: datetime) -> datetime:
    """The first start of a UTC bucket of ``level`` at or after ``t``."""
    start = floor(level, t)
    return start if start == t else step(level, start)


@dataclass(frozen=True)
class Run:
    """Consecutive rollup buckets of one ``level`` in ``[start, end)``, inside segment ``seg``."""

    seg: int
    level: int
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Window:
    """A stretch ``[start, end)`` of segment ``seg`` too short for any bucket: read from the raw
    rows."""

    seg: int
    start: datetime
    end: datetime


def _runs(seg: int, start: datetime, end: datetime) -> list[Run]:
    """Cover ``[start, end)`` (both on 15-minute edges) with the coarsest buckets: climb from
    ``start`` level by level to the coarsest edge that fits, then come down towards ``end``.
    At most 7 runs (two per level below the top one)."""
    runs: list[Run] = []

    def take(level: int, until: datetime) -> None:
        if runs and runs[-1].level == level:  # the climb and the descent meet at one level
            runs[-1] = Run(seg, level, runs[-1].start, until)
        else:
            runs.append(Run(seg, level, t, until))

    t, top = start, MONTH
    for level in LEVELS[:-1]:
        edge = ceil(level + 1, t)
        if edge > end:
            top = level
            break
        if edge > t:
            take(level, edge)
            t = edge
    for level in reversed(LEVELS[: top + 1]):
        edge = floor(level, end)
        if edge > t:
            take(level, edge)
            t = edge
    return runs


def cover(segments: list[tuple[datetime, datetime]]) -> tuple[list[Run], list[Window]]:
    """Cover each of the ``segments`` exactly by rollup bucket runs and raw windows.

    No bucket crosses a segment edge, so every bucket belongs to one segment (``seg`` is the
    segment's index); a segment edge off the 15-minute grid leaves a raw window of < 15 minutes.
    """
    runs: list[Run] = []
    windows: list[Window] = []
    for seg, (start, end) in enumerate(segments):
        head = min(end, ceil(QUARTER, start))
        tail = max(head, floor(QUARTER, end))
        if head > start:
            windows.append(Window(seg, start, head))
        runs += _runs(seg, head, tail)
        if end > tail:
            windows.append(Window(seg, tail, end))
    return runs, windows


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
        t += _Q
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
        last = (start + _Q - _TICK).astimezone(self.zone)
        offset = first.utcoffset()
        if offset is None or offset != last.utcoffset() or offset % _Q:
            return None
        return tuple(fn(first) for fn in self._label_fns)
