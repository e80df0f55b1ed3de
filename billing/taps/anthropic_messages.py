"""Tap for Anthropic Messages streams (``POST /v1/messages``, ``stream: true``).

Rules, from Anthropic's API docs ("Streaming Messages", "Prompt caching", "Extended thinking"):

* event kinds come from the JSON ``type`` (``event:`` lines may be missing or rewritten by
  proxies); ``ping`` and unknown kinds carry no usage and are ignored;
* ``message_start.message.usage`` gives ``input_tokens``, ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` - three DISJOINT counts, so no subtraction - and an
  ``output_tokens`` that is a placeholder (often 1) inside the running count: it is never added
  and never billed on its own;
* ``message_delta.usage`` is a CUMULATIVE snapshot: its ``output_tokens`` is the running total,
  and any input or cache field it repeats replaces the earlier value (never added);
  ``output_tokens_details.thinking_tokens`` (where sent) is the reasoning part of the output;
  ``message_delta.delta.stop_reason`` is the stop reason;
* ``content_block_delta`` with a non-empty ``text_delta``, ``input_json_delta`` or
  ``thinking_delta`` (or an unknown delta type carrying text) counts as one estimated output
  token; ``signature_delta`` and ``citations_delta`` do not;
* errors: an ``error`` event, ``{"type": "error", "error": {"type", "message"}}``, e.g.
  ``overloaded_error`` or ``api_error``.

Without a ``message_delta`` usage the stream has no final usage: the tap then reports the
input from ``message_start`` and the counted deltas as its generated output.
"""

from __future__ import annotations

from typing import Any

from billing.taps.base import Tap
from billing.taps.fields import MalformedEventError, as_dict, error_from_event, opt_str, opt_tokens
from billing.taps.usage import InputUsage, Usage

__all__ = ["AnthropicMessagesTap"]

_DELTA_TEXT_FIELD = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}
_UNCOUNTED_DELTAS = frozenset({"signature_delta", "citations_delta"})
_INPUT_KEYS = ("input", "cache_read", "cache_creation")


def _read_usage(usage: dict[str, Any]) -> dict[str, int]:
    """The token fields present in an Anthropic usage object (absent or null ones left out)."""
    found: dict[str, int | None] = {
        "input": opt_tokens(usage, "input_tokens"),
        "cache_read": opt_tokens(usage, "cache_read_input_tokens"),
        "cache_creation": opt_tokens(usage, "cache_creation_input_tokens"),
        "output": opt_tokens(usage, "output_tokens"),
        "reasoning": None,
    }
    if found["cache_creation"] is None:
        # only the per-TTL breakdown: its sum is the cache write count
        breakdown = usage.get("cache_creation")
        if isinstance(breakdown, dict):
            parts = [opt_tokens(breakdown, key) for key in breakdown]
            if any(part is not None for part in parts):
                found["cache_creation"] = sum(part or 0 for part in parts)
    details = usage.get("output_tokens_details")
    if details is not None:
        details = as_dict(details, "output_tokens_details")
        reasoning = opt_tokens(details, "thinking_tokens")
        if reasoning is None:
            reasoning = opt_tokens(details, "reasoning_tokens")
        found["reasoning"] = reasoning
    return {key: value for key, value in found.items() if value is not None}


def _delta_counts(delta: dict[str, Any]) -> bool:
    dtype = delta.get("type")
    if not isinstance(dtype, str):
        raise MalformedEventError("content_block_delta.delta has no type")
    field = _DELTA_TEXT_FIELD.get(dtype)
    if field is not None:
        value = delta.get(field)
        return isinstance(value, str) and bool(value)
    if dtype in _UNCOUNTED_DELTAS:
        return False
    return any(isinstance(v, str) and v for k, v in delta.items() if k != "type")


class AnthropicMessagesTap(Tap):
    """Tap for ``anthropic.messages`` streams; see the module doc for the rules."""

    protocol = "anthropic.messages"

    def _on_event(self, kind: str, sse_event: str | None, data: dict[str, Any]) -> None:
        if kind == "error" or sse_event == "error" or (kind == "" and data.get("error")):
            self._set_error(error_from_event(data))
        elif kind == "message_start":
            self._on_message_start(as_dict(data.get("message"), "message_start.message"))
        elif kind == "message_delta":
            self._on_message_delta(data)
        elif kind == "content_block_delta":
            if _delta_counts(as_dict(data.get("delta"), "content_block_delta.delta")):
                self._count_deltas(1)
        elif kind == "content_block_start":
            block = as_dict(data.get("content_block"), "content_block_start.content_block")
            if any(isinstance(block.get(k), str) and block[k] for k in ("text", "thinking")):
                self._count_deltas(1)

    def _on_message_start(self, message: dict[str, Any]) -> None:
        self._set_model(opt_str(message, "model"))
        self._set_stop_reason(opt_str(message, "stop_reason"))
        usage = message.get("usage")
        if usage is None:
            return
        fields = _read_usage(as_dict(usage, "message_start.message.usage"))
        # output_tokens here is a placeholder inside the running count: not recorded
        for key in _INPUT_KEYS:
            if key in fields:
                self._raw[key] = fields[key]
        if any(key in self._raw for key in _INPUT_KEYS) and self.usage is None:
            self._set_input(self._input_usage())

    def _on_message_delta(self, data: dict[str, Any]) -> None:
        delta = data.get("delta")
        if delta is not None:
            self._set_stop_reason(opt_str(as_dict(delta, "message_delta.delta"), "stop_reason"))
        usage = data.get("usage")
        if usage is None:
            return
        fields = _read_usage(as_dict(usage, "message_delta.usage"))
        self._raw.update(fields)  # a cumulative snapshot: repeated fields replace
        if "output" in self._raw:
            inp = self._input_usage()
            self._set_usage(
                Usage(
                    input_tokens=inp.input_tokens,
                    output_tokens=self._raw["output"],
                    cache_read_input_tokens=inp.cache_read_input_tokens,
                    cache_creation_input_tokens=inp.cache_creation_input_tokens,
                    reasoning_tokens=self._raw.get("reasoning", 0),
                )
            )
        elif any(key in self._raw for key in _INPUT_KEYS):
            self._set_input(self._input_usage())

    def _input_usage(self) -> InputUsage:
        return InputUsage(
            input_tokens=self._raw.get("input", 0),
            cache_read_input_tokens=self._raw.get("cache_read", 0),
            cache_creation_input_tokens=self._raw.get("cache_creation", 0),
        )
