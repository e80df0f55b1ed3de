"""The call log's opaque page cursor: the position (start, request_id) of a page's last call
(and, for a list whose pages belong to one query, a stamp of that query: the per-call drift)."""

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


def encode(position: Position, scope: str | None = None) -> str:
    """URL-safe base64 (no padding) of ``[started_at or null, request_id]``, and ``scope`` when
    given (a stamp of the query the cursor belongs to: :func:`decode` refuses it for another)."""
    value = [rfc3339(position.started_at), position.request_id]
    raw = orjson.dumps(value if scope is None else [*value, scope])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: Why a cursor is refused: it was not made by this endpoint.
NOT_A_CURSOR = (
    "is not a cursor from this endpoint; pass the next_cursor of the previous page "
    "unchanged, or leave cursor out for the first page"
)
#: Why a cursor is refused: it was made for another query (its page would be another list's).
OTHER_QUERY = (
    "was issued for another query (since, until or a filter differ); pass the next_cursor "
    "of the previous page with the same query, or leave cursor out for the first page"
)


def decode(text: str, scope: str | None = None) -> Position:
    """The position in a cursor made by ``encode`` (with the same ``scope``); ``ValueError``
    in words for anything else (:data:`NOT_A_CURSOR`, or :data:`OTHER_QUERY` for a cursor of
    this endpoint made for another query)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = orjson.loads(raw)
        if not isinstance(value, list) or len(value) != (2 if scope is None else 3):
            raise ValueError("not a position")
        started, request_id = value[:2]
        if not isinstance(request_id, str) or not 1 <= len(request_id) <= 128:
            raise ValueError("bad request_id")
        if scope is not None and not isinstance(value[2], str):
            raise ValueError("bad scope")
        at = None if started is None else parse_timestamp(started)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ValueError(NOT_A_CURSOR) from None
    if scope is not None and value[2] != scope:
        raise ValueError(OTHER_QUERY)
    return Position(at, request_id)
