"""The drift's "ours" on SQLite (``billing.drift.repository.DriftRepository``).

``calls.started_at`` is fixed-format UTC text (``billing.storage.types.sqlite_text``), so a
day is its first 10 characters and an hour its first 13. SQLite groups by sorting unless the
rows come in the GROUP BY's order, and sorting a month of calls costs several times reading
them: by day, the statement reads the expression index ``ix_calls_drift_day`` (the day, then
provider, model, upstream account, served tier, then every figure it sums; made by migration
0004 on SQLite only, since an ORM index cannot hold an expression of one dialect), in group
order, without a sort. By hour it reads the covering index ``ix_calls_drift`` and sorts.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow
from billing.storage.types import sqlite_text

_SUMS = (
    "sum(max(attempts, 1)), sum(input_tokens), sum(cache_read_input_tokens), "
    "sum(cache_creation_input_tokens), sum(output_tokens_billed), coalesce(sum(cost_pusd), 0)"
)
#: Per grain; parameters: since, until (``sqlite_text``), the provider or null.
OURS = {
    "day": (
        "SELECT substr(started_at, 1, 10) AS slot, provider, model, upstream_account, "
        "service_tier, "
        f"{_SUMS} FROM calls "
        "WHERE substr(started_at, 1, 10) BETWEEN substr(?1, 1, 10) AND substr(?2, 1, 10) "
        "AND started_at >= ?1 AND started_at < ?2 AND (?3 IS NULL OR provider = ?3) "
        "GROUP BY substr(started_at, 1, 10), provider, model, upstream_account, service_tier"
    ),
    "hour": (
        "SELECT substr(started_at, 1, 13) AS slot, provider, model, upstream_account, "
        "service_tier, "
        f"{_SUMS} FROM calls INDEXED BY ix_calls_drift "
        "WHERE started_at >= ?1 AND started_at < ?2 AND (?3 IS NULL OR provider = ?3) "
        "GROUP BY slot, provider, model, upstream_account, service_tier"
    ),
}


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
            OURS[grain], (sqlite_text(since), sqlite_text(until), provider)
        )
        return [OursRow(*row) for row in rows]


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqliteDrift()
