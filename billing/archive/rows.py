"""The rows that cross the archive's repository: an ``events`` row as a tuple in
``billing.archive.sql.common.COLUMNS`` order."""

from __future__ import annotations

from typing import Any

#: seq, event_id, request_id, attempt, type, occurred_at, received_at, content_hash, body,
#: output_tokens_delivered, output_tokens_generated, call_no, plain_usage.
EventRecord = tuple[Any, ...]
