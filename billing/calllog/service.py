"""Reading calls: one call with its events and ledger entries."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.calllog.views import call_json, event_json, ledger_entry_json
from billing.errors import NotFound
from billing.reconcile.service import preview_call
from billing.storage.models import Call, Event, LedgerEntry


def get_call(session: Session, request_id: str) -> dict[str, Any]:
    """The call object plus ``events`` (by ``occurred_at``, then arrival) and ``ledger_entries``
    (in booking order). An open call with events not yet reconciled shows provisional figures
    computed from its events; a settled call shows the sum of its ledger entries. Use inside a
    read-only transaction (it is never committed). Raises ``NotFound`` (404) for an unknown
    ``request_id``."""
    call = session.get(Call, request_id)
    if call is None:
        raise NotFound(
            f"no call with request_id {request_id!r}; calls appear once one of their events "
            "has been accepted by POST /v1/events"
        )
    if call.pending and not call.settled:
        # Not reconciled since its last event: show figures computed from the events now. A
        # settled call keeps showing what its ledger holds until a pass books the late events.
        preview_call(session, call)
    events = session.scalars(
        # By the call's number: the index of a call's events (see Event).
        select(Event).where(Event.call_no == call.call_no).order_by(Event.occurred_at, Event.seq)
    )
    entries = session.scalars(
        select(LedgerEntry).where(LedgerEntry.request_id == request_id).order_by(LedgerEntry.seq)
    )
    return {
        **call_json(call),
        "events": [event_json(e) for e in events],
        "ledger_entries": [ledger_entry_json(e) for e in entries],
    }
