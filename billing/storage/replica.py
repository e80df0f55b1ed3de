"""How recent a database's data is: the ``as_of`` of an answer read from a replica (CONTRACT
"Replicas, failover and archives (v3)": no later than what the replica has replayed).

A PostgreSQL standby (``pg_is_in_recovery()``) has every transaction committed up to
``pg_last_xact_replay_timestamp()``, the primary's commit time of the last one it replayed; a
primary (or SQLite) has everything up to now. It is read *before* the snapshot the answer is read
from is taken (``billing.api.state.routed``), so the snapshot holds at least what was replayed at
``as_of``. ``None``: a standby that has replayed nothing since it started (unknown).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from billing.storage.dialects import ByDialect

_REPLAYED = text(
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_xact_replay_timestamp() "
    "ELSE statement_timestamp() END"
)


def _postgres(session: Session) -> datetime | None:
    value = session.scalar(_REPLAYED)
    return None if value is None else value.astimezone(UTC)


def _sqlite(_session: Session) -> datetime | None:
    return datetime.now(UTC)


_AS_OF = ByDialect(sqlite=_sqlite, postgresql=_postgres)


def replayed_as_of(session: Session) -> datetime | None:
    """The instant up to which the database behind ``session`` holds every commit (UTC)."""
    return _AS_OF.of(session)(session)
