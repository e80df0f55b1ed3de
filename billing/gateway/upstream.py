"""The upstream byte streams a relay accepts, read raw (bytes exactly as the provider sent them).

* asyncio: an ``httpx.Response`` opened with ``stream=True`` (read with ``aiter_raw``, closed
  with ``aclose``), or any async iterable of bytes (closed with its ``aclose`` when it has one);
* sync: an ``httpx.Response`` (``iter_raw`` / ``close``), or any iterable of bytes (``close``
  when it has one).

The relay owns the stream it is given: it reads it to its end (or drains it after a disconnect)
and closes it; the gateway must not close it itself (an ``async with http.stream(...)`` around
the relay would cut the drain short).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import httpx

__all__ = [
    "AsyncSource",
    "SyncSource",
    "aclose_quietly",
    "async_chunks",
    "close_quietly",
    "sync_chunks",
]

AsyncSource = httpx.Response | AsyncIterable[bytes]
SyncSource = httpx.Response | Iterable[bytes]


def async_chunks(source: AsyncSource) -> AsyncIterator[bytes]:
    """The raw body chunks of ``source``."""
    if isinstance(source, httpx.Response):
        return source.aiter_raw()
    return aiter(source)


def sync_chunks(source: SyncSource) -> Iterator[bytes]:
    """The raw body chunks of ``source``."""
    if isinstance(source, httpx.Response):
        return source.iter_raw()
    return iter(source)


async def aclose_quietly(source: object, chunks: object) -> None:
    """Close the upstream (the response or iterable, then its iterator); errors are ignored:
    the stream is being given up."""
    for thing in (source, chunks):
        closer: Callable[[], Any] | None = getattr(thing, "aclose", None) or getattr(
            thing, "close", None
        )
        if closer is None:
            continue
        try:
            result = closer()
            if inspect.isawaitable(result):
                await result
        except Exception:  # a broken upstream may fail to close; it is given up anyway
            continue


def close_quietly(source: object, chunks: object) -> None:
    """The sync twin of :func:`aclose_quietly`."""
    for thing in (source, chunks):
        closer = getattr(thing, "close", None)
        if closer is None:
            continue
        with contextlib.suppress(Exception):  # see aclose_quietly
            closer()
