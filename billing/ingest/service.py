"""Storing a validated batch exactly once: insert-or-skip on ``event_id``, conflicts refused."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from billing.errors import Conflict, EventConflict
from billing.ingest.schemas import StreamStarted
from billing.ingest.validation import ParsedEvent
from billing.storage.models import Call, Event


@dataclass(frozen=True)
class IngestResult:
    """What ``POST /v1/events`` answers: newly stored events and duplicates (CONTRACT "Ingest")."""

    accepted: int
    duplicates: int


def content_hash(parsed: ParsedEvent) -> str:
    """SHA-256 (hex) of the event's canonical validated form.

    Key order, white space, a defaulted ``attempt`` and the offset an instant is written in do not
    change it (CONTRACT "Ingest": "same content").
    """
    canonical = parsed.event.model_dump(mode="json")
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _insert(session: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def store_batch(session: Session, batch: Sequence[ParsedEvent], now: datetime) -> IngestResult:
    """Store a batch atomically inside the caller's transaction (the caller commits).

    Events whose ``event_id`` is already stored, or repeated earlier in the batch, with the same
    content are duplicates; with different content they are conflicts, and ``EventConflict`` is
    raised so that the caller rolls back and nothing of the batch is stored. Every call that got a
    new event is marked pending for the reconciler, with ``last_received_at = now``.
    """
    first_index: dict[str, int] = {}
    hashes: list[str] = []
    conflicts: list[Conflict] = []
    rows: list[dict[str, Any]] = []
    for index, parsed in enumerate(batch):
        digest = content_hash(parsed)
        hashes.append(digest)
        event = parsed.event
        seen = first_index.get(event.event_id)
        if seen is not None:
            if hashes[seen] != digest:
                conflicts.append(Conflict(index, event.event_id))
            continue
        first_index[event.event_id] = index
        rows.append(
            {
                "event_id": event.event_id,
                "request_id": event.request_id,
                "attempt": event.attempt,
                "type": event.type,
                "occurred_at": event.occurred_at,
                "received_at": now,
                "content_hash": digest,
                "body": orjson.dumps(parsed.raw).decode(),
            }
        )
    if conflicts:
        raise EventConflict(conflicts)
    # A fixed order makes concurrent batches take index locks in the same order (no deadlocks).
    rows.sort(key=lambda row: row["event_id"])
    inserted: set[str] = set()
    if rows:
        statement = (
            _insert(session, Event)
            .on_conflict_do_nothing(index_elements=["event_id"])
            .returning(Event.event_id)
        )
        inserted = set(session.scalars(statement, rows))
    skipped = [row["event_id"] for row in rows if row["event_id"] not in inserted]
    if skipped:
        found = session.execute(
            select(Event.event_id, Event.content_hash).where(Event.event_id.in_(skipped))
        )
        stored = {event_id: digest for event_id, digest in found}
        conflicts = [
            Conflict(first_index[event_id], event_id)
            for event_id in skipped
            if stored.get(event_id) != hashes[first_index[event_id]]
        ]
        if conflicts:
            conflicts.sort(key=lambda c: c.index)
            raise EventConflict(conflicts)
    if inserted:
        _touch_calls(session, [p for p in batch if p.event.event_id in inserted], now)
    return IngestResult(accepted=len(inserted), duplicates=len(batch) - len(inserted))


def _touch_calls(session: Session, new_events: Sequence[ParsedEvent], now: datetime) -> None:
    """Create or mark pending the calls with new events; record what stream.started says."""
    calls: dict[str, dict[str, Any]] = {}
    for parsed in new_events:
        event = parsed.event
        row = calls.setdefault(
            event.request_id,
            {
                "request_id": event.request_id,
                "first_received_at": now,
                "last_received_at": now,
                "change_seq": 1,
                "pending": True,
                "status": "open",
                "settled": False,
                "attempts": 0,
                "anomalies": [],
            },
        )
        if isinstance(event, StreamStarted) and (
            "_attempt" not in row or event.attempt < row["_attempt"]
        ):
            row.update(
                _attempt=event.attempt,
                api_key_id=event.api_key_id,
                model=event.model,
                protocol=event.protocol,
                started_at=event.occurred_at,
                metadata_=event.metadata,
            )
    ordered = [calls[key] for key in sorted(calls)]
    plain = [{k: v for k, v in row.items() if k not in _STARTED} for row in ordered]
    statement = _insert(session, Call)
    statement = statement.on_conflict_do_update(
        index_elements=["request_id"],
        set_={
            "last_received_at": statement.excluded.last_received_at,
            "change_seq": Call.change_seq + 1,
            "pending": True,
        },
    )
    session.execute(statement, plain)
    # Call identity comes from the lowest attempt's stream.started; the reconciler recomputes it
    # from the events, this only makes new calls findable by key before their first pass.
    for row in ordered:
        if "_attempt" in row:
            session.execute(
                update(Call)
                .where(Call.request_id == row["request_id"], Call.api_key_id.is_(None))
                .values({getattr(Call, k): row[k] for k in _STARTED if k != "_attempt"})
            )


_STARTED = ("_attempt", "api_key_id", "model", "protocol", "started_at", "metadata_")
