"""What the LiteLLM callback reads off LiteLLM's objects: the output tokens of a streamed chunk,
the input tokens of a request, a usage's ``stream.usage`` fields, a response's stop reason and
an exception's ``error_type``.

Token counts inside the stream are LiteLLM's bundled ``cl100k_base`` tokenizer's
(``litellm.encoding``: no network, no model download), so they are estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import litellm
import orjson

from billing.anomalies import USAGE_INCONSISTENT
from billing.taps import open_tap

__all__ = [
    "chunk_tokens",
    "error_type",
    "input_count",
    "stop_reason",
    "usage_fields",
    "whole_usage",
]


def _count(value: object) -> int:
    """``value`` when it is a positive ``int``, else 0."""
    return value if isinstance(value, int) and value > 0 else 0


def _tokens(text: str) -> int:
    return len(litellm.encoding.encode(text, disallowed_special=()))


def chunk_tokens(chunk: Any) -> int:
    """Output tokens in one streamed chunk: its text, reasoning and tool-call arguments."""
    total = 0
    for choice in getattr(chunk, "choices", None) or ():
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        for text in (getattr(delta, "content", None), getattr(delta, "reasoning_content", None)):
            if isinstance(text, str) and text:
                total += _tokens(text)
        for tool_call in getattr(delta, "tool_calls", None) or ():
            arguments = getattr(getattr(tool_call, "function", None), "arguments", None)
            if isinstance(arguments, str) and arguments:
                total += _tokens(arguments)
    return total


def input_count(request_data: Mapping[str, Any]) -> int | None:
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


def usage_fields(usage: Any) -> dict[str, Any]:
    """The token fields of ``stream.usage`` from an OpenAI-shaped usage, whose
    ``prompt_tokens`` includes the cached tokens (CONTRACT "Events", token semantics):
    ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``, ``reasoning_tokens``
    (tokens), and ``anomalies: ["usage_inconsistent"]`` when the cached tokens exceed the
    prompt."""
    prompt = _count(getattr(usage, "prompt_tokens", 0))
    cached = _count(getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0))
    details = getattr(usage, "completion_tokens_details", None)
    fields: dict[str, Any] = {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": output_tokens(usage),
        "cache_read_input_tokens": min(cached, prompt),
        "reasoning_tokens": _count(getattr(details, "reasoning_tokens", 0)),
    }
    if cached > prompt:
        fields["anomalies"] = [USAGE_INCONSISTENT]
    return fields


def whole_usage(response: Any, protocol: str) -> dict[str, Any] | None:
    """The ``stream.usage`` fields of a NON-streamed response (LiteLLM's ``ModelResponse``, a
    pydantic model, or the provider's object as a dict), read by the protocol's tap from its
    JSON (:meth:`billing.taps.Tap.read_json`): every dimension the tap reads (cache writes,
    units, counters, the provider's cost, the served tier), as a gateway's meter posts them.
    ``None`` when the response is not JSON or the tap finds no usage in it."""
    try:
        dump = getattr(response, "model_dump", None)
        body = orjson.dumps(dump(mode="json") if callable(dump) else response)
    except (TypeError, ValueError):
        return None
    tap = open_tap(protocol)
    tap.read_json(body)
    if tap.usage is None:
        return None
    payload = tap.usage_payload()
    payload.pop("model", None)  # the call's model is the one the client asked for
    return payload


def output_tokens(usage: Any) -> int:
    """The output tokens (``completion_tokens``) of an OpenAI-shaped usage; 0 when absent."""
    return _count(getattr(usage, "completion_tokens", 0))


def stop_reason(response: Any) -> str | None:
    """The first ``finish_reason`` of a response's choices, or ``None``."""
    for choice in getattr(response, "choices", None) or ():
        reason = getattr(choice, "finish_reason", None)
        if isinstance(reason, str) and reason:
            return reason
    return None


def error_type(error: object) -> str:
    """The contract's ``error_type`` of a LiteLLM exception: ``stalled`` for a timeout,
    ``upstream_disconnect`` for a connection error, ``overloaded_error`` for 429/503/529, else
    ``api_error``. LiteLLM reports an upstream it could not reach as a 500
    ``InternalServerError`` caused by a connection error, so the exception's causes are read
    first."""
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
