"""The drift's "ours" on PostgreSQL (``billing.drift.repository.DriftRepository``).

The slot is the call's start truncated in UTC (``date_trunc``: far cheaper per row than
``to_char``), written as the ``OursRow`` text here, for the few groups; the sums are read from
the covering index ``ix_calls_drift``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow

#: The ``OursRow`` text of a slot, per grain.
_SLOT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d %H"}

OURS = (
    "SELECT date_trunc('{grain}', started_at AT TIME ZONE 'UTC') AS slot, provider, model, "
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
            OURS.format(grain=grain),
            {"since": since, "until": until, "provider": provider},
        )
        pattern = _SLOT[grain]
        return [
            OursRow(row[0].strftime(pattern), *row[1:4], *(int(value) for value in row[4:]))
            for row in rows
        ]


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresDrift()
