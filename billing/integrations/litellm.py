"""A LiteLLM proxy callback that posts each call's billing events (CONTRACT.md "Events").

Name it in the proxy's config (LiteLLM imports ``module.instance`` from ``callbacks``)::

    litellm_settings:
      callbacks: billing.integrations.litellm.handler

and give it the service's address and an ``ingest`` token in the proxy's environment:
``BILLING_URL`` (default ``http://127.0.0.1:8000``) and ``BILLING_TOKEN``. The drain after a
disconnect is on by default; ``BILLING_DRAIN=off`` turns it off, ``BILLING_DRAIN_MAX_S``,
``BILLING_DRAIN_MAX_TOKENS`` and ``BILLING_DRAIN_MAX_CONCURRENT`` bound it
(:class:`billing.gateway.DrainPolicy`). ``BILLING_SPOOL=off`` turns the client's spool off.

What each of LiteLLM's hooks sends, for a streamed ``/v1/chat/completions`` call (``request_id``
= LiteLLM's ``litellm_call_id``, which a client may set with the ``x-litellm-call-id`` header;
``api_key_id`` = the virtual key's alias, else its hash, else ``default_api_key_id``; ``model``
= the model name the client asked for, as prices are named):

* ``async_post_call_streaming_iterator_hook`` (it wraps the stream LiteLLM relays):
  ``stream.started`` when the stream opens (with the gateway's input count: LiteLLM's
  ``token_counter`` over the messages, its bundled tokenizer) and ``stream.client_disconnected``
  when the client leaves (``GeneratorExit`` / ``CancelledError`` at a chunk), with the output
  tokens handed to the client and those received from the upstream so far. The upstream is read
  by a task of its own, not by the client's generator, so that a disconnect does not cancel it:
  the task drains the upstream to its final usage chunk (the provider's count, what it bills)
  and sends that ``stream.usage`` (``source: upstream``). Past a bound of the drain policy, or
  with the drain off, the upstream is cancelled and the attempt settles on the tokens received
  by then (``source: estimate``, anomaly ``drain_skipped``).
* ``async_log_success_event``: ``stream.tokens`` (delivered = generated = the output: a
  stream that ended normally delivered everything) and ``stream.usage`` of a call that was not
  cut short, from the usage
  LiteLLM logs: ``source: upstream`` when the upstream sent its usage (LiteLLM asks for it with
  ``stream_options.include_usage``), ``estimate`` when LiteLLM had to count. For a call the
  client left, LiteLLM logs its own count of the cut stream: that one is not sent (the drain
  reports). A call that was not streamed (no iterator) gets its ``stream.started`` here too.
* ``async_log_failure_event``: ``stream.failed`` (``error_type`` from LiteLLM's exception:
  ``stalled`` for a timeout, ``upstream_disconnect`` for a connection error (LiteLLM reports it
  as a 500 caused by one), ``overloaded_error`` for 429/503/529, else ``api_error``), after a
  ``stream.started`` if none was sent.

Token counts inside the stream (delivered, and received without usage) are counted per chunk
with LiteLLM's bundled ``cl100k_base`` tokenizer, so they are estimates; billed output comes
from the provider's usage whenever the drain reaches it.

Not covered: LiteLLM retries inside one call (router ``num_retries``, fallbacks) are one
attempt here; the iterator hook runs for ``/v1/chat/completions`` (LiteLLM's documented scope
of that hook), so other routes are billed from the success hook only (no delivered count, no
disconnect).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

from billing.client import BillingClient
from billing.gateway.drain import Drain
from billing.gateway.policy import DRAIN_SKIPPED, DrainPolicy
from billing.gateway.slots import DrainSlots

__all__ = ["BillingCallback", "handler", "policy_from_env"]

#: The protocol ids (CONTRACT "Background") of LiteLLM proxy routes.
_ROUTES = {
    "chat/completions": "openai.chat_completions",
    "responses": "openai.responses",
    "messages": "anthropic.messages",
}
#: Calls remembered, at most (the oldest are forgotten past it): the hooks of one call run in
#: no fixed order (LiteLLM's success event may come before or after the drain's end).
MAX_OPEN_CALLS = 100_000
_END = object()
#: Chunks read ahead of the client, at most (the upstream waits for a slow client).
_READ_AHEAD = 64


def policy_from_env(env: Mapping[str, str] = os.environ) -> DrainPolicy:
    """The drain policy from ``BILLING_DRAIN`` (``on`` | ``off``), ``BILLING_DRAIN_MAX_S``,
    ``BILLING_DRAIN_MAX_TOKENS`` and ``BILLING_DRAIN_MAX_CONCURRENT`` (defaults: those of
    :class:`DrainPolicy`). Raises ``ValueError`` naming the variable on a bad value."""
    default = DrainPolicy()
    switch = env.get("BILLING_DRAIN", "on").strip().lower()
    if switch not in ("on", "off"):
        raise ValueError(f"BILLING_DRAIN must be 'on' or 'off', not {switch!r}")

    def number(name: str, kind: type[int] | type[float], fallback: float) -> Any:
        raw = env.get(name)
        if raw is None or raw == "":
            return fallback
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name} must be a {kind.__name__}, not {raw!r}") from None

    return DrainPolicy(
        enabled=switch == "on",
        max_seconds=number("BILLING_DRAIN_MAX_S", float, default.max_seconds),
        max_tokens=number("BILLING_DRAIN_MAX_TOKENS", int, default.max_tokens),
        max_concurrent=number("BILLING_DRAIN_MAX_CONCURRENT", int, default.max_concurrent),
    )


@dataclass(eq=False)
class _Call:
    """One call's counts (output tokens) and what was sent for it."""

    request_id: str
    api_key_id: str
    model: str
    protocol: str
    delivered: int = 0  # handed to the client
    received: int = 0  # read from the upstream
    upstream_usage: Any = None  # the usage chunk the upstream sent, when it did
    streamed: bool = False  # the iterator hook runs for it
    disconnected: bool = False
    usage_sent: bool = False
    failed: bool = False
    drain: Drain | None = None
    pump: asyncio.Task[None] | None = field(default=None, repr=False)
    limit: asyncio.Timeout | None = field(default=None, repr=False)  # the drain's time bound


