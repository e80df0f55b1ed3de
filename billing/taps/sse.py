"""Incremental Server-Sent Events decoder.

Implements the parsing rules of the WHATWG HTML Living Standard, section 9.2
"Server-sent events" ("Interpreting an event stream"), for bytes that arrive in arbitrary
pieces, as they come off a socket:

* the stream is UTF-8; a chunk may end inside a multi-byte character (invalid bytes become
  U+FFFD, never an exception);
* one leading U+FEFF byte order mark is dropped;
* lines end in CRLF, LF or CR, and a CR at the end of one chunk followed by an LF at the start
  of the next is one line end;
* a line starting with ``:`` is a comment and is ignored;
* ``field:value`` with one optional space after the colon; a line without a colon is a field
  with an empty value; unknown fields are ignored;
* ``data`` lines are joined with ``\\n``; ``event`` sets the event name; ``id`` sets the last
  event id (ignored if it contains U+0000); ``retry`` sets the reconnection time when it is
  all ASCII digits;
* a blank line dispatches the pending block; a block whose data buffer is empty (only
  ``event:``, ``id:`` or ``retry:`` lines) dispatches nothing.

One deliberate leniency: the WHATWG rules drop a pending block at end of input when it has no
trailing blank line. Real transcripts and gateways often lose that final blank line, and the
block usually carries the usage, so :meth:`SSEDecoder.close` dispatches it (and a final line
that has no line end).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["RawSSEEvent", "SSEDecoder", "SSEEvent", "iter_sse_events"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = codecs.BOM_UTF8

#: A dispatched event as :meth:`SSEDecoder.feed_raw` gives it: the event name (``None`` when
#: the block had none), the ``data:`` lines joined with ``b"\n"`` as UTF-8 bytes, NOT decoded
#: (:attr:`SSEEvent.data` is their decoding, invalid bytes as U+FFFD), and the last event id.
RawSSEEvent = tuple[str | None, bytes, str | None]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched SSE event.

    Attributes:
        event: the value of the block's last ``event:`` field, or ``None`` when the block had
            none (or an empty one); WHATWG would call that type ``"message"``, but protocol
            readers then take the kind from the JSON payload's ``type``.
        data: the ``data:`` lines of the block joined with ``"\\n"`` (no trailing newline).
        id: the last event id in force when the event was dispatched (it persists across
            events, per WHATWG), or ``None`` if no ``id:`` field was seen yet.
    """

    event: str | None
    data: str
    id: str | None = None


