"""Authorizations on the wire, sans-IO (CONTRACT "Authorizations and holds (v3)"): the request of
``POST /v1/authorizations`` and ``DELETE /v1/authorizations/{request_id}``, and what an answer
(or the exception a request raised) means: a typed :class:`Authorization` or :class:`Release`,
else :class:`~billing.client.errors.AuthorizationUnavailable` (no decision: 5xx, 408, 429, no
answer) or :class:`~billing.client.errors.AuthorizationRejected` (any other refusal).

The clients send one request per call, without retries: a gateway waits for the answer before
it calls the upstream, and applies its ``fail_open`` setting when there is none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, Required, TypedDict, Unpack
from urllib.parse import quote

import httpx
import orjson

from billing.client.errors import AuthorizationRejected, AuthorizationUnavailable
from billing.client.wire import retry_after

__all__ = [
    "Authorization",
    "AuthorizationFields",
    "Release",
    "Request",
    "authorization_request",
    "release_request",
]


class AuthorizationFields(TypedDict, total=False):
    """The arguments of ``authorize``: the call (``request_id``, ``api_key_id``, ``model``,
    ``service_tier``, ``tags``), its ``estimate`` (``{"input_tokens", "max_output_tokens"}`` or
    ``{"amount_usd"}``, a ``Decimal`` or a decimal string), the hold's ``ttl_s``, and
    ``timeout_s`` (the request's, else the client's)."""

    request_id: Required[str]
    api_key_id: Required[str]
    model: Required[str]
    estimate: Required[Mapping[str, Any]]
    service_tier: str | None
    tags: Sequence[str] | None
    ttl_s: int | None
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request to make: ``method`` on ``url`` with ``body`` (JSON bytes or none)."""

    method: Literal["POST", "DELETE"]
    url: str
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Authorization:
    """The service's decision (the first one again for a repeated ``request_id``).

    ``hold_usd`` is exact (``Decimal``); ``expires_at`` and ``as_of`` are aware UTC datetimes;
    ``budgets`` are the budgets' statuses as the service sent them."""

    request_id: str
    decision: Literal["allow", "deny"]
    reason: str | None
    retryable: bool
    retry_after_s: int | None
    hold_usd: Decimal
    expires_at: datetime | None
    binding_budget_id: str | None
    budgets: Sequence[dict[str, Any]]
    as_of: datetime

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


@dataclass(frozen=True, slots=True)
class Release:
    """A hold after ``DELETE``: ``released`` (now or before), ``converted`` (its call has an
    event) or ``expired``."""

    request_id: str
    state: Literal["released", "expired", "converted"]
    hold_usd: Decimal


def authorization_request(base_url: str, **fields: Unpack[AuthorizationFields]) -> Request:
    """``POST /v1/authorizations`` (the service checks the estimate: a 422 otherwise)."""
    estimate = {
        name: str(value) if isinstance(value, Decimal) else value
        for name, value in fields["estimate"].items()
    }
    body: dict[str, Any] = {
        "request_id": fields["request_id"],
        "api_key_id": fields["api_key_id"],
        "model": fields["model"],
        "estimate": estimate,
    }
    for name in ("service_tier", "ttl_s"):
        if fields.get(name) is not None:
            body[name] = fields.get(name)
    tags = fields.get("tags")
    if tags is not None:
        body["tags"] = list(tags)
    return Request("POST", base_url + "/v1/authorizations", orjson.dumps(body))


def release_request(base_url: str, request_id: str) -> Request:
    """``DELETE /v1/authorizations/{request_id}``."""
    return Request("DELETE", f"{base_url}/v1/authorizations/{quote(request_id, safe='')}", None)


#: The characters kept of an answer that is not JSON.
_TEXT_KEPT = 500


def _answer(result: httpx.Response | Exception, what: str) -> dict[str, Any]:
    """The JSON of a 200 answer; raises the error the answer (or the exception) means."""
    if isinstance(result, Exception):
        raise AuthorizationUnavailable(
            f"{what}: no answer ({type(result).__name__}: {result})".rstrip(": ")
        ) from result
    status = result.status_code
    try:
        detail: Any = result.json()
    except ValueError:  # not JSON (a proxy's page): its start, for the gateway's log
        detail = result.text[:_TEXT_KEPT] or None
    if status == 200 and isinstance(detail, dict):
        return detail
    message = f"{what}: HTTP {status}"
    if isinstance(detail, dict) and isinstance(detail.get("error"), str):
        message += f": {detail['error']}"
    if status in (408, 429) or status >= 500:
        wait = retry_after(result.headers.get("retry-after"))
        raise AuthorizationUnavailable(message, status=status, detail=detail, retry_after_s=wait)
    raise AuthorizationRejected(message, status=status, detail=detail)


def read_authorization(result: httpx.Response | Exception) -> Authorization:
    """The decision of an answer to :func:`authorization_request`.

    Raises:
        AuthorizationUnavailable: no decision (5xx, 408, 429, or no answer).
        AuthorizationRejected: any other refusal (401, 403, 409, 422, ...).
    """
    data = _answer(result, "authorization")
    try:
        expires = data.get("expires_at")
        return Authorization(
            request_id=str(data["request_id"]),
            decision="allow" if data["decision"] == "allow" else "deny",
            reason=data.get("reason"),
            retryable=bool(data.get("retryable")),
            retry_after_s=data.get("retry_after_s"),
            hold_usd=Decimal(str(data.get("hold_usd") or "0")),
            expires_at=None if expires is None else datetime.fromisoformat(expires),
            binding_budget_id=data.get("binding_budget_id"),
            budgets=list(data.get("budgets") or ()),
            as_of=datetime.fromisoformat(data["as_of"]),
        )
    except (KeyError, TypeError, ValueError, InvalidOperation) as error:
        raise AuthorizationUnavailable(f"authorization: unreadable answer ({error!r})") from error


def read_release(result: httpx.Response | Exception, request_id: str) -> Release:
    """The hold of an answer to :func:`release_request`.

    Raises:
        AuthorizationUnavailable: no answer, 5xx, 408 or 429.
        AuthorizationRejected: another refusal (404: no authorization of ``request_id``).
    """
    data = _answer(result, f"release of {request_id}")
    state = data.get("state")
    if state not in ("released", "expired", "converted"):
        raise AuthorizationUnavailable(f"release of {request_id}: unreadable state {state!r}")
    return Release(request_id, state, Decimal(str(data.get("hold_usd") or "0")))
