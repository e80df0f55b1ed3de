"""The :class:`Tap` base class: feeding one attempt's response body and reading its events.

A tap is fed the raw response body of one streaming upstream attempt, decodes it with
:class:`billing.taps.sse.SSEDecoder` (or counts a repeated text delta without decoding it,
:mod:`billing.taps.echo`), and hands each event to its protocol's :meth:`Tap._on_event`, which
keeps the running account (:class:`billing.taps.state.TapState`, in the contract's token
semantics). It never raises on stream content: an event it cannot read is counted in
:attr:`Tap.malformed_events` and skipped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import orjson

from billing.taps.echo import Echo, echo_of, plain_text
from billing.taps.events import attempt_final_events, stream_failed_payload, stream_usage_payload
from billing.taps.fields import MalformedEventError
from billing.taps.sse import SSEDecoder
from billing.taps.state import Reads, TapState

__all__ = ["BODY_KINDS", "Tap", "foreign_body"]

#: What names a protocol's whole response body, documented as always present: (key, value).
#: OpenAI "The chat completion object" (``object``: "always ``chat.completion``") and "The
#: response object" (``object``: "always ``response``"); Anthropic Messages (``type``: "always
#: ``message``"; an error body: ``type: "error"``).
BODY_KINDS: dict[str, tuple[str, str]] = {
    "openai.chat_completions": ("object", "chat.completion"),
    "openai.responses": ("object", "response"),
    "anthropic.messages": ("type", "message"),
}
#: Protocols whose every body names its kind (Anthropic's ``type``: ``message``, ``error``);
#: an OpenAI body may name none (an error body ``{"error": {...}}``, some compatible servers).
_KIND_REQUIRED = {"anthropic.messages": ("message", "error")}


def foreign_body(protocol: str, body: dict[str, Any]) -> str | None:
    """Why ``body`` (a whole response, a JSON object) is not one of ``protocol``'s, or None.

    The rule: a body that names another protocol's kind at its top level (``object:
    "response"``, ``object: "chat.completion"``, ``type: "message"``) is that protocol's,
    whatever fields it shares with this one (Responses and Messages both have
    ``usage.input_tokens`` and ``output_tokens``, with other meanings: Responses' input
    includes its cached part); and an Anthropic body names its kind (``message``, ``error``)
    unless it is an error object (``{"error": {...}}``, as a proxy may answer)."""
    for other, (key, kind) in BODY_KINDS.items():
        if other != protocol and body.get(key) == kind:
            return f"the body is an {other} response ({key}: {kind!r}), not an {protocol} one"
    required = _KIND_REQUIRED.get(protocol)
    key = BODY_KINDS[protocol][0]
    if required is not None and body.get(key) not in required and not body.get("error"):
        return f"the body names no {protocol} kind ({key}: {body.get(key)!r})"
    return None


class Tap(TapState, ABC):
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
        super().__init__()
        self._decoder = SSEDecoder()
        self._closed = False
        self._done = False
        self._malformed = 0
        self._events = 0
        self._event_bad = False
        # The last event read, when it was a plain text delta (``_text_delta``): its data's
        # bytes before and after the text. The next event that is the same bytes around another
        # text changes nothing but the count of its piece (see ``feed``); with their lengths.
        self._echo: Echo | None = None
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
                and plain_text(chunk[start:end])
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

    def read_json(self, body: bytes | bytearray | memoryview) -> None:
        """Read the whole body of a NON-streaming response (the protocol's response object:
        a ``chat.completion``, a Responses ``response``, an Anthropic ``message``, or the
        provider's error object) and close the tap: its usage, units, counters, cost and stop
        reason are read as from a stream's last events, its generated content counted as the
        stream's deltas would be (the estimate when it carries no usage).

        A body of another protocol (:func:`foreign_body`) is unreadable too: none of its
        figures is read (the same field names mean other things in another protocol), so the
        attempt is an estimate without usage and the call is flagged ``usage_missing``.

        Never raises on the body's content (an unreadable body is one malformed event); after
        :meth:`feed` or :meth:`close` it is ignored.
        """
        if self._closed or self._events:
            return
        raw = bytes(body)
        self._closed = True
        self._raw_event = raw
        try:
            payload = orjson.loads(raw)
            self._events = 1
            if not isinstance(payload, dict):
                raise MalformedEventError("the response body is not a JSON object")
            foreign = foreign_body(self.protocol, payload)
            if foreign is not None:
                raise MalformedEventError(foreign)
            self._on_body(payload)
        except Exception:  # never raise on the body's content: count it
            self._events = 1
            self._malformed += 1

    @abstractmethod
    def _on_body(self, data: dict[str, Any]) -> None:
        """Apply a whole non-streaming response body (a JSON object); see :meth:`read_json`.
        Raise :class:`MalformedEventError` (or any exception) when it cannot be read."""

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
        self._raw_event = raw
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
                self._echo = echo_of(raw, self._TEXT_KEY, delta)

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

    # -- readable feeding state ------------------------------------------------------------

    closed = Reads[bool]("_closed", "Whether :meth:`close` was called.")
    done = Reads[bool](
        "_done", "Whether the stream sent ``data: [DONE]`` (later events are ignored)."
    )
    malformed_events = Reads[int](
        "_malformed", "Number of events that could not be read (bad JSON, unexpected shape)."
    )
    events_seen = Reads[int](
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
