"""The SQL of the finance exports, as a ``Protocol``, and ``repository(session)``, which gives
the SQLite or the PostgreSQL implementation (``billing.export.sql``).

Every method reads ``ledger_entries`` booked in ``[since, until)`` (aware datetimes) in the
session's (read-only) transaction. The chunked reads go through a raw DB-API cursor fetching
``size`` plain tuples at a time (no ORM objects); driver errors are raised as SQLAlchemy's
(``OperationalError`` for an outage), as everywhere else in the service.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from billing.export.sql.postgres import PostgresExport
from billing.export.sql.sqlite import SqliteExport
from billing.storage.dialects import ByDialect


class ExportRepository(Protocol):
    """The exports' statements on one database."""

    def count(self, session: Session, since: datetime, until: datetime) -> int:
        """How many ledger entries the period holds."""

    def totals(self, session: Session, since: datetime, until: datetime) -> Sequence[Any]:
        """``(entries, settlements, unpriced entries, cost high, cost low, *token sums)``: the
        cost of the priced entries summed in two parts (``cost = high * 10**6 + low``, each
        entry's cost divided with truncation) so that no SQL integer sum can overflow; the
        token sums in ``V1_TOKEN_FIELDS`` order; a sum is null for an empty period."""

    def calls_chunks(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        size: int,
        extra: Sequence[str] = (),
    ) -> Iterator[list[Any]]:
        """The ``calls.csv`` rows, ordered by ``booked_at`` then ``entry_id``: the columns of
        ``CALLS_COLUMNS`` in order, ``booked_at`` as RFC 3339 text (as
        ``billing.timefmt.rfc3339``), ``entry_id`` and the token counts as decimal text, the
        prices (micro-USD per million tokens) and the cost (picodollars) as integers; then the
        ``ledger_entries`` columns ``extra`` (a v2 export's, as stored)."""

    def usage_chunks(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        size: int,
        extra: Sequence[str] = (),
    ) -> Iterator[list[Any]]:
        """``(booked_at, api_key_id, model, kind, *tokens, cost_pusd)`` per entry, ordered by
        ``booked_at`` then ``entry_id``; ``booked_at`` as UTC text ``YYYY-MM-DD
        HH:MM:SS.ffffff``, the tokens of the v1 columns (``V1_TOKEN_FIELDS``) in order; then the
        ``ledger_entries`` columns ``extra`` (a v2 export's, as stored)."""

    def focus_chunks(
        self, session: Session, since: datetime, until: datetime, size: int
    ) -> Iterator[list[Any]]:
        """(v3) The FOCUS export's ledger lines (``billing.export.sql.common.focus_query``), at
        most ``size`` a chunk (a server-side cursor on PostgreSQL)."""
        ...


_REPOSITORIES: ByDialect[ExportRepository] = ByDialect(
    sqlite=SqliteExport(), postgresql=PostgresExport()
)


def repository(session: Session) -> ExportRepository:
    """The exports' repository of the database behind ``session``."""
    return _REPOSITORIES.of(session)
