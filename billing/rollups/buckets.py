"""The UTC rollup buckets: four levels (15 minutes, hour, day, month), their edges, and the cover
of a range by whole buckets.

Pure: no database. The rollups hold UTC buckets of these widths (``LEVELS``). Every zone in use
today is offset from UTC by a multiple of 15 minutes, so each local hour, day and month starts on
a 15-minute UTC edge; a range is then covered exactly by whole rollup buckets, the coarsest that
fit (``cover``). Instants off a 15-minute edge (a ``since`` of 10:07, or a historic offset) leave
a short remainder that is read from the raw rows (at most 15 minutes at each such edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

QUARTER, HOUR, DAY, MONTH = 0, 1, 2, 3
#: The rollup levels, finest first.
LEVELS = (QUARTER, HOUR, DAY, MONTH)
#: The width of the finest level.
QUARTER_HOUR = timedelta(minutes=15)


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
        return start + QUARTER_HOUR
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
