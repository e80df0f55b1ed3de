"""The columns ingest's statements write, in the order of their values (both databases)."""

from __future__ import annotations

from operator import attrgetter

#: ``events``: an ``EventRow``'s columns (``billing.ingest.prepare``), then the call's number.
EVENT_COLUMNS = (
    "event_id, request_id, attempt, type, occurred_at, received_at, content_hash, body, "
    "output_tokens_delivered, output_tokens_generated, plain_usage, call_no"
)
#: ``calls``: a new call's row (number, request_id, first and last arrival, the bookkeeping of a
#: pending open call, then the ``stream.started`` fields).
CALL_COLUMNS = (
    "call_no, request_id, first_received_at, last_received_at, change_seq, pending, status, "
    "settled, attempts, anomalies, api_key_id, model, protocol, started_at, metadata, provider, "
    "upstream_account"
)
#: The ``EventRow`` attributes of ``EVENT_COLUMNS`` but the call's number, the two times as
#: aware instants (``event_values``) or as their stored text (``event_texts``: SQLite's).
_ATTRIBUTES = (
    "event_id",
    "request_id",
    "attempt",
    "type",
    "occurred_at",
    "received",
    "digest",
    "body",
    "output_tokens_delivered",
    "output_tokens_generated",
    "plain_usage",
)
event_values = attrgetter(*_ATTRIBUTES)
event_texts = attrgetter(
    *(
        {"occurred_at": "occurred_text", "received": "received_text"}.get(name, name)
        for name in _ATTRIBUTES
    )
)
