"""The SQL of the provider reports, as a ``Protocol``: ``billing.storage.sqlite.providers`` and
``billing.storage.postgres.providers`` implement it; ``store_for(session).providers`` picks one.

Tables (``billing.storage.models``): ``provider_report_versions`` (one row per version of a
bucket, unique per bucket and version number) and ``provider_report_lines`` (a version's
results in the contract's token semantics, ``cost_usd`` as exact decimal text).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sqlalchemy.orm import Session


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


class ProvidersRepository(Protocol):
    """The provider reports' statements on one database; every method runs in the session's
    transaction."""

    def current_version(self, session: Session, key: BucketKey) -> tuple[int, str] | None:
        """The bucket's current (highest) version number and content hash; None: not stored."""
        ...

    def insert_version(
        self, session: Session, key: BucketKey, version: int, content_hash: str, now: datetime
    ) -> int | None:
        """Insert version ``version`` of the bucket and return its id; None when that version
        exists already (another import stored it first: insert-on-conflict, never an
        error)."""
        ...

    def insert_lines(
        self, session: Session, version_id: int, lines: Sequence[dict[str, Any]]
    ) -> None:
        """Insert a version's lines (dicts of the ``provider_report_lines`` columns but
        ``version_id``)."""
        ...

    def current_lines(
        self, session: Session, provider: str | None, since: datetime, until: datetime
    ) -> list[CurrentLine]:
        """The lines of the current version of every bucket starting in ``[since, until)``
        (of one provider, or all), by bucket start."""
        ...
