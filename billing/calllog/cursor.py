"""The call log's opaque page cursor: the position (start, request_id) of a page's last call."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime

import orjson

from billing.calllog.params import parse_timestamp
from billing.timefmt import rfc3339


@dataclass(frozen=True)
class Position:
    """Where a page ended: the last call's ``started_at`` (None: a call with no start yet) and
    ``request_id``. The next page holds the calls after it in the log's order."""

    started_at: datetime | None
    request_id: str


def encode(position: Position) -> str:
    """URL-safe base64 (no padding) of ``[started_at or null, request_id]``."""
    raw = orjson.dumps([rfc3339(position.started_at), position.request_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(text: str) -> Position:
    """The position in a cursor made by ``encode``; ``ValueError`` in words for anything else."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = orjson.loads(raw)
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError("not a position")
        started, request_id = value
        if not isinstance(request_id, str) or not 1 <= len(request_id) <= 128:
            raise ValueError("bad request_id")
        at = None if started is None else parse_timestamp(started)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ValueError(
            "is not a cursor from this endpoint; pass the next_cursor of the previous page "
            "unchanged, or leave cursor out for the first page"
        ) from None
    return Position(at, request_id)
