"""What the drift's SQL shares on both databases: how a period is read (which spans from
``drift_rollups``, which from ``calls``: ``spans``, ``SqlDrift``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from billing.drift.rows import CallCosts, Grain, OursRow, Span
from billing.rollups.rows import DAY, HOUR
from billing.storage.models import Call

_C = Call.__table__.c


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


class SqlDrift:
    """``DriftRepository`` over a database's two reads of a span: the rollup's rows at a level
    (``read_rollup``) and the calls (``read_calls``: those ``drift_rollups`` does not hold, or
    every call of a ragged span)."""

    def read_rollup(
        self, conn: Any, grain: Grain, level: int, span: Span, provider: str | None
    ) -> list[OursRow]:
        raise NotImplementedError

    def read_calls(
        self, conn: Any, grain: Grain, unrolled: bool, span: Span, provider: str | None
    ) -> list[OursRow]:
        raise NotImplementedError

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        conn = session.connection()
        ragged, whole, rolled = spans(since, until, grain)
        rows: list[OursRow] = []
        for level, span in rolled:
            rows += self.read_rollup(conn, grain, level, span, provider)
        if whole is not None:
            rows += self.read_calls(conn, grain, True, whole, provider)
        for span in ragged:
            rows += self.read_calls(conn, grain, False, span, provider)
        return rows

    def differing_calls(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        before: tuple[datetime, str] | None,
        limit: int,
    ) -> list[CallCosts]:
        """The calls started in ``[since, until)`` (of ``provider``) whose provider reported a
        cost that is not ours (ours unknown included), newest first (``started_at``, then
        ``request_id``, descending), after ``before`` in that order, at most ``limit``. The
        same statement on both databases (the calls' start index, then the filter)."""
        query = select(
            _C.request_id,
            _C.started_at,
            _C.provider,
            _C.model,
            _C.api_key_id,
            _C.upstream_account,
            _C.settled,
            _C.cost_pusd,
            _C.provider_cost_pusd,
        ).where(
            _C.started_at >= since,
            _C.started_at < until,
            _C.provider_cost_pusd.is_not(None),
            or_(_C.cost_pusd.is_(None), _C.cost_pusd != _C.provider_cost_pusd),
        )
        if provider is not None:
            query = query.where(_C.provider == provider)
        if before is not None:
            at, request_id = before
            query = query.where(
                or_(
                    _C.started_at < at,
                    and_(_C.started_at == at, _C.request_id < request_id),
                )
            )
        query = query.order_by(_C.started_at.desc(), _C.request_id.desc()).limit(limit)
        return [
            CallCosts(*row[:6], bool(row[6]), row[7], int(row[8]))
            for row in session.connection().execute(query)
        ]
