"""What of the upstream's response head a metered response passes on to the client.

The client sees the provider's rate limits and request id as if it had called the provider
(``x-ratelimit-*``, ``anthropic-ratelimit-*``, ``ratelimit-*``, ``retry-after``,
``request-id``, ``openai-processing-ms``, ``openai-version``), never a header that describes
the upstream's own transfer (length, encoding, connection) nor the gateway's account with the
provider (``openai-organization``, ``openai-project``, ``anthropic-organization-id``), and the
call's id as ``X-Request-Id``
(:data:`CALL_ID_HEADER`): the upstream's own ``x-request-id`` goes on as
``X-Upstream-Request-Id`` (:data:`UPSTREAM_ID_HEADER`), so that the client can quote either.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CALL_ID_HEADER", "UPSTREAM_ID_HEADER", "relayed_headers"]

#: The header that carries the call's ``request_id`` to the client.
CALL_ID_HEADER = "X-Request-Id"
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
