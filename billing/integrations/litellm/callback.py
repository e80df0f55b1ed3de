"""The LiteLLM callback: LiteLLM's hooks, each turned into the events of its call (what each
sends: :mod:`billing.integrations.litellm`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from billing.client import BillingClient
from billing.fields import printable_text
from billing.gateway.policy import DrainPolicy
from billing.gateway.slots import DrainSlots
from billing.integrations.litellm.calls import (
    Call,
    Calls,
    carry_call_id,
    logged_call,
    new_call_id,
    own_call_id,
    streamed_call,
)
from billing.integrations.litellm.holds import Holds
from billing.integrations.litellm.reading import (
    chunk_tokens,
    error_type,
    input_count,
    output_tokens,
    stop_reason,
    whole_usage,
)
from billing.integrations.litellm.sender import Sender
from billing.integrations.litellm.settings import (
    AuthorizeSettings,
    authorize_from_env,
    policy_from_env,
)
from billing.integrations.litellm.stream import Pumps

__all__ = ["CALL_ID_HEADER", "BillingCallback"]

#: The response header that carries the call's ``request_id`` (the callback's own id) to the
#: client.
CALL_ID_HEADER = "x-billing-request-id"


class BillingCallback(CustomLogger):  # type: ignore[misc]
    """The LiteLLM callback; see :mod:`billing.integrations.litellm` for the events of each
    hook.

    Args:
        client: the billing client to send through; by default one is made at the first call
            from ``BILLING_URL`` and ``BILLING_TOKEN`` (its spool on, in the user's cache
            directory, unless ``BILLING_SPOOL=off``), and closed at the process's exit.
        drain: the drain policy after a disconnect; by default :func:`policy_from_env`.
        default_api_key_id: the ``api_key_id`` of calls made without a virtual key; with
            ``None`` such a call is refused before the upstream (:meth:`async_pre_call_hook`).
        authorize: whether to reserve before each call, and ``fail_open``; by default
            :func:`authorize_from_env`.
    """

    def __init__(
        self,
        client: BillingClient | None = None,
        *,
        drain: DrainPolicy | None = None,
        default_api_key_id: str | None = "litellm",
        authorize: AuthorizeSettings | None = None,
    ) -> None:
        super().__init__()
        policy = drain if drain is not None else policy_from_env()
        self.default_api_key_id = default_api_key_id
        # (a call that got past async_pre_call_hook without a key: one LiteLLM did not hook)
        self._default_key = default_api_key_id or "unattributed"
        self._sender = Sender(client, policy)
        self._pumps = Pumps(self._sender, policy)
        self._calls = Calls()
        settings = authorize if authorize is not None else authorize_from_env()
        self._holds = Holds(lambda: self._sender.client, settings)

    @property
    def client(self) -> BillingClient:
        """The billing client (made from the environment at first use)."""
        return self._sender.client

    @property
    def policy(self) -> DrainPolicy:
        """The drain policy after a disconnect (the sender and the pumps hold the same one)."""
        return self._pumps.policy

    @property
    def slots(self) -> DrainSlots:
        """The bound on concurrent drains (``policy.max_concurrent``)."""
        return self._pumps.slots

    # LiteLLM runs a callback's pre-call hook only when its own class defines it (as below).
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """Before LiteLLM calls the upstream: refuse (400) a request no call can be recorded
        for (no ``model``, or no key, neither the virtual key's alias nor its hash, when there
        is no ``default_api_key_id``); then give the call its id (:func:`~billing.integrations.
        litellm.calls.new_call_id`, carried to the later hooks in the request's metadata:
        :mod:`billing.integrations.litellm.calls`) and reserve its estimate, a refusal raising
        the proxy's budget-exceeded error (:mod:`billing.integrations.litellm.holds`). Returns
        ``data``."""
        if not isinstance(data.get("model"), str) or not data["model"]:
            raise HTTPException(status_code=400, detail={"error": "model is required"})
        call = streamed_call(user_api_key_dict, data, "", new_call_id())
        if not call.api_key_id:
            if not self.default_api_key_id:
                raise HTTPException(
                    status_code=400, detail={"error": "a key is required to bill this call"}
                )
            call.api_key_id = self._default_key
        carry_call_id(data, call.request_id)
        self._calls.remember(call)
        await self._holds.reserve(call, data)
        return data

    def _own_call(self, data: dict[str, Any] | None) -> Call | None:
        """The call whose id :meth:`async_pre_call_hook` carried in ``data`` (a hook's request
        data, or a logging hook's ``kwargs``); ``None`` when it carries none this callback
        follows (a client's own value under that key is none)."""
        request_id = own_call_id(data)
        return None if request_id is None else self._calls.get(request_id)

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
    ) -> dict[str, str] | None:
        """The call's id to the client, as :data:`CALL_ID_HEADER` (``x-billing-request-id``),
        on the proxy's answer (streamed or not, a failure too): the id to quote for the
        call's bill. LiteLLM's own ``x-litellm-call-id`` goes on as LiteLLM sends it. (LiteLLM
        versions without this hook send no such header.)"""
        call = self._own_call(data)
        return None if call is None else {CALL_ID_HEADER: call.request_id}

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> None:
        """A call that failed in the proxy gives its hold back."""
        call = self._own_call(request_data)
        if call is not None:
            await self._holds.release(call.request_id)

    # LiteLLM runs a callback's streaming iterator hook only when the callback's own class
    # defines it (it reads ``type(callback).__dict__``): it stays here, on the leaf class.
    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """Relay ``response`` (LiteLLM's chunks) to the client, reading it in a task of its
        own; count what is handed over; on a disconnect, drain or cancel
        (:mod:`billing.integrations.litellm.stream`)."""
        call = self._own_call(request_data)
        if call is None or call.started:
            # not a call the pre-call hook saw: relay it untouched, the logging hooks bill it
            async for chunk in response:
                yield chunk
            return
        call.streamed = True
        self._sender.started(call, input_count(request_data))
        handoff = self._pumps.start(call, response)
        try:
            async for chunk in handoff:
                yield chunk
                call.delivered += chunk_tokens(chunk)  # the client asked for the next one
        except (GeneratorExit, asyncio.CancelledError):
            self._pumps.client_left(call, handoff)
            raise

    def _logged_call(self, kwargs: dict[str, Any]) -> Call:
        """The call of a logging event's ``kwargs``, its ``stream.started`` sent if it was not
        (a non-streamed call, a failure before the stream). A call the pre-call hook did not
        give an id (LiteLLM used as a library, not as a proxy) gets a new one here, kept while
        the call is followed."""
        call = self._own_call(kwargs)
        if call is None:
            call = logged_call(new_call_id(), kwargs, self._default_key)
            self._calls.remember(call)
        if not call.started:
            self._sender.started(call, None)
        return call

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """The usage of a call that ran to its end (:mod:`billing.integrations.litellm`)."""
        call = self._logged_call(kwargs)
        if call.disconnected or call.usage_sent:
            return  # a call the client left: the drain reports its usage
        if not call.streamed:  # a whole response: read as a gateway's meter reads it
            fields = whole_usage(response_obj, call.protocol)
            if fields is not None:
                self._sender.whole(call, fields)
                return
        usage = getattr(response_obj, "usage", None)
        if usage is None:
            return
        # A stream that ends normally delivered everything (CONTRACT "Events").
        output = output_tokens(usage)
        self._sender.send(
            call,
            "stream.tokens",
            {"output_tokens_generated": output, "output_tokens_delivered": output},
        )
        upstream = call.upstream_usage is not None or not call.streamed
        source = "upstream" if upstream else "estimate"
        self._sender.usage(call, usage, source, stop_reason(response_obj))

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """``stream.failed`` for the call (:mod:`billing.integrations.litellm`), after its hold
        is released (before any event of the call: an event would make the hold the call's)."""
        held = self._own_call(kwargs)
        if held is not None:
            await self._holds.release(held.request_id)
        call = self._logged_call(kwargs)
        if call.failed:
            return
        call.failed = True
        error = kwargs.get("exception")
        fields: dict[str, Any] = {"error_type": error_type(error)}
        if error is not None:
            fields["message"] = printable_text(f"{type(error).__name__}: {error}"[:4096])
        if call.received:
            fields["output_tokens_generated"] = call.received
        self._sender.send(call, "stream.failed", fields)
