"""The SQL the provider reports need, as a ``Protocol``, and ``repository(session)``, which
gives the SQLite or the PostgreSQL implementation (``billing.providers.sql``).

Tables (``billing.storage.models``): ``provider_report_versions`` (one row per version of a
bucket, unique per bucket and version number) and ``provider_report_lines`` (a version's
results in the contract's token semantics, ``cost_usd`` as exact decimal text).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.providers.rows import BucketKey, CurrentLine
from billing.providers.sql.postgres import PostgresProviders
from billing.providers.sql.sqlite import SqliteProviders
from billing.storage.dialects import ByDialect


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


_REPOSITORIES: ByDialect[ProvidersRepository] = ByDialect(
    sqlite=SqliteProviders(), postgresql=PostgresProviders()
)


def repository(session: Session) -> ProvidersRepository:
    """The provider reports' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
