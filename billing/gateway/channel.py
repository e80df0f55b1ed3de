"""A bounded hand-off of chunks from one task to another on the same loop (one producer, one
consumer): what the pump and the relay need of ``asyncio.Queue``, at a fraction of its cost per
item (no ``task_done`` accounting, at most one waiter on each side)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["Channel"]

T = TypeVar("T")


class Channel(Generic[T]):
    """Items in order; :meth:`put` waits while ``maxsize`` items are queued, :meth:`get` while
    none is. Not safe across threads or with several producers or consumers."""

    __slots__ = ("_getter", "_items", "_loop", "_maxsize", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._loop = asyncio.get_running_loop()
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return len(self._items) >= self._maxsize

    def put_nowait(self, item: T) -> None:
        """Queue ``item`` (even past ``maxsize``) and wake the consumer."""
        self._items.append(item)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    async def put(self, item: T) -> None:
        while len(self._items) >= self._maxsize:
            self._putter = putter = self._loop.create_future()
            await putter
        self.put_nowait(item)

    def get_nowait(self) -> T:
        """The oldest item (``IndexError`` when there is none); wakes the producer."""
        item = self._items.popleft()
        putter = self._putter
        if putter is not None:
            self._putter = None
            if not putter.done():
                putter.set_result(None)
        return item

    async def get(self) -> T:
        while not self._items:
            self._getter = getter = self._loop.create_future()
            await getter
        return self.get_nowait()
