"""The echo fast path: a text delta that repeats the previous event's bytes around another text.

A provider repeats a chunk's every other byte across a stream's text deltas. When the last event
a tap read was a plain text delta, :func:`echo_of` keeps the bytes of its ``data:`` block before
and after the text (an :data:`Echo`); a next block that is those bytes around another
:func:`plain_text` changes nothing but the count of its piece, so :meth:`billing.taps.base.Tap.feed`
counts it without reading the JSON.
"""

from __future__ import annotations

import re

__all__ = ["Echo", "echo_of", "plain_text"]

#: The bytes of a block before and after its text, and their lengths.
Echo = tuple[bytes, bytes, int, int]

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


def plain_text(text: bytes) -> bool:
    """Whether ``text`` is a JSON string body that reads as its own bytes (valid UTF-8)."""
    return _PLAIN_TEXT.fullmatch(text) is not None and (text.isascii() or _utf8(text))


def echo_of(raw: bytes, key: bytes, text: str) -> Echo | None:
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
    if raw[start:end] != value or raw[end : end + 1] != b'"' or not plain_text(value):
        return None
    before, after = b"data: " + raw[:start], raw[end:] + b"\n\n"
    return before, after, len(before), len(after)
