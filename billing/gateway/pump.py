"""The reader of one asyncio upstream attempt, in its own task (the pump).

The upstream is read by a task of its own, not by the client's generator or response task, so
that a client disconnect (Starlette cancels the response task; a server closes the generator)
never interrupts a read: after the disconnect the same task goes on reading, as the drain, with
the bytes no longer handed to the client. The pump hands chunks over in one of two ways:

* to the relay's generator (:meth:`Meter.relay`), through a bounded queue (:attr:`Pump.ready`:
  ``(chunk, generated)``, the bytes and the attempt's output tokens once the chunk was read), so
  a slow client still slows the upstream down;
* straight to the client, with the ASGI ``send`` of a metered response
  (:class:`~billing.gateway.response.MeteredResponse`, :meth:`Meter.response`): the pump's task
  writes each chunk itself (one task step a chunk, as a plain relay), and counts it delivered
  once ``send`` returned; a ``send`` that fails (``OSError``, what ASGI 2.4 servers raise for a
  gone client) is a disconnect.

Once the upstream ended, :attr:`Pump.outcome` is one of :data:`END` (the upstream ended),
:data:`STALLED` (no byte for the stall timeout; the attempt is settled as ``stalled``) and
:data:`BROKEN` (the upstream failed; the attempt is settled as ``upstream_disconnect``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import httpx

from billing.gateway.account import CallAccount
from billing.gateway.drain import Drain
from billing.gateway.hidden import UsageChunkFilter
from billing.gateway.policy import DrainPolicy
from billing.gateway.slots import DrainSlots
from billing.gateway.upstream import AsyncSource, aclose_quietly, async_chunks

__all__ = ["BROKEN", "END", "STALLED", "Pump"]

END: Final = "end"
STALLED: Final = "stalled"
BROKEN: Final = "broken"

#: Chunks read ahead of the client at most.
READ_AHEAD = 64

#: An ASGI ``send``.
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Pump:
    """Reads ``source`` into the account's tap and hands its chunks to the client (into
    :attr:`ready`, or with ``send``); drains within ``policy`` after :meth:`leave` (with
    ``send``, a failed write is a :meth:`leave` too)."""

    def __init__(
        self,
        account: CallAccount,
        source: AsyncSource,
        *,
        stall_timeout_s: float | None,
        slots: DrainSlots,
        policy: DrainPolicy,
        send: Send | None = None,
        hide: UsageChunkFilter | None = None,
    ) -> None:
        self.account = account
        self._send = send
        self.hide = hide  # what of the bytes the client does not get (with ``send``)
        self._policy = policy
        self.ready: deque[tuple[bytes, int]] = deque()
        self.outcome: str | None = None  # END, STALLED or BROKEN, once the upstream ended
        self.detached = False
        self.ended = False  # the upstream reached its end (or failed)
        self._source = source
        self._stall = stall_timeout_s
        self._drain = Drain(slots)
        self._skip = False
        self._loop = asyncio.get_running_loop()
        self._arrival: asyncio.Future[None] | None = None  # the relay waits for a pair
        #: set while the pump waits for the relay to take a pair (the read-ahead is full)
        self.room: asyncio.Future[None] | None = None
        self._timeout: asyncio.Timeout | None = None
        self._started = False
        self._abandoned = False
        self.task = self._loop.create_task(self._run(), name=f"billing-pump-{account.request_id}")

    def arrival(self) -> asyncio.Future[None]:
        """A future done when a pair is :attr:`ready` or the :attr:`outcome` is known (with
        ``send``: when the outcome is known or a write failed)."""
        self._arrival = arrival = self._loop.create_future()
        return arrival

    def taken(self) -> None:
        """The relay took a pair: a pump waiting for room goes on."""
        room = self.room
        if room is not None:
            self.room = None
            if not room.done():
                room.set_result(None)

    def _arrived(self) -> None:
        arrival = self._arrival
        if arrival is not None:
            self._arrival = None
            if not arrival.done():  # the relay may have been cancelled meanwhile
                arrival.set_result(None)

    def leave(self, *, shutdown: bool = False) -> None:
        """The client left (whoever saw it: the relay, the response's task, a failed write):
        ``stream.client_disconnected`` once, then drain within the policy or cancel the
        upstream now; a relay or response waiting on :meth:`arrival` wakes. When the upstream
        already ended, the attempt is settled at once. Calling it again does nothing (the
        response's task and a failed write may both see the disconnect).

        ``shutdown``: the gateway's own shutdown cut the client's stream, not the client: no
        ``stream.client_disconnected``; the attempt settles (after the same drain) with
        ``stream.failed`` ``gateway_shutdown`` (:attr:`CallAccount.shut_down`)."""
        if self.detached:
            return
        self.detached = True
        account = self.account
        if shutdown:
            account.shut_down = True
        else:
            account.client_left()
        self.ready.clear()  # the chunks were counted; a pump waiting for room goes on
        self.taken()
        self._arrived()
        if self.ended:
            account.settle()
            return
        if self._drain.begin(self._policy, account.tap.output_tokens, self._loop.time()):
            self._reschedule()
            return
        self._skip = True
        self.task.cancel()
        if not self._started:  # a task cancelled before its first step never runs its body
            self.ended = True
            account.settle(skipped=True)
            self._loop.create_task(aclose_quietly(self._source, None))

    def abandon(self) -> None:
        """The gateway shuts down (:meth:`billing.gateway.meters.Meters.shutdown`): the upstream
        is given up now, the attempt settled on the tap's count, flagged ``drain_skipped``
        (and ``stream.failed`` ``gateway_shutdown`` while a client still read it, or when the
        shutdown cut the client's stream)."""
        if self.ended:
            return
        self._abandoned = True
        self.task.cancel()
        if not self._started:  # a task cancelled before its first step never runs its body
            self.ended = True
            self._settle_abandoned()
            self._loop.create_task(aclose_quietly(self._source, None))

    def _settle_abandoned(self) -> None:
        if self.detached:
            self.account.settle(skipped=True)
        else:
            self.account.shut_down = True
            self.account.settle(skipped=True)

    def _reschedule(self) -> None:
        if self._timeout is None:
            return
        at = None if self._stall is None else self._loop.time() + self._stall
        if self._drain.running:
            at = self._drain.deadline if at is None else min(at, self._drain.deadline)
        self._timeout.reschedule(at)

    async def _run(self) -> None:
        self._started = True
        account = self.account
        tap = account.tap
        chunks = async_chunks(self._source)
        ready = self.ready
        drain = self._drain
        stall = self._stall
        loop = self._loop
        send = self._send
        outcome: str | None = None
        try:
            async with asyncio.timeout(stall) as self._timeout:  # stall: before the first byte too
                if drain.running:  # detached before the task started
                    self._reschedule()
                async for chunk in chunks:
                    tap.feed(chunk)
                    generated = tap.output_tokens
                    if generated >= account.next_progress:
                        account.progress(generated)
                    if self.detached:
                        now = loop.time()
                        if drain.exceeded(generated, now):
                            self._skip = True
                            break
                        if stall is not None:  # a drain that reads goes on to its own bound
                            self._timeout.reschedule(min(now + stall, drain.deadline))
                        continue
                    if send is not None:
                        if stall is not None:  # a slow client is no stalled upstream
                            self._timeout.reschedule(None)
                        out = chunk if self.hide is None else self.hide(chunk)
                        try:
                            if out:
                                await send(
                                    {"type": "http.response.body", "body": out, "more_body": True}
                                )
                        except OSError:
                            self.leave()
                            continue
                        if self.detached:  # the client left during the write: not delivered
                            continue
                        account.delivered = generated
                        account.bytes_relayed += len(chunk)
                        if stall is not None:
                            self._timeout.reschedule(loop.time() + stall)
                        continue
                    if stall is not None:
                        self._timeout.reschedule(loop.time() + stall)
                    ready.append((chunk, generated))
                    arrival = self._arrival
                    if arrival is not None:  # (_arrived, in line: it runs for every chunk)
                        self._arrival = None
                        if not arrival.done():
                            arrival.set_result(None)
                    if len(ready) >= READ_AHEAD:
                        self.room = room = loop.create_future()
                        if stall is not None:  # a slow client is no stalled upstream
                            self._timeout.reschedule(None)
                        await room
                        if stall is not None and not self.detached:
                            self._timeout.reschedule(loop.time() + stall)
            outcome = END
        except (TimeoutError, httpx.TimeoutException):
            outcome = END if self.detached else STALLED
            self._skip = self.detached
        except asyncio.CancelledError:
            # a skip (leave), else the gateway shutting down: the upstream is given up
            self._skip = True
            outcome = END if self.detached else BROKEN
            if self._abandoned:
                self._settle_abandoned()
            elif not self.detached:
                account.settle(error_type="upstream_disconnect", message="the relay was cancelled")
        except Exception as error:  # the upstream broke (network, protocol)
            outcome = BROKEN
            self._skip = True
            if not self.detached:
                account.settle(error_type="upstream_disconnect", message=str(error) or repr(error))
        finally:
            self.ended = True
            try:
                if outcome == STALLED:
                    account.settle(error_type="stalled", message="no upstream bytes in time")
                if self.detached:
                    account.settle(skipped=self._skip)
            finally:  # the slot and the upstream are given back whatever settling did
                if self.detached:
                    drain.end()
                if not self.detached and outcome is not None:
                    self.outcome = outcome
                    self._arrived()
                await aclose_quietly(self._source, chunks)
