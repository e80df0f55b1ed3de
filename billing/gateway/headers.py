"""What of the upstream's response head a metered response passes on to the client.

The client sees the provider's rate limits and request id as if it had called the provider
(``x-ratelimit-*``, ``anthropic-ratelimit-*``, ``ratelimit-*``, ``retry-after``,
``request-id``, ``openai-processing-ms``, ``openai-version``), never a header that describes
the upstream's own transfer (length, encoding, connection) nor the gateway's account with the
provider (``openai-organization``, ``openai-project``, ``anthropic-organization-id``), and the
call's id as ``X-Request-Id``
(:data:`CALL_ID_HEADER`): the upstream's own ``x-request-id`` goes on as
``X-Upstream-Request-Id`` (:data:`UPSTREAM_ID_HEADER`), so that the client can quote either.

The call's id is the gateway's own (:func:`new_call_id`), never the client's: a client that
sends one ``X-Request-Id`` with several requests (an SDK's retries, a bug, on purpose) would
otherwise make their generations one call, billed once (events are idempotent by
``request_id``). The client's ``X-Request-Id`` is kept as the call's metadata
``client_request_id`` (:func:`client_request_metadata`), and the response's ``X-Request-Id`` is
the call's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

__all__ = [
    "CALL_ID_HEADER",
    "CLIENT_REQUEST_ID_KEY",
    "UPSTREAM_ID_HEADER",
    "client_request_metadata",
    "new_call_id",
    "relayed_headers",
]

#: The header that carries the call's ``request_id`` to the client (the gateway's id; a
#: client's own header of that name is only metadata, :data:`CLIENT_REQUEST_ID_KEY`).
CALL_ID_HEADER = "X-Request-Id"
#: The call's metadata key that keeps the client's own ``X-Request-Id``.
CLIENT_REQUEST_ID_KEY = "client_request_id"
#: At most this many characters of it are kept (a metadata value's bound, CONTRACT "Events").
CLIENT_REQUEST_ID_MAX = 256
#: The header that carries the upstream's own ``x-request-id`` to the client.
UPSTREAM_ID_HEADER = "X-Upstream-Request-Id"

#: Upstream headers passed on as they are (lowercase names), and the prefixes passed on.
_PASSED = frozenset({"retry-after", "request-id", "openai-processing-ms", "openai-version"})
_PASSED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit-")


def relayed_headers(upstream: Mapping[str, str] | None, request_id: str) -> dict[str, str]:
    """The headers of the client's response: those of ``upstream`` (the provider's response
    head) that pass on, the upstream's ``x-request-id`` as :data:`UPSTREAM_ID_HEADER`, and
    ``request_id`` (the call's id) as :data:`CALL_ID_HEADER`."""
    headers: dict[str, str] = {}
    for name, value in (upstream or {}).items():
        lower = name.lower()
        if lower == "x-request-id":
            headers[UPSTREAM_ID_HEADER] = value
        elif lower in _PASSED or lower.startswith(_PASSED_PREFIXES):
            headers[lower] = value
    headers[CALL_ID_HEADER] = request_id
    return headers


def new_call_id() -> str:
    """A new call id of the gateway's own: ``gw-`` and a random UUID's 32 hex digits."""
    return f"gw-{uuid.uuid4().hex}"


def client_request_metadata(client_request_id: str | None) -> dict[str, str]:
    """The call's metadata for the client's own request id (its ``X-Request-Id``):
    ``{"client_request_id": ...}``, its printable characters and at most
    :data:`CLIENT_REQUEST_ID_MAX` of them; nothing when it has none."""
    kept = "".join(c for c in client_request_id or "" if c.isprintable())
    kept = kept[:CLIENT_REQUEST_ID_MAX]
    return {CLIENT_REQUEST_ID_KEY: kept} if kept else {}
