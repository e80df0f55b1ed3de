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
* ``usage.cache_creation.ephemeral_1h_input_tokens`` is the one-hour part of the cache writes
  (``cache_creation_input_tokens``, or the sum of the per-TTL breakdown when only that is
  sent); ``usage.service_tier`` is the tier that served the message, ``usage.inference_geo``
  where it ran (``us``, ``global``); every counter of
  ``usage.server_tool_use`` (``web_search_requests``, …) is a unit of that name, but for those
  Anthropic bills no fee per use (``web_fetch_requests``: only its tokens are billed), which go
  to ``counters``;
* ``message_delta.usage.iterations`` (server-side compaction, the advisor tool): the
  top-level counts cover only part of the work (after a compaction, only the final
  iteration), so when a non-empty ``iterations`` list is sent, the attempt's usage is the sum,
  field by field, of every iteration billed at the call's model - those without a ``model``
  or with the message's own ``model`` (types ``compaction`` and ``message``) - and each
  iteration with another ``model`` (``advisor_message``, a fallback model's iteration) goes
  to ``other_models`` under that model; the reasoning count stays the top-level one;
* errors: an ``error`` event, ``{"type": "error", "error": {"type", "message"}}``, e.g.
  ``overloaded_error`` or ``api_error``.

A non-streaming response (:meth:`Tap.read_json`) is the ``message`` object itself: its
``usage`` is final (read as ``message_start``'s input and ``message_delta``'s output together),
its ``content`` blocks are counted as their deltas would be, one per non-empty text, thinking or
tool input.

Without a ``message_delta`` usage the stream has no final usage: the tap then reports the
input from ``message_start`` and the counted deltas as its generated output.
"""

from __future__ import annotations

from typing import Any

from billing.taps.base import Tap
from billing.taps.fields import (
    MalformedEventError,
    as_dict,
    error_from_event,
    opt_str,
    opt_tier,
    opt_tokens,
    opt_units,
    split_counters,
)
from billing.taps.usage import USAGE_INCONSISTENT, InputUsage, OtherModelUsage, Usage, build_input

__all__ = ["AnthropicMessagesTap"]

_DELTA_TEXT_FIELD = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}
_UNCOUNTED_DELTAS = frozenset({"signature_delta", "citations_delta"})
_INPUT_KEYS = ("input", "cache_read", "cache_creation", "cache_creation_1h")
#: Counters of ``usage.server_tool_use`` that Anthropic bills no fee per use for (they go to
#: ``stream.usage.counters``, never to ``units``).
_NOT_BILLED_PER_USE = frozenset({"web_fetch_requests"})
#: The field of a content block whose non-empty value is generated output.
_BLOCK_CONTENT = {"text": "text", "thinking": "thinking", "tool_use": "input"}
#: Iteration types billed at the message's own model when the message reports no model.
_OWN_MODEL_ITERATIONS = frozenset({"compaction", "message"})


def _read_counts(usage: dict[str, Any]) -> dict[str, int | None]:
    """The token counts of a usage object or of one of its iterations (``None``: absent)."""
    found: dict[str, int | None] = {
        "input": opt_tokens(usage, "input_tokens"),
        "cache_read": opt_tokens(usage, "cache_read_input_tokens"),
        "cache_creation": opt_tokens(usage, "cache_creation_input_tokens"),
        "cache_creation_1h": None,
        "output": opt_tokens(usage, "output_tokens"),
    }
    breakdown = usage.get("cache_creation")
    if isinstance(breakdown, dict):
        found["cache_creation_1h"] = opt_tokens(breakdown, "ephemeral_1h_input_tokens")
        if found["cache_creation"] is None:
            # only the per-TTL breakdown: its sum is the cache write count
            parts = [opt_tokens(breakdown, key) for key in breakdown]
            if any(part is not None for part in parts):
                found["cache_creation"] = sum(part or 0 for part in parts)
    return found


def _read_usage(usage: dict[str, Any]) -> dict[str, int]:
    """The token fields present in an Anthropic usage object (absent or null ones left out)."""
    found = _read_counts(usage)
    found["reasoning"] = None
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

    def __init__(self) -> None:
        super().__init__()
        self._reported_units: dict[str, int] = {}
        self._counters: dict[str, int] = {}
        # the latest usage.iterations, split: sums billed at the message's model, and the
        # iterations of other models; None until a message_delta sends a non-empty list
        self._iterations: tuple[dict[str, int], list[OtherModelUsage], bool] | None = None

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

    def _on_body(self, data: dict[str, Any]) -> None:
        if data.get("type") == "error" or data.get("error"):
            self._set_error(error_from_event(data))
            return
        content = data.get("content")
        for block in content if isinstance(content, list) else ():
            kind = block.get("type") if isinstance(block, dict) else None
            field = _BLOCK_CONTENT.get(kind) if isinstance(kind, str) else None
            if field is not None and isinstance(block.get(field), str | dict) and block[field]:
                self._count_deltas(1)
        self._on_message_start(data)
        usage = data.get("usage")
        self._on_message_delta(
            {"delta": {"stop_reason": data.get("stop_reason")}, "usage": usage}
            if usage is not None
            else {}
        )

    def _on_message_start(self, message: dict[str, Any]) -> None:
        self._set_model(opt_str(message, "model"))
        self._set_stop_reason(opt_str(message, "stop_reason"))
        usage = message.get("usage")
        if usage is None:
            return
        usage = as_dict(usage, "message_start.message.usage")
        fields = _read_usage(usage)
        self._set_service_tier(opt_tier(usage))
        self._set_inference_geo(opt_tier(usage, "inference_geo"))
        units, counters = split_counters(opt_units(usage, "server_tool_use"), _NOT_BILLED_PER_USE)
        self._reported_units.update(units)
        self._counters.update(counters)
        # output_tokens here is a placeholder inside the running count: not recorded; neither
        # are iterations: the final ones come with message_delta
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
        usage = as_dict(usage, "message_delta.usage")
        fields = _read_usage(usage)
        self._set_service_tier(opt_tier(usage))
        self._set_inference_geo(opt_tier(usage, "inference_geo"))
        if "server_tool_use" in usage:  # a snapshot: replaces
            self._reported_units, self._counters = split_counters(
                opt_units(usage, "server_tool_use"), _NOT_BILLED_PER_USE
            )
        iterations = usage.get("iterations")
        if iterations:
            try:
                self._iterations = self._split_iterations(iterations)
            except MalformedEventError:
                # counted as malformed, but the top-level usage of the event is still billed
                self._mark_malformed()
        self._raw.update(fields)  # a cumulative snapshot: repeated fields replace
        if "output" in self._raw or self._iterations is not None:
            self._set_usage(self._usage_now())
        elif any(key in self._raw for key in _INPUT_KEYS):
            self._set_input(self._input_usage())

    def _split_iterations(
        self, iterations: object
    ) -> tuple[dict[str, int], list[OtherModelUsage], bool]:
        """The iterations' counts billed at the message's model (summed, field by field), the
        iterations of other models, and whether a count was negative (taken as 0).

        Raises:
            MalformedEventError: ``iterations`` is not a list of usage objects.
        """
        if not isinstance(iterations, list):
            raise MalformedEventError("usage.iterations is not a list")
        own = dict.fromkeys(
            ("input", "cache_read", "cache_creation", "cache_creation_1h", "output"), 0
        )
        others: list[OtherModelUsage] = []
        negative = False
        for raw in iterations:
            iteration = as_dict(raw, "usage.iterations[]")
            counts = _read_counts(iteration)
            clean = {key: value or 0 for key, value in counts.items()}
            if any(value < 0 for value in clean.values()):
                negative = True
                clean = {key: max(0, value) for key, value in clean.items()}
            model = opt_str(iteration, "model")
            if (
                model is None
                or model == self.model
                or (self.model is None and iteration.get("type") in _OWN_MODEL_ITERATIONS)
            ):
                for key in own:
                    own[key] += clean[key]
            else:
                others.append(
                    OtherModelUsage(
                        model,
                        input_tokens=clean["input"],
                        output_tokens=clean["output"],
                        cache_read_input_tokens=clean["cache_read"],
                        cache_creation_input_tokens=clean["cache_creation"],
                    )
                )
        return own, others, negative

    def _usage_now(self) -> Usage:
        raw = self._raw
        if self._iterations is None:
            counts = {key: raw.get(key) for key in (*_INPUT_KEYS, "output")}
            others: list[OtherModelUsage] = []
            anomalies: tuple[str, ...] = ()
        else:
            own, others, negative = self._iterations
            counts = dict(own)
            anomalies = (USAGE_INCONSISTENT,) if negative else ()
        return self._build_usage(
            input_tokens=counts["input"],
            output_tokens=counts["output"],
            cache_read=counts["cache_read"],
            cache_creation=counts["cache_creation"],
            cache_creation_1h=counts["cache_creation_1h"],
            reasoning=raw.get("reasoning"),
            input_includes_cache=False,
            units=self._reported_units,
            counters=self._counters,
            other_models=tuple(others),
            anomalies=anomalies,
        )

    def _input_usage(self) -> InputUsage:
        raw = self._raw
        return build_input(
            input_tokens=raw.get("input"),
            cache_read=raw.get("cache_read"),
            cache_creation=raw.get("cache_creation"),
            cache_creation_1h=raw.get("cache_creation_1h"),
            input_includes_cache=False,
        )