class BillingCallback(CustomLogger):  # type: ignore[misc]
    """The LiteLLM callback; see the module's docstring for the events of each hook.

    Args:
        client: the billing client to send through; by default one is made at the first call
            from ``BILLING_URL`` and ``BILLING_TOKEN`` (its spool on, in the user's cache
            directory, unless ``BILLING_SPOOL=off``), and closed at the process's exit.
        drain: the drain policy after a disconnect; by default :func:`policy_from_env`.
        default_api_key_id: the ``api_key_id`` of calls made without a virtual key.
    """

    def __init__(
        self,
        client: BillingClient | None = None,
        *,
        drain: DrainPolicy | None = None,
        default_api_key_id: str = "litellm",
    ) -> None:
        super().__init__()
        self._client = client
        self.policy = drain if drain is not None else policy_from_env()
        self.slots = DrainSlots(self.policy.max_concurrent)
        self.default_api_key_id = default_api_key_id
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the client and the calls ----------------------------------------------------------

    @property
    def client(self) -> BillingClient:
        """The billing client (made from the environment at first use)."""
        if self._client is None:
            spool = os.environ.get("BILLING_SPOOL", "").strip().lower()
            options: dict[str, Any] = {"spool_path": None} if spool == "off" else {}
            self._client = BillingClient(
                os.environ.get("BILLING_URL", "http://127.0.0.1:8000"),
                token=os.environ.get("BILLING_TOKEN") or None,
                **options,
            )
            # LiteLLM has no shutdown hook for callbacks: at the proxy's exit, deliver what is
            # queued (10 s at most), the rest goes to the spool.
            atexit.register(self._client.close, 10.0)
        return self._client

    def _send(self, call: _Call, kind: str, fields: dict[str, Any]) -> None:
        self.client.send({"request_id": call.request_id, "type": kind, **fields})

    def _start(self, call: _Call, input_tokens: int | None) -> None:
        fields: dict[str, Any] = {
            "api_key_id": call.api_key_id,
            "model": call.model,
            "protocol": call.protocol,
            "metadata": {"billing.gateway": "litellm", **self.policy.metadata()},
        }
        if input_tokens is not None:
            fields["input_tokens"] = input_tokens
        self._send(call, "stream.started", fields)

    def _remember(self, call: _Call) -> None:
        self._calls[call.request_id] = call
        while len(self._calls) > MAX_OPEN_CALLS:
            self._calls.popitem(last=False)

    def _key_id(self, alias: object, token: object) -> str:
        for candidate in (alias, token):
            if isinstance(candidate, str) and 0 < len(candidate) <= 128:
                return candidate
        return self.default_api_key_id

    # -- the stream ------------------------------------------------------------------------

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """Relay ``response`` (LiteLLM's chunks) to the client, reading it in a task of its
        own; count what is handed over; on a disconnect, drain or cancel (module docstring)."""
        route = str(getattr(user_api_key_dict, "request_route", None) or "")
        call = _Call(
            request_id=str(request_data.get("litellm_call_id") or ""),
            api_key_id=self._key_id(
                getattr(user_api_key_dict, "key_alias", None),
                getattr(user_api_key_dict, "token", None),
            ),
            model=str(request_data.get("model") or "unknown"),
            protocol=_protocol(route),
            streamed=True,
        )
        if not call.request_id:  # not a call LiteLLM logs: relay it untouched
            async for chunk in response:
                yield chunk
            return
        self._remember(call)
        self._start(call, _input_count(request_data))
        queue: asyncio.Queue[Any] = asyncio.Queue(_READ_AHEAD)
        call.pump = asyncio.get_running_loop().create_task(self._pump(call, response, queue))
        self._tasks.add(call.pump)
        call.pump.add_done_callback(self._tasks.discard)
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                call.delivered += _chunk_tokens(item)  # the client asked for the next one
        except (GeneratorExit, asyncio.CancelledError):
            self._client_left(call, queue)
            raise

    async def _pump(self, call: _Call, response: Any, queue: asyncio.Queue[Any]) -> None:
        """Read the upstream to its end: into ``queue`` while the client is there, on alone
        (the drain) after it left, within the drain's bounds."""
        skipped = False
        try:
            async with asyncio.timeout(None) as call.limit:
                async for chunk in response:
                    call.received += _chunk_tokens(chunk)
                    usage = getattr(chunk, "usage", None)
                    if usage is not None:
                        call.upstream_usage = usage
                    if not call.disconnected:
                        await queue.put(chunk)
                    elif call.drain is not None and call.drain.exceeded(
                        call.received, time.monotonic()
                    ):
                        skipped = True
                        break
        except TimeoutError:  # the drain's time bound
            skipped = True
        except asyncio.CancelledError:  # no drain for this disconnect
            skipped = True
            raise
        except Exception as error:
            if not call.disconnected:
                await queue.put(error)  # the client's stream fails as LiteLLM's would
        finally:
            if not call.disconnected:
                await queue.put(_END)  # a disconnect meanwhile empties the queue
            if call.disconnected:
                self._settle_drained(call, skipped)
            if skipped:
                with contextlib.suppress(Exception):
                    await response.aclose()

    def _client_left(self, call: _Call, queue: asyncio.Queue[Any]) -> None:
        """The client went away: report it, then drain the upstream or cancel it."""
        call.disconnected = True
        while not queue.empty():  # chunks read ahead were never handed over
            queue.get_nowait()
        self._send(
            call,
            "stream.client_disconnected",
            {"output_tokens_delivered": call.delivered, "output_tokens_generated": call.received},
        )
        pump = call.pump
        if pump is None or pump.done():  # the upstream had ended: settle on what it sent
            if not call.usage_sent:
                self._settle_drained(call, skipped=False)
            return
        drain = Drain(self.slots)
        if drain.begin(self.policy, call.received, time.monotonic()):
            call.drain = drain
            if call.limit is not None:
                call.limit.reschedule(asyncio.get_running_loop().time() + self.policy.max_seconds)
        else:
            pump.cancel()

    def _settle_drained(self, call: _Call, skipped: bool) -> None:
        """After a disconnect: the provider's usage if the drain reached it, else the tokens
        received by then, flagged ``drain_skipped``."""
        if call.drain is not None:
            call.drain.end()
        usage = call.upstream_usage
        if usage is not None:
            self._usage(call, usage, "upstream")
        else:
            self._send(
                call,
                "stream.usage",
                {
                    "source": "estimate",
                    "output_tokens": call.received,
                    **({"anomalies": [DRAIN_SKIPPED]} if skipped else {}),
                },
            )
            call.usage_sent = True

    def _usage(self, call: _Call, usage: Any, source: str, stop_reason: str | None = None) -> None:
        """``stream.usage`` from an OpenAI-shaped usage (``prompt_tokens`` includes the cached
        tokens: CONTRACT "Events", token semantics)."""
        prompt = _int(getattr(usage, "prompt_tokens", 0))
        cached = _int(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0))
        details = getattr(usage, "completion_tokens_details", None)
        fields: dict[str, Any] = {
            "source": source,
            "input_tokens": max(0, prompt - cached),
            "output_tokens": _int(getattr(usage, "completion_tokens", 0)),
            "cache_read_input_tokens": min(cached, prompt),
            "reasoning_tokens": _int(getattr(details, "reasoning_tokens", 0)),
        }
        if cached > prompt:
            fields["anomalies"] = ["usage_inconsistent"]
        if stop_reason:
            fields["stop_reason"] = stop_reason[:64]
        self._send(call, "stream.usage", fields)
        call.usage_sent = True

    # -- LiteLLM's logging -----------------------------------------------------------------

    def _logged_call(self, kwargs: dict[str, Any]) -> tuple[_Call | None, bool]:
        """The call of a logging event, and whether it is new (its start not sent yet)."""
        request_id = kwargs.get("litellm_call_id")
        if not isinstance(request_id, str) or not request_id:
            return None, False
        known = self._calls.get(request_id)
        if known is not None:
            return known, False
        logged = kwargs.get("standard_logging_object") or {}
        metadata = logged.get("metadata") or {}
        route = str(metadata.get("user_api_key_request_route") or "")
        call = _Call(
            request_id=request_id,
            api_key_id=self._key_id(
                metadata.get("user_api_key_alias"), metadata.get("user_api_key_hash")
            ),
            model=str(logged.get("model_group") or kwargs.get("model") or "unknown"),
            protocol=_protocol(route),
        )
        return call, True

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """The usage of a call that ran to its end (module docstring)."""
        call, new = self._logged_call(kwargs)
        if call is None or call.disconnected or call.usage_sent:
            return  # a call the client left: the drain reports its usage
        if new:
            self._remember(call)
            self._start(call, None)
        usage = getattr(response_obj, "usage", None)
        if usage is None:
            return
        # A stream that ends normally delivered everything (CONTRACT "Events").
        output = _int(getattr(usage, "completion_tokens", 0))
        self._send(
            call,
            "stream.tokens",
            {"output_tokens_generated": output, "output_tokens_delivered": output},
        )
        upstream = call.upstream_usage is not None or not call.streamed
        self._usage(call, usage, "upstream" if upstream else "estimate", _stop_reason(response_obj))

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """``stream.failed`` for the call (module docstring)."""
        call, new = self._logged_call(kwargs)
        if call is None or call.failed:
            return
        if new:
            self._remember(call)
            self._start(call, None)
        call.failed = True
        error = kwargs.get("exception")
        fields: dict[str, Any] = {"error_type": _error_type(error)}
        if error is not None:
            fields["message"] = f"{type(error).__name__}: {error}"[:4096]
        if call.received:
            fields["output_tokens_generated"] = call.received
        self._send(call, "stream.failed", fields)


