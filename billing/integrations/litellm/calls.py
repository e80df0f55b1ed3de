"""The calls the LiteLLM callback follows: one :class:`Call` per ``litellm_call_id``, who made
it and what was counted and sent for it, kept in a bounded registry (:class:`Calls`), since
LiteLLM's hooks for one call run in no fixed order (its success event may come before or after
the drain's end).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from billing.gateway.drain import Drain

__all__ = ["MAX_OPEN_CALLS", "Call", "Calls", "logged_call", "protocol_of", "streamed_call"]

#: Calls remembered, at most (the oldest are forgotten past it).
MAX_OPEN_CALLS = 100_000

#: The protocol ids (CONTRACT "Background") of LiteLLM proxy routes.
_ROUTES = {
    "chat/completions": "openai.chat_completions",
    "responses": "openai.responses",
    "messages": "anthropic.messages",
}


@dataclass(eq=False)
class Call:
    """One call's identity, its counts (output tokens) and what was sent for it."""

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
    user_api_key_dict: Any, request_data: dict[str, Any], default_api_key_id: str
) -> Call:
    """The call of the streaming iterator hook's arguments (its ``request_id`` is empty when
    LiteLLM gave the request no ``litellm_call_id``)."""
    route = str(getattr(user_api_key_dict, "request_route", None) or "")
    return Call(
        request_id=str(request_data.get("litellm_call_id") or ""),
        api_key_id=_key_id(
            getattr(user_api_key_dict, "key_alias", None),
            getattr(user_api_key_dict, "token", None),
            default_api_key_id,
        ),
        model=str(request_data.get("model") or "unknown"),
        protocol=protocol_of(route),
        streamed=True,
    )


def logged_call(request_id: str, kwargs: dict[str, Any], default_api_key_id: str) -> Call:
    """The call ``request_id`` (LiteLLM's ``litellm_call_id``) of a logging hook's ``kwargs``,
    read from their ``standard_logging_object``."""
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
    )
