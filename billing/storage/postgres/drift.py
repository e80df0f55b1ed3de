"""The drift's "ours" on PostgreSQL (``billing.drift.repository.DriftRepository``).

One aggregate per UTC slot (``generate_series`` of the days or hours, each a range of the
covering index ``ix_calls_drift``, read index-only), grouped by plain columns: the planner
knows from their statistics that a slot has few groups and hashes them, where one aggregate
grouped by an expression of the start is estimated at a group per call and sorted, on disk
past ``work_mem``. The slot is written as the ``OursRow`` text here, for the few groups.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from billing.drift.repository import Grain, OursRow

#: The ``OursRow`` text of a slot, per grain.
_SLOT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d %H"}

OURS = (
    "SELECT d.slot, a.* FROM generate_series("
    "date_trunc('{grain}', %(since)s AT TIME ZONE 'UTC'), "
    "%(until)s AT TIME ZONE 'UTC' - interval '1 microsecond', interval '1 {grain}') AS d(slot) "
    "CROSS JOIN LATERAL (SELECT provider, model, upstream_account, service_tier, "
    "sum(greatest(attempts, 1))::bigint, sum(input_tokens)::bigint, "
    "sum(cache_read_input_tokens)::bigint, sum(cache_creation_input_tokens)::bigint, "
    "sum(output_tokens_billed)::bigint, coalesce(sum(cost_pusd), 0) FROM calls "
    "WHERE started_at >= greatest(d.slot AT TIME ZONE 'UTC', %(since)s) "
    "AND started_at < least((d.slot + interval '1 {grain}') AT TIME ZONE 'UTC', %(until)s) "
    "AND (%(provider)s::text IS NULL OR provider = %(provider)s::text) "
    "GROUP BY provider, model, upstream_account, service_tier) AS a"
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
            OursRow(row[0].strftime(pattern), *row[1:5], *(int(value) for value in row[5:]))
            for row in rows
        ]


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresDrift()
