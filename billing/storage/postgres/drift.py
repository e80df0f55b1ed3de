"""The drift's "ours" on PostgreSQL (``billing.drift.repository.DriftRepository``).

The slot is the call's start in UTC as text, ``YYYY-MM-DD`` or ``YYYY-MM-DD HH`` (as on
SQLite); the sums are read from the covering index ``ix_calls_drift``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow

#: ``to_char`` patterns of the slot, per grain.
_SLOT = {"day": "YYYY-MM-DD", "hour": "YYYY-MM-DD HH24"}

OURS = (
    "SELECT to_char(started_at AT TIME ZONE 'UTC', '{pattern}') AS slot, provider, model, "
    "upstream_account, sum(greatest(attempts, 1))::bigint, sum(input_tokens)::bigint, "
    "sum(cache_read_input_tokens)::bigint, sum(cache_creation_input_tokens)::bigint, "
    "sum(output_tokens_billed)::bigint, coalesce(sum(cost_pusd), 0) "
    "FROM calls WHERE started_at >= %(since)s AND started_at < %(until)s "
    "AND (%(provider)s::text IS NULL OR provider = %(provider)s::text) "
    "GROUP BY slot, provider, model, upstream_account"
)


class PostgresDrift:
    """``DriftRepository`` on PostgreSQL."""

    def ours(
        self,
        session: Session,
        since: datetime,
        until: datetime,
        provider: str | None,
        grain: Grain,
    ) -> list[OursRow]:
        rows = session.connection().exec_driver_sql(
            OURS.format(pattern=_SLOT[grain]),
            {"since": since, "until": until, "provider": provider},
        )
        return [OursRow(*row[:4], *(int(value) for value in row[4:])) for row in rows]


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresDrift()
