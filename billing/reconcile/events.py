"""A step's calls' stored events, read back as the rule reads them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from billing.reconcile.repository import ReconcileRepository
from billing.reconcile.stored import AnyEvent, StoredTokens, decode
from billing.storage.store import store_for


def load_events(
    session: Session, request_ids: Sequence[str], arrivals: dict[str, Any] | None = None
) -> dict[str, list[AnyEvent]]:
    """Every stored event of the given calls as the rule reads them (in no particular order:
    the rule does not depend on it).

    ``arrivals``, when given, receives each call's last arrival: the latest ``received_at`` of
    its events, as the driver returns it (see ``ReconcileRepository.driver_time``). The
    ``calls`` row does not have it while the call is pending (ingest leaves a pending call's row
    alone).

    The ``stream.tokens`` events (most of a call's events) are folded by the database: per call
    and attempt, the largest of each counter (from the columns ingest fills in, see ``Event``)
    and the earliest and latest ``occurred_at``, given to the rule as two events (the earliest
    and the latest) that carry those largest counters. The rule reads nothing else of a
    ``stream.tokens`` event: it keeps the largest of each counter (a smaller one, or one going
    backwards, changes nothing) and the call's earliest and latest ``occurred_at``; so the
    figures are the same as from every event.
    """
    events: dict[str, list[AnyEvent]] = {rid: [] for rid in request_ids}
    if arrivals is None:
        arrivals = {}
    repo: ReconcileRepository = store_for(session).reconcile
    bodies, folds = repo.read_events(session, request_ids)
    for request_id, body, received in bodies:
        events[request_id].append(decode(body))
        _note_arrival(arrivals, request_id, received)
    utc = repo.utc
    for request_id, attempt, first, last, delivered, generated, received in folds:
        _note_arrival(arrivals, request_id, received)
        group = events[request_id]
        group.append(_folded(request_id, attempt, utc(first), delivered, generated, "first"))
        group.append(_folded(request_id, attempt, utc(last), delivered, generated, "last"))
    return events


def _note_arrival(arrivals: dict[str, Any], request_id: str, received: Any) -> None:
    """Keep the latest ``received_at`` per call (as the driver returns it)."""
    seen = arrivals.get(request_id)
    if seen is None or received > seen:
        arrivals[request_id] = received


def _folded(
    request_id: str, attempt: int, when: Any, delivered: Any, generated: Any, which: str
) -> StoredTokens:
    event = StoredTokens.__new__(StoredTokens)
    event.__dict__ = {
        "type": "stream.tokens",
        # Not an id ingest accepts (it cannot collide with a stored event's).
        "event_id": f"\x00tokens:{attempt}:{which}",
        "request_id": request_id,
        "occurred_at": when,
        "attempt": attempt,
        "output_tokens_delivered": int(delivered),
        "output_tokens_generated": int(generated),
    }
    return event
