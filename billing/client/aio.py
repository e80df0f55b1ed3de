"""The asyncio client: the engine driven by a task of the running loop (``httpx.AsyncClient``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Generator, Mapping
from types import TracebackType
from typing import Any, Self, Unpack

import httpx

from billing.client import authorizations as authz
from billing.client.authorizations import Authorization, AuthorizationFields, Release, Request
from billing.client.base import ClientBase, R
from billing.client.delivery import Action, Post, log


class AsyncBillingClient(ClientBase[httpx.AsyncBaseTransport]):
    """The asyncio twin of :class:`BillingClient`: same arguments, same behaviour, delivery in
    a background task of the running event loop (started by the first ``send``, ``flush`` or
    ``async with``). ``send`` is a plain method (it never waits); ``flush`` and ``close`` (alias
    ``aclose``) are coroutines. Use it from the loop's thread.

    Spool writes are plain file appends made on the loop (small, and only when the service is
    unreachable or the buffer is full).
    """

    def _open(self, transport: httpx.AsyncBaseTransport | None) -> None:
        self._transport = transport
        self._engine.notify = self._notify
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()  # set, and replaced, on every notify
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        # a client not closed before its loop ended (asyncio.run cancels the delivery task) is
        # spooled synchronously when it is collected, or at interpreter exit
        self._left_open = weakref.finalize(self, self._engine.abandon)

    def send(self, event: Mapping[str, Any]) -> str:
        """Queue one event; see :meth:`BillingClient.send`. Call it from the event loop."""
        self._start()
        return self._engine.send(event)

    async def authorize(self, **fields: Unpack[AuthorizationFields]) -> Authorization:
        """See :meth:`BillingClient.authorize`."""
        request = authz.authorization_request(self._engine.base_url, **fields)
        return authz.read_authorization(await self._request(request, fields.get("timeout_s")))

    async def release(self, request_id: str, *, timeout_s: float | None = None) -> Release:
        """See :meth:`BillingClient.release`."""
        request = authz.release_request(self._engine.base_url, request_id)
        return authz.read_release(await self._request(request, timeout_s), request_id)

    async def _request(
        self, request: Request, timeout_s: float | None
    ) -> httpx.Response | Exception:
        self._start()
        assert self._http is not None
        try:
            return await self._http.request(**self._request_args(request, timeout_s))
        except Exception as error:  # network errors, timeouts, protocol errors
            return error

    async def flush(self, timeout: float | None = None) -> bool:
        """See :meth:`BillingClient.flush`."""
        self._start()
        return await self._drive(self._engine.flush(timeout))

    async def close(self, timeout: float | None = None) -> bool:
        """See :meth:`BillingClient.close`."""
        if self._closed is not None:
            return self._closed
        ok = await self.flush(timeout)
        self._engine.begin_close(abort=not ok)
        if self._task is not None:
            try:
                await asyncio.wait_for(
                    asyncio.shield(self._task), None if ok else self._engine.timeout_s + 5.0
                )
            except TimeoutError:  # pragma: no cover - a post hangs past its timeout
                log.warning("billing client: the delivery task did not stop in time")
                self._task.cancel()
        if self._http is not None:
            await self._http.aclose()
        self._closed = ok
        self._left_open.detach()
        return ok

    aclose = close

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def start(self) -> None:
        """Start delivering now, before the first ``send`` (a spool left by an earlier process
        is replayed at once): a gateway's startup calls it
        (:meth:`billing.gateway.Meters.lifespan` does). Call it from the event loop."""
        self._start()

    def _start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()  # RuntimeError outside a running loop
        self._http = httpx.AsyncClient(timeout=self._engine.timeout_s, transport=self._transport)
        self._task = self._loop.create_task(self._drive(self._engine.run()), name="billing-client")

    def _notify(self) -> None:
        """Wake every waiter; the engine calls it after each change, maybe from another thread."""
        loop = self._loop
        if loop is None or loop.is_closed():  # the delivery task is gone with its loop
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._signal()
        else:
            loop.call_soon_threadsafe(self._signal)

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _drive(self, steps: Generator[Action, object, R]) -> R:
        """Run an engine generator to its end on the loop; returns what it returns."""
        answer: object = None
        try:
            while True:
                answer = await self._perform(steps.send(answer))
        except StopIteration as stop:
            value: R = stop.value
            return value
        finally:
            steps.close()

    async def _perform(self, action: Action) -> object:
        engine = self._engine
        if isinstance(action, Post):
            assert self._http is not None
            try:
                return await self._http.post(
                    engine.endpoint, content=action.body, headers=engine.headers
                )
            except Exception as error:  # network errors, timeouts, protocol errors
                return error
        deadline = None if action.seconds is None else time.monotonic() + action.seconds
        while True:
            changed = self._changed  # taken first: a notify from here on sets it
            with engine.lock:
                if action.until():
                    return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
