"""The SQL of ingest, as the methods a store implements (``billing.storage.sqlite.ingest``,
``billing.storage.postgres.ingest``); domain code reaches it as ``store_for(conn).ingest``.

Every method runs on ``conn`` inside the caller's transaction and never commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from billing.ingest.prepare import EventRow

#: Per call (by request_id): [first received, last received, the ``EventRow`` of the
#: ``stream.started`` that sets the call's fields or None, the batch number that brought it]
#: (``billing.ingest.service`` builds it from the new events).
CallFields = dict[str, list[Any]]


class CallRaced(Exception):
    """A call of the group was committed by another transaction after this one's snapshot, so
    the events statement could neither create nor lock it (PostgreSQL): roll back and write the
    group again."""


class Inserted:
    """What ``insert_events`` did, handed back to ``touch_calls``."""

    __slots__ = ("ids", "quiet", "stored")

    def __init__(self, ids: set[str] | None, quiet: set[str], stored: object = None) -> None:
        #: The event ids inserted, or None when every row was.
        self.ids = ids
        #: The calls that need no ``touch_calls``: created with these events, or stored and
        #: found pending with a key once locked.
        self.quiet = quiet
        #: What the store read of the calls before inserting (its own shape, for ``touch_calls``).
        self.stored = stored


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
