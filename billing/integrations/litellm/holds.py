"""The LiteLLM callback's authorizations (CONTRACT "Authorizations and holds (v3)"): in the
proxy's pre-call hook, the call's estimate is reserved against the budgets before LiteLLM calls
the upstream; a denial is the proxy's own budget-exceeded error (a ``ProxyException`` of type
``budget_exceeded``: 402 when final, 429 with ``Retry-After`` when retryable), an authorization
request the service refuses (401, 409, 422) its ``internal_server_error`` (500) whatever
``fail_open`` says; a call that fails gives its hold back. The authorization's ``request_id``
is the call's own id (:func:`billing.integrations.litellm.calls.new_call_id`), never LiteLLM's
``litellm_call_id`` (a client's choice).

The estimate is :func:`billing.gateway.authorize.estimate_of`'s (the request's ``max_tokens`` /
``max_completion_tokens``, and LiteLLM's count of the input), the decision
:func:`billing.gateway.authorize.admission`'s (``fail_open`` included, logged the same way).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from billing.client import BillingClient
from billing.client.errors import ServiceError
from billing.gateway.authorize import Admission, admission, estimate_of, release_quietly
from billing.integrations.litellm.calls import MAX_OPEN_CALLS, Call
from billing.integrations.litellm.reading import input_count
from billing.integrations.litellm.settings import AuthorizeSettings

__all__ = ["Holds", "refusal"]


def refusal(refused: Admission) -> Exception:
    """The proxy's own error for a refused call (LiteLLM answers it in OpenAI's error shape,
    ``{"error": {"message", "type", "param", "code"}}``, with the status in ``code`` and its
    headers): ``budget_exceeded`` (402, 429, and 503 when the service is unavailable and
    ``fail_open`` is off), ``internal_server_error`` (500: the service refused the callback's
    request itself, a misconfiguration, as LiteLLM answers its own failures)."""
    from litellm.proxy._types import ProxyErrorTypes, ProxyException

    headers = {}
    if refused.retry_after_s is not None:
        headers["Retry-After"] = str(refused.retry_after_s)
    kind = ProxyErrorTypes.budget_exceeded
    if refused.status == 500:
        kind = ProxyErrorTypes.internal_server_error
    error: Exception = ProxyException(
        message=refused.message,
        type=kind,
        param=None,
        code=refused.status,
        headers=headers,
    )
    return error


class Holds:
    """Reserves before each call and releases after a failed one.

    Args:
        client: the billing client, when the first call needs it.
        settings: on or off, and ``fail_open``.
    """

    def __init__(
        self,
        client: Callable[[], BillingClient],
        settings: AuthorizeSettings,
    ) -> None:
        self._client = client
        self.settings = settings
        self._held: OrderedDict[str, None] = OrderedDict()  # request ids with a live hold

    async def reserve(self, call: Call, data: dict[str, Any]) -> None:
        """Authorize ``call`` (when on), under its own id, from the pre-call hook's ``data``.

        Raises:
            ProxyException: the call is refused (see :func:`refusal`).
        """
        if not self.settings.enabled:
            return
        estimate = estimate_of(call.protocol, data, input_tokens=input_count(data))
        client = self._client()
        answer: Any
        try:
            answer = await asyncio.to_thread(
                client.authorize,
                request_id=call.request_id,
                api_key_id=call.api_key_id,
                model=call.model,
                estimate=estimate,
            )
        except ServiceError as error:
            answer = error
        decided = admission(answer, request_id=call.request_id, fail_open=self.settings.fail_open)
        if not decided.allowed:
            raise refusal(decided)
        if decided.held:
            self._held[call.request_id] = None
            while len(self._held) > MAX_OPEN_CALLS:
                self._held.popitem(last=False)

    async def release(self, request_id: object) -> None:
        """Give the hold of ``request_id`` back, once (a call that failed); a release that
        fails is logged (the hold ends at its TTL)."""
        if not isinstance(request_id, str) or self._held.pop(request_id, False) is False:
            return
        client = self._client()
        await release_quietly(lambda rid: asyncio.to_thread(client.release, rid), request_id)
