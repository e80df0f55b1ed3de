"""The upstream of a streamed call, read by a pump task of its own, and the drain after the
client left.

The pump reads LiteLLM's chunk stream into a :class:`Handoff` (a small queue) that the
streaming iterator hook hands on to the client: when the client leaves, LiteLLM cancels the
hook's generator, not the pump. :meth:`Pumps.client_left` sends
``stream.client_disconnected``, empties the hand-off, and asks
:class:`billing.gateway.drain.Drain` whether to drain (policy on, a :class:`DrainSlots` slot
free): if so the pump reads on alone, its ``asyncio.timeout`` rescheduled to the policy's time
bound and its token bound checked per chunk; else the pump is cancelled. At the pump's end the
drained call settles on the usage chunk the upstream sent (``upstream``) or the tokens received
(``estimate``, ``drain_skipped`` when cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from billing.gateway.drain import Drain
from billing.gateway.policy import DrainPolicy
from billing.gateway.slots import DrainSlots
from billing.integrations.litellm.calls import Call
from billing.integrations.litellm.reading import chunk_tokens
from billing.integrations.litellm.sender import Sender

__all__ = ["Handoff", "Pumps"]

#: Chunks read ahead of the client, at most (the upstream waits for a slow client).
_READ_AHEAD = 64
_END = object()


class Handoff:
    """The chunks the pump read, in order, for the client: an async iterator that ends at the
    upstream's end and raises the upstream's error where the stream failed."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(_READ_AHEAD)

    def __aiter__(self) -> Handoff:
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def put(self, item: Any) -> None:
        """Hand on a chunk, or the upstream's error; waits while the hand-off is full."""
        await self._queue.put(item)

    async def end(self) -> None:
        """Mark the upstream's end."""
        await self._queue.put(_END)

    def drop(self) -> None:
        """Forget the chunks read ahead (never handed over: the client left)."""
        while not self._queue.empty():
            self._queue.get_nowait()


class Pumps:
    """The pump tasks of the streamed calls, and their drains after a disconnect, bounded by
    ``policy`` (at most ``policy.max_concurrent`` at once, :attr:`slots`)."""

    def __init__(self, sender: Sender, policy: DrainPolicy) -> None:
        self._sender = sender
        self.policy = policy
        self.slots = DrainSlots(policy.max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, call: Call, response: Any) -> Handoff:
        """Start reading ``response`` (LiteLLM's chunks) for ``call`` in a task of its own;
        the chunks come out of the returned hand-off."""
        handoff = Handoff()
        call.pump = asyncio.get_running_loop().create_task(self._pump(call, response, handoff))
        self._tasks.add(call.pump)
        call.pump.add_done_callback(self._tasks.discard)
        return handoff

    async def _pump(self, call: Call, response: Any, handoff: Handoff) -> None:
        """Read the upstream to its end: into ``handoff`` while the client is there, on alone
        (the drain) after it left, within the drain's bounds."""
        skipped = False
        try:
            async with asyncio.timeout(None) as call.limit:
                async for chunk in response:
                    call.received += chunk_tokens(chunk)
                    usage = getattr(chunk, "usage", None)
                    if usage is not None:
                        call.upstream_usage = usage
                    if not call.disconnected:
                        await handoff.put(chunk)
                    elif call.drain is not None and call.drain.exceeded(
                        call.received, time.monotonic()
                    ):
                        skipped = True
                        break
        except TimeoutError:  # the drain's time bound
            skipped = True
        except asyncio.CancelledError:  # no drain for this disconnect
            skipped = True
            raise
        except Exception as error:
            if not call.disconnected:
                await handoff.put(error)  # the client's stream fails as LiteLLM's would
        finally:
            if not call.disconnected:
                await handoff.end()  # a disconnect meanwhile empties the hand-off
            if call.disconnected:
                self._settle_drained(call, skipped)
            if skipped:
                with contextlib.suppress(Exception):
                    await response.aclose()

    def client_left(self, call: Call, handoff: Handoff) -> None:
        """The client went away: report it, then drain the upstream or cancel it."""
        call.disconnected = True
        handoff.drop()
        self._sender.send(
            call,
            "stream.client_disconnected",
            {"output_tokens_delivered": call.delivered, "output_tokens_generated": call.received},
        )
        pump = call.pump
        if pump is None or pump.done():  # the upstream had ended: settle on what it sent
            if not call.usage_sent:
                self._settle_drained(call, skipped=False)
            return
        drain = Drain(self.slots)
        if drain.begin(self.policy, call.received, time.monotonic()):
            call.drain = drain
            if call.limit is not None:
                call.limit.reschedule(asyncio.get_running_loop().time() + self.policy.max_seconds)
        else:
            pump.cancel()

    def _settle_drained(self, call: Call, skipped: bool) -> None:
        """After a disconnect: the provider's usage if the drain reached it, else the tokens
        received by then, flagged ``drain_skipped``."""
        if call.drain is not None:
            call.drain.end()
        if call.upstream_usage is not None:
            self._sender.usage(call, call.upstream_usage, "upstream")
        else:
            self._sender.estimate(call, skipped)
