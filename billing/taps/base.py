"""Shared machinery of the stream taps: token types, the :class:`Tap` base class, helpers.

Token semantics (CONTRACT.md, "Token semantics"), one for all protocols, every count in tokens:

* ``input_tokens`` is input billed at the full input rate: it EXCLUDES cache reads and cache
  writes;
* ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` are the cache reads / writes;
* ``output_tokens`` is all billed output, INCLUDING reasoning;
* ``reasoning_tokens`` is the part of ``output_tokens`` spent on reasoning, for information.

A tap is fed the raw response body of one streaming upstream attempt, decodes it with
:class:`billing.taps.sse.SSEDecoder`, and keeps a running account of what it has seen. It never
raises on stream content: an event it cannot read is counted in :attr:`Tap.malformed_events`
and skipped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from billing.taps.sse import SSEDecoder, SSEEvent

__all__ = [
    "InputUsage",
    "MalformedEventError",
    "Tap",
    "Usage",
    "as_dict",
    "error_from_event",
    "normalize_error",
    "opt_str",
    "opt_tokens",
]


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage of one attempt in the contract's token semantics (all counts in tokens, >= 0).

    ``input_tokens`` excludes cache reads and writes; ``output_tokens`` includes reasoning;
    ``reasoning_tokens`` is a subset of ``output_tokens``.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The five counts as a dict keyed by the contract's field names."""
        return {
            "input_tokens": self.input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


@dataclass(frozen=True, slots=True)
class InputUsage:
    """The input side of a usage report (tokens), as far as the stream has reported it.

    Anthropic reports it in ``message_start`` before any output; OpenAI only with the final
    usage. Same semantics as :class:`Usage`: the three counts are disjoint.
    """

    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The three counts as a dict keyed by the contract's field names."""
        return {
            "input_tokens": self.input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
        }


class MalformedEventError(Exception):
    """Raised inside a tap when an event cannot be read; the tap counts and skips the event."""


def as_dict(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object, or :class:`MalformedEventError` naming ``what``."""
    if isinstance(value, dict):
        return value
    raise MalformedEventError(f"{what} is not an object")


def opt_tokens(obj: Mapping[str, Any], key: str) -> int | None:
    """A token count field: ``None`` when absent or null, else a non-negative integer.

    A boolean, a negative number, a non-integral number or a non-number is malformed.
    """
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise MalformedEventError(f"{key} is a boolean")
    if isinstance(value, int):
        if value < 0:
            raise MalformedEventError(f"{key} is negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    raise MalformedEventError(f"{key} is not a token count")


def opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    """A string field: ``None`` when absent, null, empty or not a string."""
    value = obj.get(key)
    if isinstance(value, str) and value:
        return value
    return None


def normalize_error(raw: object, default_type: str = "api_error") -> dict[str, Any]:
    """An in-stream error as a dict with at least ``type`` and ``message`` (both strings).

    ``raw`` is the provider's error object (every field it has is kept) or a bare message
    string. When it has no string ``type``, its ``code`` (as a string) stands in, else
    ``default_type``.
    """
    err: dict[str, Any]
    if isinstance(raw, dict):
        err = dict(raw)
    elif isinstance(raw, str):
        err = {"message": raw}
    else:
        err = {}
    etype = err.get("type")
    if not isinstance(etype, str) or not etype:
        code = err.get("code")
        if isinstance(code, str) and code:
            err["type"] = code
        elif isinstance(code, int) and not isinstance(code, bool):
            err["type"] = str(code)
        else:
            err["type"] = default_type
    message = err.get("message")
    if not isinstance(message, str):
        err["message"] = "" if message is None else str(message)
    return err


def error_from_event(data: Mapping[str, Any]) -> object:
    """The error object of an error event: its ``error`` member when that is an object or a
    string, else the event itself without its ``type: "error"`` marker (OpenAI Responses'
    flat ``{"type": "error", "code", "message", "param"}``)."""
    inner = data.get("error")
    if isinstance(inner, dict | str) and inner:
        return inner
    return {k: v for k, v in data.items() if not (k == "type" and v == "error")}


class Tap(ABC):
    """Incremental reader of one streaming upstream response (one attempt).

    Feed it the response body with :meth:`feed` as bytes come off the socket (any split), then
    :meth:`close` at end of input. At any moment the properties tell:

    * :attr:`output_tokens` - output tokens generated so far; exact when the stream reported
      a running or final count, else one token per non-empty content delta (text, tool-call
      arguments, reasoning/thinking), in which case :attr:`output_tokens_is_estimate` is true;
    * :attr:`usage` - the usage the provider reported (:class:`Usage`), or ``None``;
    * :attr:`input_reported` - the input side reported so far (:class:`InputUsage`), or ``None``;
    * :attr:`stop_reason`, :attr:`model`, :attr:`error`, :attr:`malformed_events`.

    The stream ends at ``data: [DONE]`` or at end of input, never at a finish reason: usage
    may follow it. Events after ``[DONE]`` are ignored.

    Subclasses implement :meth:`_on_event` for one protocol.
    """

    protocol: ClassVar[str]

    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._closed = False
        self._done = False
        self._malformed = 0
        self._events = 0
        self._event_bad = False
        # output accounting
        self._exact_output: int | None = None
        self._deltas_total = 0
        self._deltas_since_exact = 0
        # reported state
        self._usage: Usage | None = None
        self._input: InputUsage | None = None
        self._stop_reason: str | None = None
        self._model: str | None = None
        self._error: dict[str, Any] | None = None

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Read one piece of the response body (bytes exactly as received, any split).

        Never raises on stream content; feeding after :meth:`close` is ignored.
        """
        if self._closed:
            return
        for event in self._decoder.feed(chunk):
            self._handle(event)

    def close(self) -> None:
        """Mark the end of input; a last block without its trailing blank line still counts."""
        if self._closed:
            return
        for event in self._decoder.close():
            self._handle(event)
        self._closed = True

    def _handle(self, event: SSEEvent) -> None:
        if self._done:
            return
        data = event.data.strip()
        if not data:
            return
        if data == "[DONE]":
            self._done = True
            return
        self._events += 1
        self._event_bad = False
        try:
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                if event.event == "error":  # a named error event with a plain-text message
                    self._set_error(data)
                raise
            if not isinstance(payload, dict):
                raise MalformedEventError("event data is not a JSON object")
            kind = payload.get("type")
            if not isinstance(kind, str) or not kind:
                kind = event.event or ""
            self._on_event(kind, event.event, payload)
        except Exception:  # never raise on stream content: count and skip
            self._event_bad = True
        if self._event_bad:
            self._malformed += 1

    def _mark_malformed(self) -> None:
        """Count the current event as malformed once, while going on reading the rest of it."""
        self._event_bad = True

    @abstractmethod
    def _on_event(self, kind: str, sse_event: str | None, data: dict[str, Any]) -> None:
        """Apply one decoded JSON event.

        ``kind`` is ``data["type"]`` when it is a non-empty string, else the SSE ``event:``
        name (or ``""``); ``sse_event`` is the SSE ``event:`` name. Raise
        :class:`MalformedEventError` (or any exception) to count the event as malformed.
        """

    # -- state updates for subclasses ------------------------------------------------------

    def _count_deltas(self, n: int = 1) -> None:
        """Count ``n`` content deltas (one estimated output token each)."""
        if n > 0:
            self._deltas_total += n
            self._deltas_since_exact += n

    def _set_openai_usage(
        self,
        input_total: int | None,
        cached: int,
        cache_write: int,
        output: int | None,
        reasoning: int,
    ) -> None:
        """Record an OpenAI-style usage, whose input total includes cache reads and writes.

        Converts to the contract's semantics (CONTRACT "Token semantics"): ``input_tokens =
        total − cached − cache_write``. A usage without input only updates the output count; one
        without output only records the input.
        """
        if input_total is None:
            if output is not None:
                self._set_exact_output(output)
            return
        input_tokens = max(0, input_total - cached - cache_write)
        if output is None:
            self._set_input(InputUsage(input_tokens, cached, cache_write))
            return
        self._set_usage(
            Usage(
                input_tokens=input_tokens,
                output_tokens=output,
                cache_read_input_tokens=cached,
                cache_creation_input_tokens=cache_write,
                reasoning_tokens=reasoning,
            )
        )

    def _set_exact_output(self, output_tokens: int) -> None:
        """Record a running or final output count reported by the stream (a snapshot)."""
        self._exact_output = output_tokens
        self._deltas_since_exact = 0

    def _set_usage(self, usage: Usage) -> None:
        """Record a usage reported by the provider; it replaces any earlier report."""
        self._usage = usage
        self._set_exact_output(usage.output_tokens)
        self._input = InputUsage(
            input_tokens=usage.input_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
        )

    def _set_input(self, input_usage: InputUsage) -> None:
        self._input = input_usage

    def _set_stop_reason(self, reason: str | None) -> None:
        if reason:
            self._stop_reason = reason

    def _set_model(self, model: str | None) -> None:
        if model:
            self._model = model

    def _set_error(self, raw: object, default_type: str = "api_error") -> None:
        """Record an in-stream error; the first one wins, a later one only adds fields."""
        err = normalize_error(raw, default_type)
        if self._error is None:
            self._error = err
        else:
            for key, value in err.items():
                self._error.setdefault(key, value)

    # -- readable state --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def done(self) -> bool:
        """Whether the stream sent ``data: [DONE]`` (later events are ignored)."""
        return self._done

    @property
    def output_tokens(self) -> int:
        """Output tokens generated so far (tokens).

        The last count the stream reported plus one per content delta seen after it; without
        any reported count, one per content delta.
        """
        if self._exact_output is None:
            return self._deltas_total
        return self._exact_output + self._deltas_since_exact

    @property
    def output_tokens_is_estimate(self) -> bool:
        """True when :attr:`output_tokens` is (partly) counted from deltas, not reported."""
        return self._exact_output is None or self._deltas_since_exact > 0

    @property
    def content_deltas(self) -> int:
        """Number of non-empty content deltas seen (all choices, all kinds)."""
        return self._deltas_total

    @property
    def usage(self) -> Usage | None:
        """The latest usage the provider reported (contract semantics), or ``None``."""
        return self._usage

    @property
    def usage_is_final(self) -> bool:
        """True when a reported usage exists and no content was generated after it."""
        return self._usage is not None and self._deltas_since_exact == 0

    @property
    def input_reported(self) -> InputUsage | None:
        """Input, cache-read and cache-write tokens reported so far, or ``None``."""
        return self._input

    @property
    def stop_reason(self) -> str | None:
        """Why generation stopped, in the protocol's own words, or ``None`` if not known."""
        return self._stop_reason

    @property
    def model(self) -> str | None:
        """The model name the upstream reported, or ``None``."""
        return self._model

    @property
    def error(self) -> dict[str, Any] | None:
        """The first in-stream error: the provider's error fields plus ``type`` and ``message``
        (strings, always present), or ``None``."""
        return None if self._error is None else dict(self._error)

    @property
    def malformed_events(self) -> int:
        """Number of events that could not be read (bad JSON, unexpected shape)."""
        return self._malformed

    @property
    def events_seen(self) -> int:
        """Number of data events read (``[DONE]`` and empty data not counted)."""
        return self._events

    # -- contract payloads -----------------------------------------------------------------

    def usage_payload(self, *, fallback_input_tokens: int | None = None) -> dict[str, Any]:
        """The ``stream.usage`` payload for this attempt; see
        :func:`billing.taps.events.stream_usage_payload`."""
        from billing.taps.events import stream_usage_payload

        return stream_usage_payload(self, fallback_input_tokens=fallback_input_tokens)

    def failed_payload(self) -> dict[str, Any] | None:
        """The ``stream.failed`` payload, or ``None``; see
        :func:`billing.taps.events.stream_failed_payload`."""
        from billing.taps.events import stream_failed_payload

        return stream_failed_payload(self)

    def final_events(self, *, fallback_input_tokens: int | None = None) -> list[dict[str, Any]]:
        """The closing events of the attempt, each a payload plus its ``type``; see
        :func:`billing.taps.events.attempt_final_events`."""
        from billing.taps.events import attempt_final_events

        return attempt_final_events(self, fallback_input_tokens=fallback_input_tokens)
