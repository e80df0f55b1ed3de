"""The calls the LiteLLM callback follows: one :class:`Call` per call id of the callback's own
(:func:`new_call_id`), who made it and what was counted and sent for it, kept in a bounded
registry (:class:`Calls`), since LiteLLM's hooks for one call run in no fixed order (its success
event may come before or after the drain's end).

The call's id is never LiteLLM's ``litellm_call_id``: a client chooses that one with the
``x-litellm-call-id`` header, and a client that sends one id with several requests would make
their generations one call, billed once (events are idempotent by ``request_id``). The pre-call
hook mints the id and writes it into the request's LiteLLM metadata (:data:`CALL_ID_KEY` of
``litellm_metadata`` on the routes LiteLLM gives one, ``/v1/responses`` and ``/v1/messages``,
else of ``metadata``), which LiteLLM hands to every later hook of the call: the request's data
in the streaming iterator and post-call failure hooks, ``kwargs["litellm_params"]["metadata"]``
in the logging hooks (:func:`own_call_id`). An id is taken only when this process minted it
and still follows its call (:meth:`Calls.get`): a client's own value under that key is not.
LiteLLM's id is kept as the call's metadata ``litellm_call_id`` (:func:`litellm_call_metadata`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from billing.gateway.drain import Drain

__all__ = [
    "CALL_ID_KEY",
    "LITELLM_CALL_ID_KEY",
    "MAX_OPEN_CALLS",
    "Call",
    "Calls",
    "carry_call_id",
    "litellm_call_metadata",
    "logged_call",
    "new_call_id",
    "own_call_id",
    "protocol_of",
    "streamed_call",
]

#: Calls remembered, at most (the oldest are forgotten past it).
MAX_OPEN_CALLS = 100_000
#: The key of the request's LiteLLM metadata that carries the call's id to the later hooks.
CALL_ID_KEY = "billing_call_id"
#: The call's metadata key that keeps LiteLLM's ``litellm_call_id``.
LITELLM_CALL_ID_KEY = "litellm_call_id"
#: At most this many characters of it are kept (a metadata value's bound, CONTRACT "Events").
_LITELLM_CALL_ID_MAX = 256

#: The protocol ids (CONTRACT "Background") of LiteLLM proxy routes.
_ROUTES = {
    "chat/completions": "openai.chat_completions",
    "responses": "openai.responses",
    "messages": "anthropic.messages",
}


@dataclass(eq=False)
class Call:
    """One call's identity, its counts (output tokens) and what was sent for it."""

    request_id: str  # the callback's own (new_call_id)
    api_key_id: str
    model: str
    protocol: str
    litellm_call_id: str = ""  # LiteLLM's, possibly the client's choice: metadata only
    started: bool = False  # its stream.started was sent
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


class Calls:
    """The calls seen lately by request id: at most :data:`MAX_OPEN_CALLS`, the oldest
    forgotten first."""

    def __init__(self) -> None:
        self._calls: OrderedDict[str, Call] = OrderedDict()

    def remember(self, call: Call) -> None:
        """Keep ``call`` (it replaces a call of the same request id)."""
        self._calls[call.request_id] = call
        while len(self._calls) > MAX_OPEN_CALLS:
            self._calls.popitem(last=False)

    def get(self, request_id: str) -> Call | None:
        """The call of ``request_id``, or ``None`` when it is not (or no longer) kept."""
        return self._calls.get(request_id)


def new_call_id() -> str:
    """A new call id of the callback's own: ``llm-`` and a random UUID's 32 hex digits."""
    return f"llm-{uuid.uuid4().hex}"


def carry_call_id(data: dict[str, Any], request_id: str) -> None:
    """Write ``request_id`` into the pre-call hook's ``data``, where LiteLLM passes it on to
    the call's later hooks: its ``litellm_metadata`` when the route has one, else its
    ``metadata`` (made when missing); a client's own value there is replaced."""
    metadata = data.get("litellm_metadata")
    if not isinstance(metadata, dict):
        metadata = data.get("metadata")
        if not isinstance(metadata, dict):
            metadata = data["metadata"] = {}
    metadata[CALL_ID_KEY] = request_id


def own_call_id(data: Mapping[str, Any] | None) -> str | None:
    """The id :func:`carry_call_id` wrote, read from a hook's request data, or from a logging
    hook's ``kwargs`` (their ``litellm_params``); ``None`` without one. Only an id the caller
    finds among its :class:`Calls` is the call's: any other is a client's."""
    if not isinstance(data, Mapping):
        return None
    params = data.get("litellm_params")
    sources = (data, params) if isinstance(params, Mapping) else (data,)
    for source in sources:
        for name in ("litellm_metadata", "metadata"):
            metadata = source.get(name)
            if isinstance(metadata, Mapping):
                value = metadata.get(CALL_ID_KEY)
                if isinstance(value, str) and value:
                    return value
    return None


def litellm_call_metadata(litellm_call_id: object) -> dict[str, str]:
    """The call's metadata for LiteLLM's ``litellm_call_id``: ``{"litellm_call_id": ...}``, its
    printable characters and at most 256 of them; nothing when there is none."""
    text = litellm_call_id if isinstance(litellm_call_id, str) else ""
    kept = "".join(c for c in text if c.isprintable())[:_LITELLM_CALL_ID_MAX]
    return {LITELLM_CALL_ID_KEY: kept} if kept else {}


def protocol_of(route: str) -> str:
    """The protocol id of a LiteLLM proxy route (``/v1/messages``: ``anthropic.messages``);
    Chat Completions for a route it does not know."""
    path = route.rstrip("/")
    for suffix, protocol in _ROUTES.items():
        if path.endswith(suffix):
            return protocol
    return "openai.chat_completions"


def _key_id(alias: object, token: object, default: str) -> str:
    """The ``api_key_id``: the virtual key's alias, else its hash, else ``default``."""
    for candidate in (alias, token):
        if isinstance(candidate, str) and 0 < len(candidate) <= 128:
            return candidate
    return default


def streamed_call(
    user_api_key_dict: Any, request_data: dict[str, Any], default_api_key_id: str, request_id: str
) -> Call:
    """The call ``request_id`` of the pre-call hook's arguments (the proxy's request)."""
    route = str(getattr(user_api_key_dict, "request_route", None) or "")
    return Call(
        request_id=request_id,
        api_key_id=_key_id(
            getattr(user_api_key_dict, "key_alias", None),
            getattr(user_api_key_dict, "token", None),
            default_api_key_id,
        ),
        model=str(request_data.get("model") or "unknown"),
        protocol=protocol_of(route),
        litellm_call_id=str(request_data.get("litellm_call_id") or ""),
    )


def logged_call(request_id: str, kwargs: dict[str, Any], default_api_key_id: str) -> Call:
    """The call ``request_id`` of a logging hook's ``kwargs`` (a call the pre-call hook did not
    see), read from their ``standard_logging_object``."""
    logged = kwargs.get("standard_logging_object") or {}
    metadata = logged.get("metadata") or {}
    route = str(metadata.get("user_api_key_request_route") or "")
    return Call(
        request_id=request_id,
        api_key_id=_key_id(
            metadata.get("user_api_key_alias"),
            metadata.get("user_api_key_hash"),
            default_api_key_id,
        ),
        model=str(logged.get("model_group") or kwargs.get("model") or "unknown"),
        protocol=protocol_of(route),
        litellm_call_id=str(kwargs.get("litellm_call_id") or ""),
    )
