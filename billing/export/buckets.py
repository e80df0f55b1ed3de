"""Time buckets of the usage export: where the ``tz`` zone's hours, days and months begin.

A booking instant (UTC) is shown in the zone, then cut to the start of its hour, day or month:
``hour`` is that local hour's start in RFC 3339 with the zone's offset at that moment
(``2026-10-25T02:00:00+02:00`` and ``2026-10-25T02:00:00+01:00`` are the two 02:00 hours of a
daylight-saving fall-back day), ``day`` is ``YYYY-MM-DD`` and ``month`` is ``YYYY-MM`` of the local
date. Buckets partition time, so per-day exports always add up to the export of the whole range.

Instants arrive as stored UTC text (``YYYY-MM-DD HH:MM:SS.ffffff``) in booking order. Converting
each one to the zone would cost more than the rest of a row, so labels are worked out once per UTC
quarter hour: when the zone's offset is the same at both ends of the quarter and a whole number of
quarter hours (every zone since the 1970s), no bucket starts inside it, so the labels hold for the
whole quarter. Anything else is labelled instant by instant.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

_QUARTER = timedelta(minutes=15)
_TICK = timedelta(microseconds=1)


def _hour(local: datetime) -> str:
    return local.replace(minute=0, second=0, microsecond=0).isoformat()


def _day(local: datetime) -> str:
    return f"{local.year:04d}-{local.month:02d}-{local.day:02d}"


def _month(local: datetime) -> str:
    return f"{local.year:04d}-{local.month:02d}"


_LABELS: dict[str, Callable[[datetime], str]] = {"hour": _hour, "day": _day, "month": _month}


def parse_utc_text(text: str) -> datetime:
    """Stored UTC text → an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def hour_sort_key(label: str) -> datetime:
    """The instant an ``hour`` label starts at (labels sort by instant, not by text)."""
    return datetime.fromisoformat(label)


class Buckets:
    """Labels of the time keys ``keys`` (in that order) for instants in ``zone``.

    Call :meth:`labels` with stored UTC text; consecutive instants in the same minute are answered
    from the previous result, a new minute from the quarter-hour memo.
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
        """The labels of one aware instant."""
        local = instant.astimezone(self.zone)
        return tuple(fn(local) for fn in self._label_fns)

    def labels(self, text: str) -> tuple[str, ...]:
        """The labels of the instant written as stored UTC text ``YYYY-MM-DD HH:MM:SS.ffffff``."""
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
        last = (start + _QUARTER - _TICK).astimezone(self.zone)
        offset = first.utcoffset()
        if offset is None or offset != last.utcoffset() or offset % _QUARTER:
            return None
        return tuple(fn(first) for fn in self._label_fns)
