"""The metered stream: relay an upstream's bytes to the client and account for them.

:class:`Meters` holds what every call of a gateway shares (the billing client, the drain policy,
the count of running drains); :meth:`Meters.call` gives the :class:`Meter` of one call, whose
:meth:`Meter.response` (an ASGI response, asyncio), :meth:`Meter.relay` (an async generator,
asyncio) or :meth:`Meter.relay_sync` wraps the upstream byte stream.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Message, Receive

from billing.gateway.account import CallAccount
from billing.gateway.authorize import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    Admission,
    Authorizer,
    Opener,
    Reserver,
    opener_of,
    preparing,
    refusal,
)
from billing.gateway.drain import Drain, drain_in_thread
from billing.gateway.policy import DrainPolicy
from billing.gateway.pump import END, STALLED, Pump, Send
from billing.gateway.response import MeteredResponse, disconnected
from billing.gateway.slots import DrainSlots
from billing.gateway.upstream import AsyncSource, SyncSource, close_quietly, sync_chunks

__all__ = ["Meter", "Meters"]

#: The client left: a closed generator, a cancelled task, or a broken pipe.
_CLIENT_GONE = (GeneratorExit, asyncio.CancelledError, OSError)


class EventSink(Protocol):
    """What the meter needs of a billing client: ``send`` (both clients of
    :mod:`billing.client` have it; it queues and never blocks on the network)."""

    def send(self, event: Mapping[str, Any]) -> str: ...


class Meters:
    """The metered streams of one gateway process.

    Args:
        client: a :class:`billing.client.AsyncBillingClient` (for :meth:`Meter.relay`) or
            :class:`billing.client.BillingClient` (for :meth:`Meter.relay_sync`).
        drain: what to do when a client leaves (default: drain, within
            :class:`DrainPolicy`'s bounds); recorded on every call in
            ``stream.started.metadata`` (:meth:`DrainPolicy.metadata`).
        progress_every: output tokens between two ``stream.tokens`` progress events (>= 1).
        stall_timeout_s: seconds without an upstream byte after which an attempt is
            ``stalled`` (``stream.failed``); ``None``: no stall detection of the meter's own
            (an ``httpx`` read timeout counts as a stall too).
        max_attempts: attempts per call, retries of a stalled upstream included (>= 1).
        authorize: reserve each call's estimate before its upstream is opened (with an
            ``AsyncBillingClient``; :meth:`Meter.authorize`, :meth:`Meter.response`).
        fail_open: when the service cannot decide (503, no answer, a refused request such
            as a 409): call the upstream (``True``) or answer 503; logged at WARNING.
        hold_usd, max_output_tokens, hold_ttl_s: a fixed estimate per call, else the output
            limit of ``call(body=...)`` (``max_output_tokens`` without one); the hold's TTL.

    Raises:
        ValueError: an argument out of range.
        TypeError: ``authorize`` with a client that cannot authorize asynchronously.
    """

    def __init__(
        self,
        client: EventSink,
        *,
        drain: DrainPolicy | None = None,
        progress_every: int = 64,
        stall_timeout_s: float | None = None,
        max_attempts: int = 2,
        authorize: bool = False,
        fail_open: bool = True,
        hold_usd: Decimal | None = None,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        hold_ttl_s: int | None = None,
    ) -> None:
        if progress_every < 1 or max_attempts < 1:
            raise ValueError("progress_every and max_attempts must be >= 1")
        if stall_timeout_s is not None and stall_timeout_s <= 0:
            raise ValueError("stall_timeout_s must be positive")
        self.client = client
        self.policy = drain or DrainPolicy()
        self.progress_every = progress_every
        self.stall_timeout_s = stall_timeout_s
        self.max_attempts = max_attempts
        self.slots = DrainSlots(self.policy.max_concurrent)
        self.authorizer: Authorizer | None = None
        if authorize:
            if not inspect.iscoroutinefunction(getattr(client, "authorize", None)):
                raise TypeError("authorize=True needs an AsyncBillingClient")
            reserver: Reserver = client  # type: ignore[assignment]
            self.authorizer = Authorizer(
                reserver, fail_open, hold_usd, max_output_tokens, hold_ttl_s
            )

    def call(
        self,
        *,
        request_id: str,
        api_key_id: str,
        model: str,
        protocol: str,
        input_tokens: int | None = None,
        metadata: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Meter:
        """The meter of one call (CONTRACT "Events": ``stream.started``'s fields).

        ``input_tokens`` is the gateway's own count of the input (used when the upstream
        reports none, and in the authorization's estimate); ``metadata`` is added to the drain
        policy's entries; ``body`` is the request sent upstream, whose output limit
        (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``) bounds the hold.

        Raises:
            ValueError: ``protocol`` is not one of :data:`billing.taps.PROTOCOLS`.
        """
        return Meter(
            self,
            CallAccount(
                self.client.send,
                request_id=request_id,
                api_key_id=api_key_id,
                model=model,
                protocol=protocol,
                input_tokens=input_tokens,
                metadata={**self.policy.metadata(), **(metadata or {})},
                progress_every=self.progress_every,
            ),
            body,
        )

    @property
    def drains_running(self) -> int:
        """Drains running now (asyncio and threads)."""
        return self.slots.running

    async def wait_drains(self, timeout: float | None = None) -> bool:
        """Wait (``timeout`` seconds at most) until no drain runs, e.g. before closing the
        billing client at shutdown; ``True`` when none runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.slots.running:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True


class Meter:
    """The metered stream of one call; see :meth:`response`, :meth:`relay` and
    :meth:`relay_sync`."""

    def __init__(
        self, meters: Meters, account: CallAccount, body: Mapping[str, Any] | None = None
    ) -> None:
        self._meters = meters
        self.account = account
        self._body = body
        self.admission: Admission | None = None  # the authorization's outcome, once asked

    @property
    def request_id(self) -> str:
        return self.account.request_id

    async def authorize(self) -> Response | None:
        """Reserve the call's estimate (once; with ``Meters(authorize=True)``, else nothing):
        ``None`` when the upstream may be called, else the refusal to answer the client with,
        in the protocol's error shape (402 final, 429 with ``Retry-After`` retryable, 503 when
        the service cannot decide and ``fail_open`` is off). :meth:`response` given an opener
        calls it; a gateway that opens the upstream itself calls it first."""
        authorizer, account = self._meters.authorizer, self.account
        if authorizer is None:
            return None
        if self.admission is None:
            self.admission = await authorizer.admit(account, self._body)
        return None if self.admission.allowed else refusal(account.protocol, self.admission)

    async def release(self) -> None:
        """Give the call's hold back (the upstream failed before a byte); once."""
        authorizer, admitted = self._meters.authorizer, self.admission
        if authorizer is not None and admitted is not None and admitted.held:
            self.admission = Admission(True)
            await authorizer.release(self.account.request_id)

    def _pump(self, source: AsyncSource, send: Send | None = None) -> Pump:
        meters = self._meters
        return Pump(
            self.account,
            source,
            stall_timeout_s=meters.stall_timeout_s,
            slots=meters.slots,
            policy=meters.policy,
            send=send,
        )

    async def _next_attempt(
        self,
        outcome: str,
        retry: Callable[[], Awaitable[AsyncSource]] | None,
        send: Send | None,
    ) -> Pump | None:
        """After an attempt that did not end normally: the next attempt's pump when the
        upstream stalled before the client had a byte and ``retry`` may run again, else
        ``None`` (the attempt is settled; the client's stream ends)."""
        account = self.account
        if (
            outcome != STALLED
            or retry is None
            or account.bytes_relayed
            or account.attempt >= self._meters.max_attempts
        ):
            return None
        account.start_attempt()
        try:
            source = await retry()
        except Exception as error:  # the upstream cannot be opened again
            account.settle(error_type="upstream_disconnect", message=repr(error))
            return None
        return self._pump(source, send)

    def response(
        self,
        upstream: AsyncSource | Opener,
        *,
        retry: Callable[[], Awaitable[AsyncSource]] | None = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream",
    ) -> MeteredResponse:
        """The metered stream as the endpoint's response (asyncio; FastAPI / Starlette)::

            return meter.response(upstream)

        The same stream, events and retries as :meth:`relay` (see there), written to the
        client by the task that reads the upstream (the cheaper hand-off: one task step a
        chunk). A chunk counts as delivered once the server's ``send`` returned. The client
        left when the server says ``http.disconnect``, a write fails, or the response task is
        cancelled; the upstream is then drained as with :meth:`relay`.

        ``upstream`` may be an opener instead (``lambda: http.send(request, stream=True)``),
        which the response calls once :meth:`authorize` allowed the call: a refusal is the
        answer then, without a request upstream; an upstream that fails before a byte (it
        raises, or answers other than 200) releases the hold and its error is the answer (as
        the provider sent it; a 502 in the protocol's shape when there was no answer).

        Raises:
            TypeError: ``Meters(authorize=True)`` and an upstream already open, not authorized.
        """
        opened: list[AsyncSource] = []
        opener, prepare = opener_of(upstream), None
        if opener is not None:
            prepare = preparing(self.authorize, opener, self.account.protocol, self.release, opened)
        elif self._meters.authorizer is not None and self.admission is None:
            raise TypeError("with authorize=True, give the upstream's opener")
        else:
            opened.append(upstream)  # type: ignore[arg-type]

        async def serve(send: Send, receive: Receive, head: Message) -> None:
            await self._serve(opened[0], retry, send, receive, head)

        return MeteredResponse(
            serve, status_code=status_code, headers=headers, media_type=media_type, prepare=prepare
        )

    async def _serve(
        self,
        upstream: AsyncSource,
        retry: Callable[[], Awaitable[AsyncSource]] | None,
        send: Send,
        receive: Receive,
        head: Message,
    ) -> None:
        """:meth:`response` once served: the head, then the attempts, until the upstream's
        end, a failure or the client's disconnect."""
        account = self.account
        account.start_attempt()
        try:
            await send(head)
        except BaseException:  # no client to write to (gone, or the task cancelled): drain
            self._pump(upstream, send).leave()
            raise
        pump = self._pump(upstream, send)  # (after the head: the pump writes the body)
        left = asyncio.ensure_future(disconnected(receive))
        try:
            while True:
                if pump.outcome is None and not pump.detached:
                    await asyncio.wait((pump.arrival(), left), return_when=asyncio.FIRST_COMPLETED)
                outcome = pump.outcome
                if pump.detached or outcome is None:  # a failed write, or http.disconnect
                    pump.leave()
                    return
                if outcome == END:
                    account.settle()
                else:
                    next_pump = await self._next_attempt(outcome, retry, send)
                    if next_pump is not None:
                        pump = next_pump
                        continue
                # the end of the client's stream, as a StreamingResponse ends when its relay
                # returns (after a failure too: the attempt is settled and reported)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        except _CLIENT_GONE:
            if not account.settled:  # (the last write may fail after a complete stream)
                pump.leave()
            raise
        finally:
            left.cancel()

    async def relay(
        self,
        upstream: AsyncSource,
        *,
        retry: Callable[[], Awaitable[AsyncSource]] | None = None,
    ) -> AsyncIterator[bytes]:
        """Relay ``upstream``'s raw bytes to the client, metering them (asyncio)::

            return StreamingResponse(meter.relay(upstream), media_type="text/event-stream")

        or ``async for chunk in meter.relay(upstream): yield chunk`` in a generator of the
        gateway's own. ``upstream`` is an ``httpx.Response`` opened with ``stream=True`` (or an
        async iterable of bytes); the meter reads it in a task of its own and closes it.

        Events (CONTRACT "Events"), through the billing client: ``stream.started`` per attempt
        (with the drain policy in ``metadata``); ``stream.tokens`` every ``progress_every``
        generated tokens and once at the end; ``stream.client_disconnected`` when the client
        leaves (the generator is closed or cancelled, or a write fails); then, after the
        drain, ``stream.usage`` (the provider's usage when the stream carried it, else the
        tap's estimate, with ``anomalies: ["drain_skipped"]`` when the upstream was cancelled
        first) and ``stream.failed`` when the attempt failed.

        A chunk counts as delivered once the client's side asks for the next one (the server
        wrote it). With ``retry`` (a coroutine function opening the upstream again), a stalled
        upstream (see :class:`Meters`) that has not yet sent the client a byte is retried as
        a new attempt, up to ``max_attempts``; a later stall ends the client's stream.
        """
        account = self.account
        account.start_attempt()
        pump = self._pump(upstream)
        try:
            while True:
                ready = pump.ready
                if ready:
                    chunk, generated = ready.popleft()
                    if pump.room is not None:  # (the call only when the pump waits: a call a chunk)
                        pump.taken()
                    yield chunk
                    account.delivered = generated
                    account.bytes_relayed += len(chunk)
                    continue
                outcome = pump.outcome
                if outcome is None:
                    await pump.arrival()
                    continue
                if outcome == END:
                    account.settle()
                    return
                next_pump = await self._next_attempt(outcome, retry, None)
                if next_pump is None:
                    return  # stalled or broken: the attempt is settled; the client's stream ends
                pump = next_pump
        except _CLIENT_GONE:
            pump.leave()
            raise

    def relay_sync(
        self,
        upstream: SyncSource,
        *,
        retry: Callable[[], SyncSource] | None = None,
    ) -> Iterator[bytes]:
        """The synchronous twin of :meth:`relay` (a WSGI body, a thread per stream): the same
        events; the upstream is read in line, and after a disconnect (the server closes the
        generator, or a write fails) drained in a daemon thread. Stall detection is the
        upstream client's read timeout (``httpx.ReadTimeout``)."""
        meters, account = self._meters, self.account
        account.start_attempt()
        source = upstream
        chunks = sync_chunks(source)
        tap = account.tap
        try:
            while True:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    close_quietly(source, chunks)
                    account.settle()
                    return
                except Exception as error:
                    close_quietly(source, chunks)
                    stalled = _is_timeout(error)
                    account.settle(
                        error_type="stalled" if stalled else "upstream_disconnect",
                        message=str(error) or repr(error),
                    )
                    if (
                        stalled
                        and retry is not None
                        and account.bytes_relayed == 0
                        and account.attempt < meters.max_attempts
                    ):
                        account.start_attempt()
                        try:
                            source = retry()
                        except Exception as again:  # the upstream cannot be opened again
                            account.settle(error_type="upstream_disconnect", message=repr(again))
                            return
                        chunks = sync_chunks(source)
                        tap = account.tap
                        continue
                    return
                tap.feed(chunk)
                generated = tap.output_tokens
                if generated >= account.next_progress:
                    account.progress(generated)
                yield chunk
                account.delivered = generated
                account.bytes_relayed += len(chunk)
        except _CLIENT_GONE:
            account.client_left()
            if account.settled:
                raise
            drain = Drain(meters.slots)
            if drain.begin(meters.policy, tap.output_tokens, time.monotonic()):
                drain_in_thread(account, drain, source, chunks)
            else:
                close_quietly(source, chunks)
                account.settle(skipped=True)
            raise


def _is_timeout(error: Exception) -> bool:
    import httpx

    return isinstance(error, TimeoutError | httpx.TimeoutException)
