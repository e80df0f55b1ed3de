"""The SQL of the drift's "ours", as a ``Protocol``: ``billing.storage.sqlite.drift`` and
``billing.storage.postgres.drift`` implement it; ``store_for(session).drift`` picks one (the
provider's figures come from ``billing.providers.repository``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, NamedTuple, Protocol

from sqlalchemy.orm import Session

Grain = Literal["day", "hour"]


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


class DriftRepository(Protocol):
    """The drift's statement on one database."""

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        """Calls with ``since <= started_at < until`` (of ``provider``, or all), summed per
        ``grain`` slot in UTC, provider, model and upstream account."""
        ...
