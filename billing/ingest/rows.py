"""The rows that cross ingest's repository (``billing.ingest.repository``); the events' rows
are ``billing.ingest.prepare.EventRow``."""

from __future__ import annotations

from typing import Any

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
