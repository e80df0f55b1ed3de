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

__all__ = ["SSEDecoder", "SSEEvent", "iter_sse_events"]

_LINE_END = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff"


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
    never raises on stream content.

    Attributes:
        retry: the last valid ``retry:`` value (reconnection time in milliseconds), or ``None``.
        last_event_id: the last event id set by an ``id:`` field, or ``None``.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # pieces of the current line, which has no line end yet
        self._skip_lf = False  # the previous text ended in CR: an LF next is part of it
        self._at_start = True  # no text decoded yet (for the BOM)
        self._closed = False
        self._event_name = ""
        self._data: list[str] = []
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
        if self._closed:
            return []
        text = self._utf8.decode(bytes(chunk))
        out: list[SSEEvent] = []
        self._process_text(text, out)
        return out

    def close(self) -> list[SSEEvent]:
        """Signal end of input; return the events still pending (leniently, see module doc)."""
        if self._closed:
            return []
        self._closed = True
        out: list[SSEEvent] = []
        self._process_text(self._utf8.decode(b"", final=True), out)
        if self._partial:
            line = "".join(self._partial)
            self._partial = []
            self._process_line(line, out)
        self._dispatch(out)
        return out

    # -- internals -------------------------------------------------------------------------

    def _process_text(self, text: str, out: list[SSEEvent]) -> None:
        if not text:
            return
        if self._at_start:
            self._at_start = False
            if text.startswith(_BOM):
                text = text[1:]
                if not text:
                    return
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        pos = 0
        for match in _LINE_END.finditer(text):
            line = text[pos : match.start()]
            if self._partial:
                self._partial.append(line)
                line = "".join(self._partial)
                self._partial = []
            self._process_line(line, out)
            pos = match.end()
        if pos < len(text):
            self._partial.append(text[pos:])
        elif text.endswith("\r"):
            self._skip_lf = True

    def _process_line(self, line: str, out: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_name = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        # any other field is ignored

    def _dispatch(self, out: list[SSEEvent]) -> None:
        data, name = self._data, self._event_name
        self._data = []
        self._event_name = ""
        if not data:
            return
        out.append(SSEEvent(event=name or None, data="\n".join(data), id=self.last_event_id))


def iter_sse_events(chunks: Iterable[bytes]) -> Iterator[SSEEvent]:
    """Decode an iterable of byte chunks into SSE events, closing the decoder at the end."""
    dec = SSEDecoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.close()
