"""The SQL of the drift's "ours", as a ``Protocol``, and ``repository(session)``, which gives
the SQLite or the PostgreSQL implementation (``billing.drift.sql``). The provider's figures come
from ``billing.providers.repository``; ``drift_rollups`` is kept by ``billing.rollups.drift``."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from billing.drift.rows import CallCosts, Grain, OursRow
from billing.drift.sql.postgres import PostgresDrift
from billing.drift.sql.sqlite import SqliteDrift
from billing.storage.dialects import ByDialect


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

    def differing_calls(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        before: tuple[datetime, str] | None,
        limit: int,
    ) -> list[CallCosts]:
        """The calls started in ``[since, until)`` whose provider's own cost differs from
        ours, newest first, after ``before`` (``started_at``, ``request_id``)."""
        ...


_REPOSITORIES: ByDialect[DriftRepository] = ByDialect(
    sqlite=SqliteDrift(), postgresql=PostgresDrift()
)


def repository(session: Session) -> DriftRepository:
    """The drift's repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