class SSEDecoder:
    """Incremental WHATWG SSE decoder: bytes in, :class:`SSEEvent` out.

    Usage::

        dec = SSEDecoder()
        for chunk in socket_chunks:
            for ev in dec.feed(chunk):
                ...
        for ev in dec.close():
            ...

    Any split of the input into chunks yields the same events as feeding it whole. The decoder
    never raises on stream content. :meth:`feed_raw` and :meth:`close_raw` give the same events
    with their data left as bytes (what the taps parse as JSON).

    The stream is split into lines as bytes and a line is decoded only when read: line ends
    are ASCII, never inside a UTF-8 sequence, so this decodes exactly as decoding the whole
    stream first would (the taps' per-chunk cost: no text copy of each chunk).

    Attributes:
        retry: the last valid ``retry:`` value (reconnection time in milliseconds), or ``None``.
        last_event_id: the last event id set by an ``id:`` field, or ``None``.
    """

    def __init__(self) -> None:
        self._partial = b""  # the current line so far, which has no line end yet
        self._skip_lf = False  # the previous chunk ended in CR: an LF next is part of it
        self._at_start = True  # no byte read yet (for the BOM)
        self._closed = False
        self._event_name = b""
        self._data: list[bytes] = []
        self.retry: int | None = None
        self.last_event_id: str | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[SSEEvent]:
        """Decode one piece of the byte stream and return the events it completes.

        Feeding after :meth:`close` is ignored and returns no events.
        """
        return [_decoded(raw) for raw in self.feed_raw(chunk)]

    def close(self) -> list[SSEEvent]:
        """Signal end of input; return the events still pending (leniently, see module doc)."""
        return [_decoded(raw) for raw in self.close_raw()]

    def feed_raw(self, chunk: bytes | bytearray | memoryview) -> list[RawSSEEvent]:
        """:meth:`feed`, with each event's data as bytes (:data:`RawSSEEvent`)."""
        if self._closed:
            return []
        buf = self._partial + chunk if self._partial else bytes(chunk)
        if not buf:
            return []
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):  # a BOM may be split
                self._partial = buf
                return []
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
        if self._skip_lf:
            self._skip_lf = False
            if buf.startswith(b"\n"):
                buf = buf[1:]
        if (
            buf.startswith(b"data: ")
            and buf.endswith(b"\n\n")
            and buf.count(b"\n") == 2
            and b"\r" not in buf
            and not self._data
            and not self._event_name
        ):  # the usual chunk: one whole block of one data line (what the loop below would do)
            self._partial = b""
            return [(None, buf[6:-2], self.last_event_id)]
        if b"\r" in buf:
            lines = _LINE_END.split(buf)
            self._skip_lf = buf.endswith(b"\r")
        else:  # the usual stream: LF only
            lines = buf.split(b"\n")
        self._partial = lines.pop()
        out: list[RawSSEEvent] = []
        self._read_lines(lines, out)
        return out

    def whole_block(self, chunk: bytes | bytearray | memoryview) -> bytes | None:
        """The data of ``chunk`` when it is the usual chunk of a stream (one whole block of one
        ``data:`` line, LF line ends) and nothing is pending in the decoder, else ``None``.

        With data, the chunk is read: it is the event ``(None, data, last_event_id)`` that
        :meth:`feed_raw` would give, and the decoder is left as :meth:`feed_raw` would leave it
        (unchanged). With ``None``, nothing was read: feed the chunk with :meth:`feed_raw`.
        (The taps' per-chunk path: no list or tuple for the one event.)
        """
        if (
            self._partial
            or self._at_start
            or self._skip_lf
            or self._closed
            or self._data
            or self._event_name
            or type(chunk) is not bytes
        ):
            return None
        if (
            chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return chunk[6:-2]
        return None

    def close_raw(self) -> list[RawSSEEvent]:
        """:meth:`close`, with each event's data as bytes (:data:`RawSSEEvent`)."""
        if self._closed:
            return []
        self._closed = True
        out: list[RawSSEEvent] = []
        if self._partial:  # a last line without its line end
            self._read_lines([self._partial, b""], out)
            self._partial = b""
        else:
            self._read_lines([b""], out)
        return out

    # -- internals -------------------------------------------------------------------------

    def _read_lines(self, lines: list[bytes], out: list[RawSSEEvent]) -> None:
        """Apply complete lines (without their line ends); a blank one dispatches the block."""
        for line in lines:
            if line.startswith(b"data: "):  # by far the most frequent line
                self._data.append(line[6:])
            elif not line:
                data = self._data
                if data:
                    name = self._event_name
                    self._data = []
                    out.append(
                        (
                            name.decode("utf-8", "replace") if name else None,
                            b"\n".join(data),
                            self.last_event_id,
                        )
                    )
                self._event_name = b""
            elif not line.startswith(b":"):  # a line starting with a colon is a comment
                self._read_field(line)

    def _read_field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event_name = value
        elif name == b"id":
            if b"\0" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():  # bytes.isdigit: ASCII digits only
            self.retry = int(value)
        # any other field is ignored


def _decoded(raw: RawSSEEvent) -> SSEEvent:
    name, data, event_id = raw
    return SSEEvent(event=name, data=data.decode("utf-8", "replace"), id=event_id)


def iter_sse_events(chunks: Iterable[bytes]) -> Iterator[SSEEvent]:
    """Decode an iterable of byte chunks into SSE events, closing the decoder at the end."""
    dec = SSEDecoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.close()
