"""The rows that cross the provider reports' repository (``billing.providers.repository``)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple


class BucketKey(NamedTuple):
    """A report bucket: provider, kind (``usage`` or ``cost``), ``[start, end)`` in UTC."""

    provider: str
    kind: str
    start: datetime
    end: datetime


class CurrentLine(NamedTuple):
    """A line of a bucket's current version, as the drift reads it."""

    provider: str
    kind: str
    start: datetime
    end: datetime
    model: str | None
    upstream_account: str | None
    service_tier: str | None
    requests: int | None
    input_tokens: int | None
    cache_read_input_tokens: int | None
    cache_creation_input_tokens: int | None
    output_tokens: int | None
    cost_usd: str | None
