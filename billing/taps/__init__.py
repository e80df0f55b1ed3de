"""Incremental stream taps: read an upstream SSE response body and account for its tokens.

One tap per protocol (CONTRACT.md, "Background"):

* ``openai.chat_completions`` - :class:`~billing.taps.openai_chat.ChatCompletionsTap`
* ``openai.responses`` - :class:`~billing.taps.openai_responses.ResponsesTap`
* ``anthropic.messages`` - :class:`~billing.taps.anthropic_messages.AnthropicMessagesTap`

Typical use by a gateway::

    tap = open_tap("anthropic.messages")
    for chunk in upstream_body:          # bytes, split anywhere
        tap.feed(chunk)
        report(tap.output_tokens)        # generated so far (tokens)
    tap.close()
    for payload in tap.final_events():   # stream.usage (+ stream.failed)
        send(envelope | payload)

A non-streaming response is one call of ``tap.read_json(body)`` (the whole response object, or
the provider's error body), then ``final_events()`` as above.

All counts are tokens, in the contract's semantics (:class:`Usage`); the v2 dimensions (CONTRACT
"Usage dimensions (v2)": one-hour cache writes, the served tier, units, other models' tokens,
``usage_inconsistent``) are read by each tap and built by :mod:`billing.taps.usage`.
"""

from __future__ import annotations

from billing.taps.anthropic_messages import AnthropicMessagesTap
from billing.taps.base import Tap
from billing.taps.events import attempt_final_events, stream_failed_payload, stream_usage_payload
from billing.taps.openai_chat import ChatCompletionsTap
from billing.taps.openai_responses import ResponsesTap
from billing.taps.sse import SSEDecoder, SSEEvent
from billing.taps.usage import InputUsage, OtherModelUsage, Usage

__all__ = [
    "PROTOCOLS",
    "AnthropicMessagesTap",
    "ChatCompletionsTap",
    "InputUsage",
    "OtherModelUsage",
    "ResponsesTap",
    "SSEDecoder",
    "SSEEvent",
    "Tap",
    "Usage",
    "attempt_final_events",
    "open_tap",
    "stream_failed_payload",
    "stream_usage_payload",
]

_TAPS: dict[str, type[Tap]] = {
    cls.protocol: cls for cls in (ChatCompletionsTap, ResponsesTap, AnthropicMessagesTap)
}

#: The protocol ids of the contract, in its order.
PROTOCOLS: tuple[str, ...] = tuple(_TAPS)


def open_tap(protocol: str) -> Tap:
    """A new tap for one streaming attempt of ``protocol`` (one of :data:`PROTOCOLS`).

    Raises:
        ValueError: ``protocol`` is not one of :data:`PROTOCOLS`.
    """
    try:
        cls = _TAPS[protocol]
    except (KeyError, TypeError):
        known = ", ".join(PROTOCOLS)
        raise ValueError(f"unknown protocol {protocol!r}: expected one of {known}") from None
    return cls()
