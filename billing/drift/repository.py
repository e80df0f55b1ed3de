"""The SQL of the drift's "ours", as a ``Protocol``: ``billing.storage.sqlite.drift`` and
``billing.storage.postgres.drift`` implement it; ``store_for(session).drift`` picks one (the
provider's figures come from ``billing.providers.repository``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

from sqlalchemy.orm import Session

Grain = Literal["day", "hour"]


#: ``drift_rollups.level``: UTC hours, UTC days.
HOUR, DAY = 0, 1
#: A span of time, ``[start, end)``.
Span = tuple[datetime, datetime]


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


class OursRow(NamedTuple):
    """Our calls started in one UTC slot, summed per provider, model, upstream account and
    served tier (``calls.service_tier``, null where the upstream named none).

    ``slot`` is the slot's start as text, ``YYYY-MM-DD`` (day) or ``YYYY-MM-DD HH`` (hour);
    ``requests`` counts upstream attempts (a call not reconciled yet counts one); tokens in the
    contract's semantics (``output_tokens`` = billed output); ``cost_pusd`` the calls' cost in
    picodollars (what their ledger holds for a settled call; unpriced calls add nothing);
    ``unpriced`` the settled calls without a cost (CONTRACT: never silently free, so the
    group's cost is unknown)."""

    slot: str
    provider: str | None
    model: str | None
    upstream_account: str | None
    service_tier: str | None
    requests: int
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    output_tokens: int
    cost_pusd: int
    unpriced: int


#: A ``drift_rollups`` row's key, as the database returns it: the hour (the driver's value),
#: provider, model, upstream account, served tier (``''`` for none).
RollupKey = tuple[Any, str, str, str, str]
#: Its summed columns (``billing.storage.models.DriftRollup``): calls, requests, input, cache
#: read, cache creation and output tokens, cost whole dollars, cost picodollars, unpriced calls.
RollupSums = list[int]


class DriftRepository(Protocol):
    """The drift's statements on one database."""

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        """Calls with ``since <= started_at < until`` (of ``provider``, or all), summed per
        ``grain`` slot in UTC, provider, model, upstream account and served tier: the whole
        hours from ``drift_rollups`` and the calls it does not hold, the ragged hours at either
        end from ``calls``. A key may come in several rows (the caller sums them)."""
        ...

    def contributions(
        self, session: Session, request_ids: Sequence[str]
    ) -> dict[RollupKey, RollupSums]:
        """What the calls ``request_ids`` (as stored now) add to ``drift_rollups``, summed per
        row; the caller says which calls it holds."""
        ...

    def day_of(self, hour: Any) -> Any:
        """The day of a ``RollupKey``'s hour, as the driver gives a ``bucket_start``."""
        ...

    def add(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        """Add ``(level, bucket_start, *RollupKey[1:], *RollupSums)`` rows (in key order, the
        lock order of every reconciler) into ``drift_rollups``: ``x = x + excluded.x``."""
        ...

    def rebuild(self, session: Session) -> None:
        """Empty ``drift_rollups`` and sum into it every settled call with a start and a
        ``stream.started`` (no ``started_missing`` anomaly), by hour, then the hours by day,
        set-based."""
        ...
