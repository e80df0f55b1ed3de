"""The columns ingest's statements write, in the order of their values (both databases)."""

from __future__ import annotations

#: ``events``: an ``EventRow``'s values (``billing.ingest.prepare``), then the call's number.
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
