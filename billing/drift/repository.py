"""The SQL of the drift's "ours", as a ``Protocol``: ``billing.storage.sqlite.drift`` and
``billing.storage.postgres.drift`` implement it; ``store_for(session).drift`` picks one (the
provider's figures come from ``billing.providers.repository``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

from sqlalchemy.orm import Session

Grain = Literal["day", "hour"]


def whole_hours(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The first whole UTC hour in ``[since, until)`` and the end of the last (``drift_rollups``
    holds those; the first is not before the end when there is none)."""
    since = since.astimezone(UTC)
    first = since.replace(minute=0, second=0, microsecond=0)
    if first != since:
        first += timedelta(hours=1)
    return first, until.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


class OursRow(NamedTuple):
    """Our calls started in one UTC slot, summed per provider, model, upstream account and
    served tier (``calls.service_tier``, null where the upstream named none).

    ``slot`` is the slot's start as text, ``YYYY-MM-DD`` (day) or ``YYYY-MM-DD HH`` (hour);
    ``requests`` counts upstream attempts (a call not reconciled yet counts one); tokens in the
    contract's semantics (``output_tokens`` = billed output); ``cost_pusd`` the calls' cost in
    picodollars (what their ledger holds for a settled call; unpriced calls add nothing)."""

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


#: A ``drift_rollups`` row's key, as the database returns it: the hour (the driver's value),
#: provider, model, upstream account, served tier (``''`` for none).
RollupKey = tuple[Any, str, str, str, str]
#: Its summed columns (``billing.storage.models.DriftRollup``): calls, requests, input, cache
#: read, cache creation and output tokens, cost whole dollars, cost picodollars.
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

    def add(self, session: Session, rows: Sequence[tuple[Any, ...]]) -> None:
        """Add ``(*RollupKey, *RollupSums)`` rows (in key order, the lock order of every
        reconciler) into ``drift_rollups``: ``x = x + excluded.x``."""
        ...

    def rebuild(self, session: Session) -> None:
        """Empty ``drift_rollups`` and sum into it every settled call with a start and a
        ``stream.started`` (no ``started_missing`` anomaly), set-based."""
        ...
