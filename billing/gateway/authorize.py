"""Reserve before calling the upstream (CONTRACT "Authorizations and holds (v3)"): the estimate
of a request, the decision a gateway applies (its ``fail_open`` included), and the refusal in
the protocol's own error shape.

Sans-IO but for :class:`Authorizer`, the asyncio side :class:`billing.gateway.Meters` uses; the
LiteLLM callback uses the same :func:`estimate_of` and :func:`admission` over its own client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypedDict, Unpack

import httpx
from starlette.responses import JSONResponse, Response

from billing.client.authorizations import Authorization, AuthorizationFields, Release
from billing.client.errors import AuthorizationUnavailable, ServiceError
from billing.gateway.account import CallAccount
from billing.gateway.upstream import AsyncSource

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "Admission",
    "Authorizer",
    "Estimate",
    "Opener",
    "Reserver",
    "admission",
    "error_body",
    "estimate_of",
    "open_upstream",
    "opener_of",
    "refusal",
    "release_quietly",
]

log = logging.getLogger("billing.gateway")

#: The output tokens held for a request that names no limit of its own.
DEFAULT_MAX_OUTPUT_TOKENS = 4096

#: A coroutine function that opens the upstream (``lambda: http.send(request, stream=True)``).
Opener = Callable[[], Awaitable[AsyncSource]]

#: The error ``type`` of a refusal, by status: OpenAI's and Anthropic's.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    402: "insufficient_quota",
    429: "rate_limit_exceeded",
    500: "server_error",
    502: "upstream_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    402: "billing_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
}

#: Where each protocol's request names its output limit, in the order read.
_LIMITS = {
    "openai.chat_completions": ("max_completion_tokens", "max_tokens"),
    "openai.responses": ("max_output_tokens",),
    "anthropic.messages": ("max_tokens",),
}


class Reserver(Protocol):
    """What the meter needs of a client to reserve: :class:`billing.client.AsyncBillingClient`."""

    async def authorize(self, **fields: Unpack[AuthorizationFields]) -> Authorization: ...

    async def release(self, request_id: str, *, timeout_s: float | None = None) -> Release: ...


class Estimate(TypedDict, total=False):
    """The estimate fields of ``authorize``."""

    input_tokens: int
    max_output_tokens: int | None
    amount_usd: Decimal | str | None


def estimate_of(
    protocol: str,
    body: Mapping[str, Any] | None,
    *,
    input_tokens: int | None,
    amount_usd: Decimal | None = None,
    default_max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
) -> Estimate:
    """The estimate fields of ``authorize``: ``amount_usd`` when the gateway fixes one, else
    the gateway's input count (0 when it has none) and the request's own output limit
    (``max_completion_tokens`` / ``max_tokens`` for Chat Completions, ``max_output_tokens`` for
    Responses, ``max_tokens`` for Anthropic Messages), ``default_max_output_tokens`` without."""
    if amount_usd is not None:
        return {"amount_usd": amount_usd}
    limit = None
    for name in _LIMITS.get(protocol, ()):
        value = (body or {}).get(name)
        if type(value) is int and value >= 0:
            limit = value
            break
    return {
        "input_tokens": max(0, input_tokens or 0),
        "max_output_tokens": default_max_output_tokens if limit is None else limit,
    }


@dataclass(frozen=True, slots=True)
class Admission:
    """What the gateway does with a request: call the upstream (``allowed``; ``held`` when the
    service keeps a hold to release if the call fails before a byte), or refuse it with
    ``status`` (402 final, 429 retryable, 503 no decision and ``fail_open`` off, 500 the
    service refused the authorization request itself)."""

    allowed: bool
    held: bool = False
    status: int = 200
    reason: str | None = None
    retry_after_s: int | None = None
    message: str = ""


def admission(
    answer: Authorization | ServiceError, *, request_id: str, fail_open: bool
) -> Admission:
    """The gateway's decision on the service's answer (or the error in its place).

    ``fail_open`` applies only when the service is unavailable
    (:class:`~billing.client.errors.AuthorizationUnavailable`: 503 or another 5xx, 408, 429, no
    answer): the call is allowed (``True``) or refused with 503, logged at WARNING on
    ``billing.gateway``. Any other error (:class:`~billing.client.errors.AuthorizationRejected`:
    401, 403, 409, 422, ...) is the service refusing the gateway's own request, a
    misconfiguration no retry mends: the call is refused with 500 whatever ``fail_open`` says,
    logged at ERROR with the service's answer."""
    if isinstance(answer, AuthorizationUnavailable):
        outcome = "calling the upstream (fail_open)" if fail_open else "refusing the call"
        log.warning("authorization of %s unavailable (%s): %s", request_id, answer.message, outcome)
        if fail_open:
            return Admission(True)
        wait = answer.retry_after_s
        return Admission(
            False,
            status=503,
            reason="authorization_unavailable",
            retry_after_s=None if wait is None else max(1, round(wait)),
            message="the billing service cannot authorize the call now",
        )
    if isinstance(answer, ServiceError):
        log.error(
            "authorization of %s rejected (%s); the service answered %s: refusing the call "
            "(fail_open applies only to an unavailable service)",
            request_id,
            answer.message,
            _answer_text(answer.detail),
        )
        status = "no status" if answer.status is None else f"HTTP {answer.status}"
        return Admission(
            False,
            status=500,
            reason="authorization_rejected",
            message=f"the billing service refused the gateway's authorization request "
            f"({status}); see the gateway's log",
        )
    if answer.allowed:
        return Admission(True, held=True, reason=answer.reason)
    retryable = answer.retryable
    message = f"budget {answer.binding_budget_id or ''}".rstrip() + f": {answer.reason}"
    return Admission(
        False,
        status=429 if retryable else 402,
        reason=answer.reason or "budget_exceeded",
        retry_after_s=(answer.retry_after_s or 1) if retryable else None,
        message=message + ("; retry later" if retryable else ""),
    )


