"""The metered stream of one call: relay an upstream's bytes to the client and account for them.

:meth:`billing.gateway.meters.Meters.call` gives the :class:`Meter` of one call, whose
:meth:`Meter.response` (an ASGI response, asyncio), :meth:`Meter.relay` (an async generator,
asyncio) or :meth:`Meter.relay_sync` wraps the upstream byte stream, and whose
:meth:`Meter.json` / :meth:`Meter.settle_json` meter a non-streaming response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response
from starlette.types import Message, Receive

from billing.gateway.account import CallAccount
from billing.gateway.authorize import (
    Admission,
    Opener,
    open_upstream,
    opener_of,
    refusal,
)
from billing.gateway.drain import Drain, drain_in_thread
from billing.gateway.headers import CALL_ID_HEADER, relayed_headers
from billing.gateway.hidden import UsageChunkFilter
from billing.gateway.pump import END, STALLED, Pump, Send
from billing.gateway.response import MeteredResponse, disconnected
from billing.gateway.upstream import AsyncSource, SyncSource, close_quietly, sync_chunks

if TYPE_CHECKING:
    from billing.gateway.meters import Meters

__all__ = ["Meter"]

#: The client left: a closed generator, a cancelled task, or a broken pipe.
_CLIENT_GONE = (GeneratorExit, asyncio.CancelledError, OSError)


class Meter:
    """The metered stream of one call; see :meth:`response`, :meth:`relay` and
    :meth:`relay_sync`."""

    def __init__(
        self,
        meters: Meters,
        account: CallAccount,
        body: Mapping[str, Any] | None = None,
        *,
        invalid: str | None = None,
    ) -> None:
        self._meters = meters
        #: why the call's ``api_key_id`` or ``model`` would be refused by the service, if so
        self.invalid = invalid
        self.account = account
        self._body = body
        self.admission: Admission | None = None  # the authorization's outcome, once asked

    @property
    def request_id(self) -> str:
        return self.account.request_id

    async def authorize(self) -> Response | None:
        """Reserve the call's estimate (once; with ``Meters(authorize=True)``, else nothing):
        ``None`` when the upstream may be called, else the refusal to answer the client with,
        in the protocol's error shape (400 ``invalid_request_error`` when the call's
        ``api_key_id`` or ``model`` is one the service would refuse, :attr:`invalid`, checked
        with ``authorize=False`` too and before anything is sent; 402 final, 429 with
        ``Retry-After`` retryable, 503 when the service is unavailable and ``fail_open`` is off,
        400 when the service refused the request's fields (422), 500 when it refused the
        request otherwise, see :func:`~billing.gateway.authorize.admission`). :meth:`response`
        given an opener calls it; a gateway that opens the upstream itself calls it first."""
        authorizer, account = self._meters.authorizer, self.account
        if self.invalid is not None:
            bad = Admission(False, status=400, reason="invalid_request", message=self.invalid)
            return refusal(account.protocol, bad)
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

    def _pump(
        self, source: AsyncSource, send: Send | None = None, hide: UsageChunkFilter | None = None
    ) -> Pump:
        meters = self._meters
        pump = Pump(
            self.account,
            source,
            stall_timeout_s=meters.stall_timeout_s,
            slots=meters.slots,
            policy=meters.policy,
            send=send,
            hide=hide,
        )
        meters.pumps.add(pump)
        pump.task.add_done_callback(lambda _: meters.pumps.discard(pump))
        return pump

    def _headers(self, upstream: object, headers: Mapping[str, str] | None) -> dict[str, str]:
        """The client's response headers: ``headers`` when given, else what passes on of the
        upstream's (:func:`billing.gateway.headers.relayed_headers`), and the call's id."""
        if headers is not None:
            return {**headers, CALL_ID_HEADER: self.request_id}
        upstream_headers = upstream.headers if isinstance(upstream, httpx.Response) else None
        return relayed_headers(upstream_headers, self.request_id)

    def settle_json(self, body: bytes) -> None:
        """Meter a NON-streaming response whose whole body is ``body`` (sans-IO: any gateway,
        sync or asyncio): ``stream.started``, the counts (delivered = the output) and the
        closing events the protocol's tap reads in the body (:meth:`billing.taps.Tap.read_json`;
        an error body gives ``stream.failed``)."""
        self.account.whole(body)

    def failed(self, error: BaseException) -> None:
        """The upstream could not be opened, or failed before its response was read (a
        connection error, a timeout): the attempt's events all the same (``stream.started``,
        a usage of nothing generated, ``stream.failed`` ``upstream_disconnect``), so that no
        call made upstream goes without its record."""
        account = self.account
        account.start_attempt()
        account.settle(error_type="upstream_disconnect", message=str(error) or repr(error))

    def json(
        self,
        upstream: httpx.Response | bytes,
        *,
        status_code: int | None = None,
        headers: Mapping[str, str] | None = None,
        media_type: str = "application/json",
    ) -> Response:
        """Meter a non-streaming response (:meth:`settle_json`) and return it to the client
        as it came: ``upstream`` is an ``httpx.Response`` whose body was read (its status and
        the headers that pass on, :mod:`billing.gateway.headers`) or the body's bytes (status
        200); the call's id goes as ``X-Request-Id``."""
        body = upstream if isinstance(upstream, bytes) else upstream.content
        self.settle_json(body)
        if status_code is None:
            status_code = upstream.status_code if isinstance(upstream, httpx.Response) else 200
        return Response(
            body, status_code, headers=self._headers(upstream, headers), media_type=media_type
        )

    async def _next_attempt(
        self,
        outcome: str,
        retry: Callable[[], Awaitable[AsyncSource]] | None,
        send: Send | None,
        hide: UsageChunkFilter | None = None,
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
        return self._pump(source, send, hide)

    def response(
        self,
        upstream: AsyncSource | Opener,
        *,
        retry: Callable[[], Awaitable[AsyncSource]] | None = None,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str = "text/event-stream",
        hide_usage: bool = False,
    ) -> MeteredResponse:
        """The metered stream as the endpoint's response (asyncio; FastAPI / Starlette)::

            return meter.response(upstream)

        The same stream, events and retries as :meth:`relay` (see there), written to the
        client by the task that reads the upstream (the cheaper hand-off: one task step a
        chunk). A chunk counts as delivered once the server's ``send`` returned. The client
        left when the server says ``http.disconnect``, a write fails, or the response task is
        cancelled; the upstream is then drained as with :meth:`relay`.

        The response carries the call's id as ``X-Request-Id`` and, unless ``headers`` are
        given, the upstream's headers that pass on (rate limits, its request id:
        :mod:`billing.gateway.headers`). ``hide_usage``: the gateway asked the upstream for the
        usage chunk (``stream_options.include_usage``) that the client did not ask for; it is
        metered but not sent (:mod:`billing.gateway.hidden`).

        ``upstream`` may be an opener instead (``lambda: http.send(request, stream=streamed)``),
        which the response calls once :meth:`authorize` allowed the call: a refusal is the
        answer then, without a request upstream. A whole (not streamed) response is answered
        by :meth:`json`; an upstream that fails before a byte releases the hold and is metered
        all the same: its error is the answer as the provider sent it (:meth:`json`), or a 502
        in the protocol's shape when there was no answer (:meth:`failed`).

        Raises:
            TypeError: ``Meters(authorize=True)`` and an upstream already open, not authorized.
        """
        hide = UsageChunkFilter() if hide_usage else None
        opened: list[AsyncSource] = []
        opener = opener_of(upstream)
        if opener is None:
            if self._meters.authorizer is not None and self.admission is None:
                raise TypeError("with authorize=True, give the upstream's opener")
            opened.append(upstream)  # type: ignore[arg-type]

        async def prepare() -> Response | None:
            assert opener is not None
            refused = await self.authorize()
            source = refused or await open_upstream(
                opener, self.account.protocol, self.release, self.failed, self.json
            )
            if isinstance(source, Response):
                source.headers.setdefault(CALL_ID_HEADER, self.request_id)
                return source
            opened.append(source)
            response.init_headers(self._headers(source, headers))
            return None

        async def serve(send: Send, receive: Receive, head: Message) -> None:
            await self._serve(opened[0], retry, send, receive, head, hide)

        response = MeteredResponse(
            serve,
            status_code=status_code,
            headers=self._headers(opened[0] if opened else None, headers),
            media_type=media_type,
            prepare=None if opener is None else prepare,
        )
        return response

    async def _serve(
        self,
        upstream: AsyncSource,
        retry: Callable[[], Awaitable[AsyncSource]] | None,
        send: Send,
        receive: Receive,
        head: Message,
        hide: UsageChunkFilter | None,
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
        pump = self._pump(upstream, send, hide)  # (after the head: the pump writes the body)
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
                    next_pump = await self._next_attempt(outcome, retry, send, hide)
                    if next_pump is not None:
                        pump = next_pump
                        continue
                # the end of the client's stream, as a StreamingResponse ends when its relay
                # returns (after a failure too: the attempt is settled and reported)
                rest = b"" if hide is None else hide.finish()
                await send({"type": "http.response.body", "body": rest, "more_body": False})
                return
        except _CLIENT_GONE as gone:
            if not account.settled:  # (the last write may fail after a complete stream)
                pump.leave(shutdown=self._shutting_down(gone))
            raise
        finally:
            left.cancel()

    async def relay(
        self,
        upstream: AsyncSource,
        *,
        retry: Callable[[], Awaitable[AsyncSource]] | None = None,
        hide_usage: bool = False,
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
        ``hide_usage``: as :meth:`response`'s.
        """
        account = self.account
        hide = UsageChunkFilter() if hide_usage else None
        account.start_attempt()
        pump = self._pump(upstream)
        try:
            while True:
                ready = pump.ready
                if ready:
                    chunk, generated = ready.popleft()
                    if pump.room is not None:  # (the call only when the pump waits: a call a chunk)
                        pump.taken()
                    out = chunk if hide is None else hide(chunk)
                    if out:
                        yield out
                    account.delivered = generated
                    account.bytes_relayed += len(chunk)
                    continue
                outcome = pump.outcome
                if outcome is None:
                    await pump.arrival()
                    continue
                if outcome == END:
                    account.settle()
                    rest = b"" if hide is None else hide.finish()
                    if rest:
                        yield rest
                    return
                next_pump = await self._next_attempt(outcome, retry, None)
                if next_pump is None:
                    return  # stalled or broken: the attempt is settled; the client's stream ends
                pump = next_pump
        except _CLIENT_GONE as gone:
            pump.leave(shutdown=self._shutting_down(gone))
            raise

    def _shutting_down(self, gone: BaseException) -> bool:
        """Whether the stream was cut by the gateway's shutdown rather than by the client: the
        response's task cancelled by the server at the end of its graceful shutdown (uvicorn's
        ``timeout_graceful_shutdown``: its cancel message says so), or while
        :meth:`Meters.shutdown` runs."""
        if not isinstance(gone, asyncio.CancelledError):
            return False
        said = " ".join(str(arg) for arg in gone.args)
        return self._meters.shutting_down or "graceful shutdown" in said

    def relay_sync(
        self,
        upstream: SyncSource,
        *,
        retry: Callable[[], SyncSource] | None = None,
    ) -> Iterator[bytes]:
        """The synchronous twin of :meth:`relay` (a WSGI body, a thread per stream): the same
        events (but a cut by the gateway's shutdown is a client disconnect here); the upstream
        is read in line, and after a disconnect (the server closes the
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
