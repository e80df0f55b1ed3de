"""The SQL of ingest, as a ``Protocol``, and ``repository(conn)``, which gives the SQLite or
the PostgreSQL implementation (``billing.ingest.sql``).

Every method runs on ``conn`` inside the caller's transaction and never commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from billing.ingest.prepare import EventRow
from billing.ingest.rows import CallFields, Inserted
from billing.ingest.sql.postgres import PostgresIngest
from billing.ingest.sql.sqlite import SqliteIngest
from billing.storage.dialects import ByDialect


class IngestRepository(Protocol):
    """Storing a group's events and touching their calls (see ``billing.ingest.service``)."""

    @property
    def writers(self) -> int:
        """Group writer threads per engine (``billing.ingest.writer``)."""
        ...

    @property
    def writers_share_engine(self) -> bool:
        """Whether the writers use the app's engine (and its in-process write lock) rather than
        an engine of their own with ``writers`` connections and no pre-ping."""
        ...

    def insert_events(
        self, conn: Connection, rows: Sequence[EventRow], calls: CallFields, *, fill_raced: bool
    ) -> Inserted:
        """Insert ``rows`` (sorted by event_id) with their call's number, skipping stored
        ``event_id``s; ``calls`` are the rows' calls. A call not stored yet gets its number
        here. Raises ``CallRaced`` for a call another transaction created since this one's
        snapshot, unless ``fill_raced`` (then its events get its number by a second statement,
        and it is locked after the events, out of the usual order)."""
        ...

    def stored_hashes(self, conn: Connection, event_ids: Sequence[str]) -> dict[str, str]:
        """The content hash of each of ``event_ids`` that is stored (event_id -> hash)."""
        ...

    def touch_calls(self, conn: Connection, calls: CallFields, inserted: Inserted) -> None:
        """Create, or mark pending (``last_received_at``: the latest arrival of its new events),
        the calls of ``calls`` that are not pending already, and record what the
        ``stream.started`` of ``calls`` says for a call whose key is not known yet.

        A call that is pending already is left alone: the reconciler will read every event of
        it, the new ones included, and takes the last arrival from them (``received_at``), not
        from the call's row. A pending call still without a key is the exception: its
        ``stream.started`` fills in the key, model and start. Call identity comes from the
        lowest attempt's stream.started; the reconciler recomputes it from the events, this only
        makes new calls findable by key before their first pass.
        """
        ...

    def make_partition(self, conn: Connection, year: int, month: int) -> bool:
        """Give ``events`` a partition for that month of ``occurred_at`` (UTC) if it has none,
        taking its rows out of the default partition; True when one was made. PostgreSQL only
        (SQLite's ``events`` is one table: False)."""
        ...


_REPOSITORIES: ByDialect[IngestRepository] = ByDialect(
    sqlite=SqliteIngest(), postgresql=PostgresIngest()
)


def repository(bind: Connection | Engine) -> IngestRepository:
    """Ingest's repository of the database behind ``bind``."""
    return _REPOSITORIES.of(bind)
