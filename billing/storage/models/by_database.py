"""The schema objects that differ between the two databases on purpose (migration
``0017_event_partitions``), for what compares or empties a database against ``Base.metadata``.

On PostgreSQL ``events`` is range-partitioned by month of ``occurred_at`` (``events_YYYY_MM``
and ``events_default``, made by the migration and ahead by the service:
``billing.ingest.partitions``). A partitioned table's unique index must hold the partition key,
so ``uq_events_event_id`` exists on SQLite only, and ``event_ids`` (``event_id`` primary key,
``content_hash`` as its 32 bytes), on PostgreSQL only, is the authority on which events are
stored; ``events`` has there only ``ix_events_unnumbered``, on ``event_id`` of its rows
without a call number (ingest's ``FILL_CALL_NO``). The models describe SQLite's shape;
``event_ids`` is written by ingest's and the archive's PostgreSQL statements only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: Tables only PostgreSQL has (not in ``Base.metadata``).
POSTGRES_ONLY_TABLES = ("event_ids",)
#: ``events``' partitions on PostgreSQL.
EVENT_PARTITION = re.compile(r"^events_(\d{4}_\d{2}|default)$")
#: Indexes and constraints that differ on PostgreSQL (the models describe SQLite's), by name.
POSTGRES_DIFFERS = ("uq_events_event_id", "ix_events_unnumbered")


def only_on_postgres(name: str) -> bool:
    """Whether a table of that name is one PostgreSQL has and the models do not describe."""
    return name in POSTGRES_ONLY_TABLES or EVENT_PARTITION.match(name) is not None


def compared(dialect: str) -> Callable[[object, str | None, str, bool, object | None], bool]:
    """Alembic's ``include_object`` for a comparison of ``dialect``'s database with the models:
    leaves out what only the other database has, and PostgreSQL's own tables."""

    def include(
        _object: object, name: str | None, type_: str, _reflected: bool, _other: object | None
    ) -> bool:
        if name is None or dialect != "postgresql":
            return True
        if type_ == "table":
            return not only_on_postgres(name)
        return name not in POSTGRES_DIFFERS

    return include
