"""What the drift's SQL shares on both databases: how a period is read (which spans from
``drift_rollups``, which from ``calls``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from billing.drift.rows import Grain, Span
from billing.rollups.rows import DAY, HOUR


def _floor(at: datetime, level: int) -> datetime:
    at = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return at.replace(hour=0) if level == DAY else at


def _ceil(at: datetime, level: int) -> datetime:
    floor = _floor(at, level)
    if floor == at:
        return floor
    return floor + (timedelta(days=1) if level == DAY else timedelta(hours=1))


def spans(
    since: datetime, until: datetime, grain: Grain
) -> tuple[list[Span], Span | None, list[tuple[int, Span]]]:
    """How ``[since, until)`` is read at ``grain``: the ragged spans (less than an hour at either
    end) from ``calls``; the whole hours (None: none) from ``drift_rollups`` and, for the calls
    it does not hold, from ``calls``; and the rollup's spans, as ``(level, span)``: whole days
    at the day level where the grain is a day, the hours around them at the hour level."""
    first, end = _ceil(since, HOUR), _floor(until, HOUR)
    if first >= end:
        return [(since, until)], None, []
    ragged = [(a, b) for a, b in ((since, first), (end, until)) if a < b]
    day_first, day_end = _ceil(first, DAY), _floor(end, DAY)
    if grain == "hour" or day_first >= day_end:
        return ragged, (first, end), [(HOUR, (first, end))]
    hours = [(HOUR, (a, b)) for a, b in ((first, day_first), (day_end, end)) if a < b]
    return ragged, (first, end), [(DAY, (day_first, day_end)), *hours]
