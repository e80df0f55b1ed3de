"""Tap for OpenAI Chat Completions streams (``POST /v1/chat/completions``, ``stream: true``).

Rules, from the OpenAI API reference ("The chat completion chunk object", ``stream_options.
include_usage``) and the OpenAI-compatible providers seen in the wild:

* each ``data:`` is a ``chat.completion.chunk`` object; ``data: [DONE]`` ends the stream;
* ``choices[].delta`` carries the generated content: ``content``, ``refusal``,
  ``tool_calls[].function.arguments``, the legacy ``function_call.arguments``, and reasoning
  text (``reasoning_content``, ``reasoning``) from compatible providers; each non-empty piece
  counts as one estimated output token, across all choices (``n`` > 1);
* ``choices[].finish_reason`` is the stop reason; it does NOT end the stream: the usage
  usually follows in a chunk with ``"choices": []`` (or no ``choices``, or still a choice);
* ``usage`` (also Groq's legacy ``x_groq.usage``): ``prompt_tokens`` INCLUDES the cached
  tokens, wherever the provider reports them (``prompt_tokens_details.cached_tokens``, else a
  top-level ``usage.cached_tokens``, else DeepSeek's ``prompt_cache_hit_tokens``), and the
  cache writes where a provider reports them (``prompt_tokens_details.cache_write_tokens`` /
  ``cache_creation_input_tokens``), so
  ``input_tokens = prompt_tokens - cached - cache writes``; ``completion_tokens`` includes
  ``completion_tokens_details.reasoning_tokens``. Some providers send a cumulative usage on
  every chunk: each one is a snapshot that replaces the previous (fields it omits are kept);
* ``service_tier`` on the chunk (OpenAI sends it on every chunk) is the tier that served the
  request (``default``, ``priority``, ``flex``, …; ``auto`` is a requested value, not a served
  one, and is left out);
* OpenRouter's ``usage.server_tool_use_details.web_search_requests`` is the unit
  ``web_search_requests`` (its ``tool_calls_*`` counters count the same searches again and
  are not billed by themselves); its ``usage.cost`` (USD) is the provider's cost of the
  attempt, ``provider_cost_usd``, read exactly from the JSON text;
* a non-streaming response (:meth:`Tap.read_json`) is one ``chat.completion`` object: its
  ``choices[].message`` holds what the deltas would (counted the same way), its ``usage`` and
  ``service_tier`` are read as above;
* in-stream errors: a chunk with an ``error`` member, or an ``event: error`` block.

Cached tokens above ``prompt_tokens`` or a negative count are corrected and flagged
``usage_inconsistent`` (:mod:`billing.taps.usage`), never dropped.
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
)

__all__ = ["ChatCompletionsTap"]

_TEXT_FIELDS = frozenset({"content", "refusal", "reasoning_content", "reasoning"})
#: OpenRouter's billed server-tool counters (``usage.server_tool_use_details``).
_OPENROUTER_UNITS = ("web_search_requests",)
_TEXT = (str, list)
#: The keys of a plain text delta (``ChatCompletionsTap._text_delta``).
_TEXT_DELTA_KEYS = frozenset({"content", "role"})
_CONTENT = (str, list, dict)


def _nonempty(value: object) -> bool:
    return isinstance(value, _CONTENT) and len(value) > 0


def _delta_pieces(delta: dict[str, Any]) -> int:
    """Number of non-empty generated pieces in one choice delta."""
    n = 0
    for key, value in delta.items():  # the delta's own keys (usually one or two), once each
        if key in _TEXT_FIELDS:
            if value and isinstance(value, _TEXT):
                n += 1
        elif key == "tool_calls":
            if value is None:
                continue
            if not isinstance(value, list):
                raise MalformedEventError("tool_calls is not a list")
            for call in value:
                function = as_dict(call, "tool call").get("function")
                if isinstance(function, dict) and _nonempty(function.get("arguments")):
                    n += 1
        elif key == "function_call":
            if isinstance(value, dict) and _nonempty(value.get("arguments")):
                n += 1
        elif (
            key == "audio"
            and isinstance(value, dict)
            and (_nonempty(value.get("transcript")) or _nonempty(value.get("data")))
        ):
            n += 1
    return n


class ChatCompletionsTap(Tap):
    """Tap for ``openai.chat_completions`` streams; see the module doc for the rules."""

    protocol = "openai.chat_completions"
    _TEXT_KEY = b'"content"'

    def __init__(self) -> None:
        super().__init__()
        self._reported_units: dict[str, int] = {}

    def _text_delta(self, kind: str, data: dict[str, Any]) -> str | None:
        # One choice whose delta is its content (and the role) and nothing else read here: no
        # finish reason, usage or error (what the event sets again is what it just set).
        choices = data.get("choices")
        if (
            kind == "error"
            or type(choices) is not list
            or len(choices) != 1
            or data.get("usage") is not None
            or data.get("x_groq") is not None
            or data.get("error") is not None
        ):
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason"):
            return None
        delta = choice.get("delta")
        if type(delta) is not dict or not delta.keys() <= _TEXT_DELTA_KEYS:
            return None
        content = delta.get("content")
        return content if type(content) is str else None

    def _on_event(self, kind: str, sse_event: str | None, data: dict[str, Any]) -> None:
        # read once per chunk: a field that did not change (the model on every chunk) or is
        # absent is skipped before its reader
        if data.get("model") != self._model:
            self._set_model(opt_str(data, "model"))
        if data.get("service_tier") is not None:
            self._set_service_tier(opt_tier(data))
        error = data.get("error")
        if (error is not None and _nonempty(error)) or kind == "error" or sse_event == "error":
            self._set_error(error_from_event(data))

        choices = data.get("choices")
        if choices is not None:
            if isinstance(choices, list):
                for choice in choices:  # (the choice's rules in line: they run for every chunk)
                    try:
                        if type(choice) is not dict:
                            choice = as_dict(choice, "choice")
                        delta = choice.get("delta")
                        if delta is not None:
                            pieces = _delta_pieces(
                                delta if type(delta) is dict else as_dict(delta, "delta")
                            )
                            if pieces:
                                self._deltas_total += pieces
                                self._deltas_since_exact += pieces
                        finish = choice.get("finish_reason")
                        if finish and isinstance(finish, str):
                            self._set_stop_reason(finish)
                    except MalformedEventError:
                        self._mark_malformed()
            else:
                self._mark_malformed()

        usage = data.get("usage")
        if usage is None:
            x_groq = data.get("x_groq")
            if isinstance(x_groq, dict):
                usage = x_groq.get("usage")
            if usage is not None:
                self._on_usage(as_dict(usage, "x_groq.usage"), None)
                return
        if usage is not None:
            self._on_usage(as_dict(usage, "usage"), ("usage", "cost"))

    def _on_body(self, data: dict[str, Any]) -> None:
        self._set_model(opt_str(data, "model"))
        self._set_service_tier(opt_tier(data))
        error = data.get("error")
        if error is not None and _nonempty(error):
            self._set_error(error_from_event(data))
        choices = data.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            choice = as_dict(choice, "choice")
            message = choice.get("message")
            if message is not None:
                self._count_deltas(_delta_pieces(as_dict(message, "message")))
            finish = choice.get("finish_reason")
            if finish and isinstance(finish, str):
                self._set_stop_reason(finish)
        usage = data.get("usage")
        if usage is not None:
            self._on_usage(as_dict(usage, "usage"), ("usage", "cost"))

    def _on_usage(self, usage: dict[str, Any], cost_at: tuple[str, ...] | None) -> None:
        """Read one usage object; ``cost_at``: where its ``cost`` is in the event's JSON text
        (``None``: a usage that carries no cost of the provider's)."""
        found: dict[str, int | None] = {
            "prompt": opt_tokens(usage, "prompt_tokens"),
            "completion": opt_tokens(usage, "completion_tokens"),
            "cached": None,
            "cache_write": opt_tokens(usage, "cache_creation_input_tokens"),
            "reasoning": None,
        }
        details = usage.get("prompt_tokens_details")
        if details is not None:
            details = as_dict(details, "prompt_tokens_details")
            found["cached"] = opt_tokens(details, "cached_tokens")
            write = opt_tokens(details, "cache_write_tokens")
            if write is not None:
                found["cache_write"] = write
        if found["cached"] is None:
            found["cached"] = opt_tokens(usage, "cached_tokens")
        if found["cached"] is None:
            found["cached"] = opt_tokens(usage, "prompt_cache_hit_tokens")  # DeepSeek
        details = usage.get("completion_tokens_details")
        if details is not None:
            found["reasoning"] = opt_tokens(
                as_dict(details, "completion_tokens_details"), "reasoning_tokens"
            )

        units = opt_units(usage, "server_tool_use_details", _OPENROUTER_UNITS)

        for key, value in found.items():
            if value is not None:
                self._raw[key] = value
        self._reported_units.update(units)

        raw = self._raw
        self._set_openai_usage(
            raw.get("prompt"),
            raw.get("cached"),
            raw.get("cache_write"),
            raw.get("completion"),
            raw.get("reasoning"),
            units=self._reported_units,
            cost_path=cost_at if cost_at is not None and usage.get("cost") is not None else None,
        )
