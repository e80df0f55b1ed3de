"""The rows that cross the drift's repository (``billing.drift.repository``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, NamedTuple

Grain = Literal["day", "hour"]
#: A span of time, ``[start, end)``.
Span = tuple[datetime, datetime]


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


class CallCosts(NamedTuple):
    """A call whose provider reported its own cost (``stream.usage.provider_cost_usd``) and
    whose figure differs from ours: ``cost_pusd`` ours (None: unpriced), ``provider_cost_pusd``
    theirs, both picodollars (``billing.drift.service.call_drift``)."""

    request_id: str
    started_at: datetime
    provider: str | None
    model: str | None
    api_key_id: str | None
    upstream_account: str | None
    settled: bool
    cost_pusd: int | None
    provider_cost_pusd: int
