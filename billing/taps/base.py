"""The :class:`Tap` base class: feeding, the running account of a stream, and what it reads.

A tap is fed the raw response body of one streaming upstream attempt, decodes it with
:class:`billing.taps.sse.SSEDecoder`, and keeps a running account of what it has seen, in the
contract's token semantics (:mod:`billing.taps.usage`). It never raises on stream content: an
event it cannot read is counted in :attr:`Tap.malformed_events` and skipped.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, ClassVar, Generic, TypeVar

import orjson

from billing.taps.events import attempt_final_events, stream_failed_payload, stream_usage_payload
from billing.taps.fields import MalformedEventError, normalize_error
from billing.taps.sse import SSEDecoder
from billing.taps.usage import InputUsage, OtherModelUsage, Usage, build_input, build_usage

__all__ = ["Tap"]

T = TypeVar("T")

#: A JSON string's body that is its text's UTF-8 bytes as they are: no quote, no backslash (no
#: escape), no control character (which JSON forbids unescaped).
_PLAIN_TEXT = re.compile(rb'[^"\\\x00-\x1f]*')


def _utf8(text: bytes) -> bool:
    """Whether ``text`` is valid UTF-8."""
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


def _plain_text(text: bytes) -> bool:
    """Whether ``text`` is a JSON string body that reads as its own bytes (valid UTF-8)."""
    return _PLAIN_TEXT.fullmatch(text) is not None and (text.isascii() or _utf8(text))


class _Reads(Generic[T]):
    """A read-only attribute of a tap that returns one of its private attributes."""

    def __init__(self, attr: str, doc: str) -> None:
        self._attr = attr
        self.__doc__ = doc

    def __get__(self, tap: Tap, owner: type | None = None) -> T:
        value: T = getattr(tap, self._attr)
        return value


class Tap(ABC):
    """Incremental reader of one streaming upstream response (one attempt).

    Feed it the response body with :meth:`feed` as bytes come off the socket (any split), then
    :meth:`close` at end of input. At any moment the properties tell:

    * :attr:`output_tokens` - output tokens generated so far; exact when the stream reported
      a running or final count, else one token per non-empty content delta (text, tool-call
      arguments, reasoning/thinking), in which case :attr:`output_tokens_is_estimate` is true;
    * :attr:`usage` - the usage the provider reported (:class:`Usage`), or ``None``;
    * :attr:`input_reported` - the input side reported so far (:class:`InputUsage`), or ``None``;
    * :attr:`service_tier` - the tier the upstream says it served, or ``None``;
    * :attr:`units` - the billable non-token units seen so far (``{"web_search_requests": 3}``);
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
        self._service_tier: str | None = None
        # units counted from the stream's own items (not from a usage report), e.g. the
        # Responses API's web_search_call output items
        self._stream_units: dict[str, int] = {}
        # the provider's usage counts seen so far, by the protocol's own names (a later report
        # of a count replaces it)
        self._raw: dict[str, int] = {}
        # The last event read, when it was a plain text delta (``_text_delta``): its data's
        # bytes before and after the text. The next event that is the same bytes around another
        # text changes nothing but the count of its piece (see ``feed``); with their lengths.
        self._echo: tuple[bytes, bytes, int, int] | None = None
        # The last chunk fed was one whole block (``SSEDecoder.whole_block``) or an echo: the
        # decoder has nothing pending.
        self._whole = False

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Read one piece of the response body (bytes exactly as received, any split).

        Never raises on stream content; feeding after :meth:`close` is ignored.
        """
        if self._closed:
            return
        echo = self._echo
        if echo is not None and self._whole and type(chunk) is bytes and not self._done:
            # The previous event again, as a whole block, with another text (a provider repeats
            # a chunk's every other byte across a stream's text deltas): reading it would only
            # count its piece, so it is counted without reading the JSON. (``_whole``: the
            # decoder has nothing pending; the block is one ``data:`` line, as ``whole_block``
            # would take it: the bytes around the text hold no line end, the text no control
            # character.)
            before, after, start, tail = echo
            end = len(chunk) - tail
            if (
                end >= start
                and chunk.startswith(before)
                and chunk.endswith(after)
                and _plain_text(chunk[start:end])
            ):
                self._events += 1
                self._event_bad = False
                if end > start:
                    self._deltas_total += 1
                    self._deltas_since_exact += 1
                return
        decoder = self._decoder
        data = decoder.whole_block(chunk)  # the usual chunk: one whole block, nothing pending
        if data is not None:
            self._whole = True
            self._handle(None, data)
            return
        self._whole = False
        for name, data, _ in decoder.feed_raw(chunk):
            self._handle(name, data)

    def close(self) -> None:
        """Mark the end of input; a last block without its trailing blank line still counts."""
        if self._closed:
            return
        for name, data, _ in self._decoder.close_raw():
            self._handle(name, data)
        self._closed = True

    def _handle(self, sse_event: str | None, raw: bytes) -> None:
        """One event's data (UTF-8 bytes): ``[DONE]``, nothing, or a JSON event."""
        if self._done:
            return
        text: str | None = None
        try:
            payload = orjson.loads(raw)  # the usual event: its bytes are the JSON text
        except orjson.JSONDecodeError:
            # not JSON as it is: [DONE], blank data, invalid UTF-8 or non-JSON whitespace around
            # the JSON (read as the decoded, stripped text), or not JSON at all
            text = raw.decode("utf-8", "replace").strip()
            if not text:
                return
            if text == "[DONE]":
                self._done = True
                return
        self._events += 1
        self._event_bad = False
        try:
            if text is not None:
                try:
                    payload = orjson.loads(text)
                except orjson.JSONDecodeError:
                    if sse_event == "error":  # a named error event with a plain-text message
                        self._set_error(text)
                    raise
            if not isinstance(payload, dict):
                raise MalformedEventError("event data is not a JSON object")
            named = payload.get("type")
            kind: str = named if isinstance(named, str) and named else (sse_event or "")
            self._on_event(kind, sse_event, payload)
        except Exception:  # never raise on stream content: count and skip
            self._event_bad = True
        self._echo = None
        if self._event_bad:
            self._malformed += 1
        elif text is None and sse_event is None and self._TEXT_KEY is not None:
            delta = self._text_delta(kind, payload)
            if delta is not None:
                self._echo = _echo_of(raw, self._TEXT_KEY, delta)

    def _mark_malformed(self) -> None:
        """Count the current event as malformed once, while going on reading the rest of it."""
        self._event_bad = True

    #: The JSON key (quoted, as in the bytes) of a plain text delta's text (``_text_delta``), or
    #: None: the protocol's taps read every event.
    _TEXT_KEY: ClassVar[bytes | None] = None

    def _text_delta(self, kind: str, data: dict[str, Any]) -> str | None:
        """The text of ``data`` (an event :meth:`_on_event` just read, without an SSE event
        name) when it is a plain text delta: reading it again with another text, right after
        it, would change nothing but its one counted piece (none for an empty text). Its text
        is the value of the one ``_TEXT_KEY`` in the event. Else None."""
        return None

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
        cached: int | None,
        cache_write: int | None,
        output: int | None,
        reasoning: int | None,
        units: dict[str, int] | None = None,
    ) -> None:
        """Record an OpenAI-style usage, whose input total includes cache reads and writes.

        Converts to the contract's semantics (CONTRACT "Token semantics"): ``input_tokens =
        total − cached − cache_write``, with contradictions corrected and flagged by
        :func:`billing.taps.usage.build_usage` (cached above the total: cache read = the total,
        input 0). A usage without input only updates the output count; one without output only
        records the input. ``units``: units the usage reports (name → count).
        """
        if input_total is None:
            if output is not None:
                self._set_exact_output(max(0, output))
            return
        if output is None:
            self._set_input(
                build_input(
                    input_tokens=input_total,
                    cache_read=cached,
                    cache_creation=cache_write,
                    input_includes_cache=True,
                )
            )
            return
        self._set_usage(
            self._build_usage(
                input_tokens=input_total,
                output_tokens=output,
                cache_read=cached,
                cache_creation=cache_write,
                reasoning=reasoning,
                input_includes_cache=True,
                units=units,
            )
        )

    def _build_usage(
        self,
        *,
        input_tokens: int | None,
        output_tokens: int | None,
        input_includes_cache: bool,
        cache_read: int | None = None,
        cache_creation: int | None = None,
        cache_creation_1h: int | None = None,
        reasoning: int | None = None,
        units: dict[str, int] | None = None,
        other_models: tuple[OtherModelUsage, ...] = (),
        anomalies: tuple[str, ...] = (),
    ) -> Usage:
        """A :class:`Usage` from the provider's raw counts (see
        :func:`billing.taps.usage.build_usage`), with the served tier seen so far and the units
        counted from the stream (a unit the usage itself reports wins)."""
        return build_usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read=cache_read,
            cache_creation=cache_creation,
            cache_creation_1h=cache_creation_1h,
            reasoning=reasoning,
            input_includes_cache=input_includes_cache,
            service_tier=self._service_tier,
            units={**self._stream_units, **(units or {})},
            other_models=other_models,
            anomalies=anomalies,
        )

    def _set_service_tier(self, tier: str | None) -> None:
        """Record the tier the upstream says it served (a later report replaces it)."""
        if tier:
            self._service_tier = tier
            if self._usage is not None and self._usage.service_tier != tier:
                self._usage = replace(self._usage, service_tier=tier)

    def _set_stream_unit(self, name: str, count: int) -> None:
        """Record a unit counted from the stream's own items (a running count)."""
        self._stream_units[name] = count

    def _set_exact_output(self, output_tokens: int) -> None:
        """Record a running or final output count reported by the stream (a snapshot)."""
        self._exact_output = output_tokens
        self._deltas_since_exact = 0

    def _set_usage(self, usage: Usage) -> None:
        """Record a usage reported by the provider; it replaces any earlier report."""
        self._usage = usage
        self._set_exact_output(usage.output_tokens)
        self._input = usage.input

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

    closed = _Reads[bool]("_closed", "Whether :meth:`close` was called.")
    done = _Reads[bool](
        "_done", "Whether the stream sent ``data: [DONE]`` (later events are ignored)."
    )

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

    content_deltas = _Reads[int](
        "_deltas_total", "Number of non-empty content deltas seen (all choices, all kinds)."
    )
    usage = _Reads[Usage | None](
        "_usage", "The latest usage the provider reported (contract semantics), or ``None``."
    )

    @property
    def usage_is_final(self) -> bool:
        """True when a reported usage exists and no content was generated after it."""
        return self._usage is not None and self._deltas_since_exact == 0

    input_reported = _Reads[InputUsage | None](
        "_input", "Input, cache-read and cache-write tokens reported so far, or ``None``."
    )
    stop_reason = _Reads[str | None](
        "_stop_reason",
        "Why generation stopped, in the protocol's own words, or ``None`` if not known.",
    )
    model = _Reads[str | None]("_model", "The model name the upstream reported, or ``None``.")
    service_tier = _Reads[str | None](
        "_service_tier",
        "The service tier the upstream says it SERVED (never the one asked for), or ``None``.",
    )

    @property
    def units(self) -> dict[str, int]:
        """Billable non-token units seen so far (name → count > 0): those the latest usage
        reports, else those counted from the stream's items."""
        units = {name: count for name, count in self._stream_units.items() if count > 0}
        if self._usage is not None:
            units.update(self._usage.units)
        return units

    @property
    def error(self) -> dict[str, Any] | None:
        """The first in-stream error: the provider's error fields plus ``type`` and ``message``
        (strings, always present), or ``None``."""
        return None if self._error is None else dict(self._error)

    malformed_events = _Reads[int](
        "_malformed", "Number of events that could not be read (bad JSON, unexpected shape)."
    )
    events_seen = _Reads[int](
        "_events", "Number of data events read (``[DONE]`` and empty data not counted)."
    )
    # -- contract payloads -----------------------------------------------------------------

    def usage_payload(self, *, fallback_input_tokens: int | None = None) -> dict[str, Any]:
        """The ``stream.usage`` payload for this attempt; see
        :func:`billing.taps.events.stream_usage_payload`."""
        return stream_usage_payload(self, fallback_input_tokens=fallback_input_tokens)

    def failed_payload(self) -> dict[str, Any] | None:
        """The ``stream.failed`` payload, or ``None``; see
        :func:`billing.taps.events.stream_failed_payload`."""
        return stream_failed_payload(self)

    def final_events(self, *, fallback_input_tokens: int | None = None) -> list[dict[str, Any]]:
        """The closing events of the attempt, each a payload plus its ``type``; see
        :func:`billing.taps.events.attempt_final_events`."""
        return attempt_final_events(self, fallback_input_tokens=fallback_input_tokens)


def _echo_of(raw: bytes, key: bytes, text: str) -> tuple[bytes, bytes, int, int] | None:
    """``raw`` (an event's JSON) split around the value ``text`` of its one ``key``: the bytes
    before and after the text in the event's block as one ``data:`` line, when ``raw`` has no
    line end (data of one line) and no backslash, and the key occurs once in it. (Without any
    escape every string of a JSON text is its bytes as they are: the key's quoted name is in
    the bytes once for each key of that name, and never inside another string, whose quotes
    would be escaped.) Else None."""
    if b"\\" in raw or b"\n" in raw or b"\r" in raw or raw.count(key) != 1:
        return None
    at = raw.find(key) + len(key)
    while raw[at : at + 1] in (b" ", b"\t", b":"):  # the colon and whitespace
        at += 1
    if raw[at : at + 1] != b'"':
        return None
    start = at + 1
    value = text.encode()
    end = start + len(value)
    if raw[start:end] != value or raw[end : end + 1] != b'"' or not _plain_text(value):
        return None
    before, after = b"data: " + raw[:start], raw[end:] + b"\n\n"
    return before, after, len(before), len(after)
