"""The drift's "ours" on SQLite (``billing.drift.repository.DriftRepository``).

``calls.started_at`` is fixed-format UTC text (``billing.storage.types.sqlite_text``), so a
day is its first 10 characters and an hour its first 13; the statement reads the covering index
``ix_calls_drift`` alone (every column it needs is in it).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow
from billing.storage.types import sqlite_text

#: Characters of ``started_at`` that name the slot, per grain.
_SLOT = {"day": 10, "hour": 13}

OURS = (
    "SELECT substr(started_at, 1, {width}) AS slot, provider, model, upstream_account, "
    "sum(max(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), coalesce(sum(cost_pusd), 0) "
    "FROM calls INDEXED BY ix_calls_drift "
    "WHERE started_at >= ? AND started_at < ? AND (? IS NULL OR provider = ?) "
    "GROUP BY slot, provider, model, upstream_account"
)


class SqliteDrift:
    """``DriftRepository`` on SQLite."""

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        rows = session.connection().exec_driver_sql(
            OURS.format(width=_SLOT[grain]),
            (sqlite_text(since), sqlite_text(until), provider, provider),
        )
        return [OursRow(*row) for row in rows]


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqliteDrift()