def _answer_text(detail: Any) -> str:
    """The service's answer as one line of the log (its JSON, or the start of its text)."""
    if detail is None:
        return "no body"
    if isinstance(detail, str):
        return repr(detail)
    return json.dumps(detail, ensure_ascii=False, default=str)


def error_body(protocol: str, refused: Admission) -> dict[str, Any]:
    """The refusal in the protocol's error shape: Anthropic's ``{"type": "error", "error":
    {"type", "message"}}`` (``invalid_request_error`` 400, ``billing_error`` 402,
    ``rate_limit_error`` 429, ``api_error`` 500 and 502, ``overloaded_error`` 503), else
    OpenAI's ``{"error": {"message", "type", "param": null, "code"}}``
    (``invalid_request_error`` 400, ``insufficient_quota`` 402, ``rate_limit_exceeded`` 429,
    ``server_error`` 500, ``upstream_error`` 502, ``service_unavailable`` 503; ``code``: the
    reason)."""
    if protocol == "anthropic.messages":
        kind = _ANTHROPIC_TYPES.get(refused.status, "overloaded_error")
        return {"type": "error", "error": {"type": kind, "message": refused.message}}
    kind = _OPENAI_TYPES.get(refused.status, "service_unavailable")
    return {
        "error": {"message": refused.message, "type": kind, "param": None, "code": refused.reason}
    }


def refusal(protocol: str, refused: Admission) -> JSONResponse:
    """The refusal as the gateway's response (with ``Retry-After`` when it has one)."""
    headers = {}
    if refused.retry_after_s is not None:
        headers["Retry-After"] = str(refused.retry_after_s)
    return JSONResponse(error_body(protocol, refused), refused.status, headers=headers)


@dataclass(frozen=True, slots=True)
class Authorizer:
    """How :class:`billing.gateway.Meters` reserves: through ``client``, with the hold's
    ``ttl_s`` (``None``: the service's default), a fixed ``amount_usd`` or the requests' output
    limits (``default_max_output_tokens`` without one), and ``fail_open``."""

    client: Reserver
    fail_open: bool = True
    amount_usd: Decimal | None = None
    default_max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    ttl_s: int | None = None

    async def admit(self, call: CallAccount, body: Mapping[str, Any] | None) -> Admission:
        """Ask the service about ``call`` (``body``: its request, for the output limit) and
        decide (:func:`admission`; but a 422, the service refusing a field, is a 400
        ``invalid_request_error``: an SDK retries a 500)."""
        estimate = estimate_of(
            call.protocol,
            body,
            input_tokens=call.input_tokens,
            amount_usd=self.amount_usd,
            default_max_output_tokens=self.default_max_output_tokens,
        )
        answer: Authorization | ServiceError
        try:
            answer = await self.client.authorize(
                request_id=call.request_id,
                api_key_id=call.api_key_id,
                model=call.model,
                estimate=estimate,
                ttl_s=self.ttl_s,
            )
        except ServiceError as error:
            answer = error
        decided = admission(answer, request_id=call.request_id, fail_open=self.fail_open)
        if isinstance(answer, ServiceError) and answer.status == 422:
            # a field the service refuses: a 400 the client's SDK does not retry, not a 500
            return Admission(
                False,
                status=400,
                reason="authorization_rejected",
                message="the billing service refused a field of the gateway's authorization "
                "request (HTTP 422); see the gateway's log",
            )
        return decided

    async def release(self, request_id: str) -> None:
        """Give the hold back (see :func:`release_quietly`)."""
        await release_quietly(self.client.release, request_id)


async def release_quietly(release: Callable[[str], Awaitable[Release]], request_id: str) -> None:
    """``release(request_id)``; a release that fails is logged (the hold ends at its TTL)."""
    try:
        await release(request_id)
    except ServiceError as error:
        log.warning("hold of %s not released (%s): it ends at its TTL", request_id, error)


def opener_of(upstream: AsyncSource | Opener) -> Opener | None:
    """``upstream`` when it is an opener (a callable, not a stream), else ``None``."""
    if isinstance(upstream, httpx.Response) or hasattr(upstream, "__aiter__"):
        return None
    return upstream if callable(upstream) else None


async def open_upstream(
    opener: Opener,
    protocol: str,
    release: Callable[[], Awaitable[None]],
    failed: Callable[[BaseException], None],
    whole: Callable[[httpx.Response], Response],
) -> AsyncSource | Response:
    """The upstream ``opener`` opens, or the response to give the client instead: a whole (not
    streamed) response, as ``whole`` meters it; when the upstream fails before a byte (it
    raises, or answers other than 200), after ``release``, the provider's error as it sent it
    (``whole``) or, when there was no answer, a 502 in the protocol's shape (``failed`` records
    the attempt)."""
    try:
        source = await opener()
        if not isinstance(source, httpx.Response):
            return source
        if source.status_code == 200 and not source.is_closed:
            return source  # a stream, read by the meter
        if source.status_code != 200:
            await release()
        try:
            await source.aread()
        finally:
            await source.aclose()
    except Exception as error:
        await release()
        failed(error)
        log.warning("the upstream could not be opened (%r): the hold is released", error)
        gone = Admission(False, status=502, reason="upstream_unavailable", message=str(error))
        return refusal(protocol, gone)
    return whole(source)
