"""Preparing a validated batch for the writer: content hashes, repeats inside the batch, and each
event's column values (CPU only, no database)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from billing.errors import Conflict, EventConflict
from billing.ingest.plain import plain_usage
from billing.ingest.schemas import Event, StreamStarted, StreamTokens, StreamUsage
from billing.ingest.validation import ParsedEvent
from billing.storage.types import sqlite_text


def content_hash(parsed: ParsedEvent) -> str:
    """SHA-256 (hex) of the event's canonical validated form.

    Key order, white space, a defaulted ``attempt`` and the offset an instant is written in do not
    change it (CONTRACT "Ingest": "same content").
    """
    # The event's fields as pydantic's JSON form would give them (``model_dump(mode="json")``),
    # without building that dict: every field is a str, int, None, a str -> str dict or a UTC
    # datetime, which orjson writes exactly as pydantic does with ``Z`` for UTC (a test pins it).
    canonical = orjson.dumps(parsed.event.__dict__, option=_CANONICAL)
    return hashlib.sha256(canonical).hexdigest()


_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_UTC_Z


class StartedFields(NamedTuple):
    """What a ``stream.started`` sets on its call's row (``calls``): the metadata as the JSON
    text the row stores, the provider defaulted from the protocol."""

    api_key_id: str
    model: str
    protocol: str
    metadata: str
    provider: str
    upstream_account: str | None


class EventRow:
    """One event to store: the first occurrence of its ``event_id`` in its batch, with the
    column values of its ``events`` row computed up front, on the request's side (the writer
    thread is the serial part of ingest: it only runs the statements), but for SQLite's text of
    ``occurred_at`` (``occurred_text``, made as it is read: PostgreSQL never reads it). Each
    database's statements read the attributes they bind (``billing.ingest.sql``)."""

    __slots__ = (
        "attempt",
        "body",
        "digest",
        "event_id",
        "index",
        "occurred_at",
        "output_tokens_delivered",
        "output_tokens_generated",
        "plain_usage",
        "received",
        "received_text",
        "request_id",
        "started",
        "type",
    )

    def __init__(
        self,
        digest: str,
        index: int,
        event: Event,
        raw: dict[str, Any],
        received: datetime,
        received_text: str,
    ) -> None:
        self.event_id = event.event_id
        self.request_id = event.request_id
        self.attempt = event.attempt
        self.type = event.type
        self.occurred_at = event.occurred_at
        self.received = received
        #: ``received`` as the fixed-format UTC text of ``sqlite_text`` (once per batch).
        self.received_text = received_text
        #: The content hash (``content_hash``) and the index of the event in its batch.
        self.digest = digest
        self.index = index
        #: The JSON the gateway sent.
        self.body = body = orjson.dumps(raw).decode()
        #: The counters of a ``stream.tokens`` (None for the other types).
        self.output_tokens_delivered: int | None = None
        self.output_tokens_generated: int | None = None
        if isinstance(event, StreamTokens):
            self.output_tokens_delivered = event.output_tokens_delivered
            self.output_tokens_generated = event.output_tokens_generated
        #: A ``stream.usage``'s flag (``billing.ingest.plain``); None for the other types.
        self.plain_usage = plain_usage(body) if isinstance(event, StreamUsage) else None
        #: For a ``stream.started``, what it sets on its call's row.
        self.started: StartedFields | None = (
            StartedFields(
                event.api_key_id,
                event.model,
                event.protocol,
                json.dumps(event.metadata),
                event.provider_name(),
                event.upstream_account,
            )
            if isinstance(event, StreamStarted)
            else None
        )

    @property
    def occurred_text(self) -> str:
        """``occurred_at`` as the fixed-format UTC text of ``sqlite_text``: made when SQLite's
        statements read it (once per event), not up front, which PostgreSQL's never do."""
        return sqlite_text(self.occurred_at)


@dataclass(frozen=True)
class PreparedBatch:
    """A validated batch with its content hashes, ready to be stored (see ``prepare_batch``)."""

    events: Sequence[ParsedEvent]
    now: datetime
    rows: list[EventRow]


def prepare_batch(batch: Sequence[ParsedEvent], now: datetime) -> PreparedBatch:
    """Hash every event and drop repeats inside the batch (CPU only, no database).

    An ``event_id`` repeated in the batch with the same content is a duplicate; with different
    content ``EventConflict`` is raised (listing each later repeat by its index).
    """
    first: dict[str, EventRow] = {}
    rows: list[EventRow] = []
    conflicts: list[Conflict] = []
    received_text = sqlite_text(now)
    for index, parsed in enumerate(batch):
        event = parsed.event
        event_id = event.event_id
        digest = content_hash(parsed)
        seen = first.get(event_id)
        if seen is not None:
            if seen.digest != digest:
                conflicts.append(Conflict(index, event_id))
            continue
        row = EventRow(digest, index, event, parsed.raw, now, received_text)
        first[event_id] = row
        rows.append(row)
    if conflicts:
        raise EventConflict(conflicts)
    return PreparedBatch(batch, now, rows)