def _protocol(route: str) -> str:
    path = route.rstrip("/")
    for suffix, protocol in _ROUTES.items():
        if path.endswith(suffix):
            return protocol
    return "openai.chat_completions"


def _int(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _count(text: str) -> int:
    return len(litellm.encoding.encode(text, disallowed_special=()))


def _chunk_tokens(chunk: Any) -> int:
    """Output tokens in one streamed chunk: its text, reasoning and tool-call arguments."""
    total = 0
    for choice in getattr(chunk, "choices", None) or ():
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        for text in (getattr(delta, "content", None), getattr(delta, "reasoning_content", None)):
            if isinstance(text, str) and text:
                total += _count(text)
        for tool_call in getattr(delta, "tool_calls", None) or ():
            arguments = getattr(getattr(tool_call, "function", None), "arguments", None)
            if isinstance(arguments, str) and arguments:
                total += _count(arguments)
    return total


def _input_count(request_data: Mapping[str, Any]) -> int | None:
    """The gateway's own input count: LiteLLM's ``token_counter`` over the messages with its
    default (bundled) tokenizer; ``None`` when it cannot count them."""
    messages = request_data.get("messages")
    if not isinstance(messages, list):
        return None
    try:
        count = litellm.token_counter(messages=messages)
    except Exception:
        return None
    return count if isinstance(count, int) and count >= 0 else None


def _stop_reason(response: Any) -> str | None:
    for choice in getattr(response, "choices", None) or ():
        reason = getattr(choice, "finish_reason", None)
        if isinstance(reason, str) and reason:
            return reason
    return None


def _error_type(error: object) -> str:
    """The contract's ``error_type`` of a LiteLLM exception. LiteLLM reports an upstream it
    could not reach as a 500 ``InternalServerError`` caused by a connection error, so the
    exception's causes are read first."""
    cause: object = error
    for _ in range(16):  # the chain of causes, bounded
        if not isinstance(cause, BaseException):
            break
        name = type(cause).__name__
        if name == "Timeout" or isinstance(cause, TimeoutError):
            return "stalled"
        if name in ("APIConnectionError", "ConnectError") or isinstance(cause, ConnectionError):
            return "upstream_disconnect"
        cause = cause.__cause__ or cause.__context__
    status = getattr(error, "status_code", None)
    name = type(error).__name__
    if status in (429, 503, 529) or name in ("RateLimitError", "ServiceUnavailableError"):
        return "overloaded_error"
    return "api_error"


#: The instance a proxy config names: ``callbacks: billing.integrations.litellm.handler``.
handler = BillingCallback()
