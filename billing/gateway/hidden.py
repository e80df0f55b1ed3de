"""Hiding what the gateway asked the upstream for on the client's behalf: the Chat Completions
usage chunk (``stream_options.include_usage``), which the meter needs to bill the provider's
usage, but which a client that did not ask for it must not see (its ``choices`` is empty, which
some clients do not expect).

:class:`UsageChunkFilter` is fed the raw bytes relayed to the client (split anywhere) and returns
what to send: every SSE block as it came, but a block whose data is a chunk with a ``usage`` and
an empty ``choices``. It holds back an incomplete block until its end arrives
(:meth:`UsageChunkFilter.finish` gives what is left at the end of the stream). The meter's tap
reads the upstream's bytes before they are filtered, so the call is billed the usage anyway.
"""

from __future__ import annotations

import re

import orjson

__all__ = ["UsageChunkFilter"]

#: The end of an SSE block: a blank line, in any of the three line ends.
_BLOCK_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def _is_usage_chunk(block: bytes) -> bool:
    """Whether ``block`` (one SSE block) is a usage chunk: data that is a JSON object with a
    non-null ``usage`` and an empty ``choices``."""
    if b'"usage"' not in block or b'"choices"' not in block:
        return False
    data = b"".join(
        line[5:].removeprefix(b" ") for line in block.splitlines() if line.startswith(b"data:")
    )
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and chunk.get("usage") is not None and chunk.get("choices") == []


class UsageChunkFilter:
    """Drops the usage chunk from a Chat Completions stream; see the module doc."""

    def __init__(self) -> None:
        self._pending = b""

    def __call__(self, chunk: bytes) -> bytes:
        """What of ``chunk`` (and what was held back before it) the client gets now."""
        data = self._pending + chunk if self._pending else chunk
        start = 0
        kept: list[bytes] = []
        for end in _BLOCK_END.finditer(data):
            block = data[start : end.end()]
            if not _is_usage_chunk(block):
                kept.append(block)
            start = end.end()
        self._pending = data[start:]
        if start == len(data) and len(kept) == 1:
            return kept[0]
        return b"".join(kept)

    def finish(self) -> bytes:
        """What was held back at the end of the stream (a last block without its blank line)."""
        rest, self._pending = self._pending, b""
        return b"" if _is_usage_chunk(rest) else rest
