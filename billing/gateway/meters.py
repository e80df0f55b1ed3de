"""What every metered call of a gateway process shares: :class:`Meters` (the billing client, the
drain policy, the bound on running drains, the upstreams read now, the authorization before the
upstream) and the process's shutdown (:meth:`Meters.lifespan`, :meth:`Meters.shutdown`);
:meth:`Meters.call` gives one call's :class:`~billing.gateway.meter.Meter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping
from decimal import Decimal
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from billing.fields import ModelName, PublicId
from billing.gateway.account import CallAccount
from billing.gateway.authorize import DEFAULT_MAX_OUTPUT_TOKENS, Authorizer, Reserver
from billing.gateway.headers import client_request_metadata, new_call_id
from billing.gateway.meter import Meter
from billing.gateway.policy import DrainPolicy
from billing.gateway.pump import Pump
from billing.gateway.slots import DrainSlots
from billing.ingest.validation import plain_message

__all__ = ["EventSink", "Meters"]


#: ``stream.started``'s own rules for the call's fields (CONTRACT "Events"; the types the
#: service validates it with, :class:`billing.ingest.schemas.StreamStarted`).
_CALL_FIELDS: dict[str, TypeAdapter[str]] = {
    "api_key_id": TypeAdapter(PublicId),
    "model": TypeAdapter(ModelName),
}


def invalid_call_fields(api_key_id: object, model: object) -> str | None:
    """Why the service would refuse a call's ``stream.started`` for its ``api_key_id`` or
    ``model`` (too long, control characters, blank, a secret, not a string), else ``None``."""
    for name, value in (("api_key_id", api_key_id), ("model", model)):
        try:
            _CALL_FIELDS[name].validate_python(value)
        except ValidationError as error:
            return f"{name} {plain_message(error.errors()[0])}"
    return None


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
        shutdown_grace_s: at the process's shutdown (:meth:`lifespan`), seconds given to the
            upstreams still read before they are cut (:meth:`shutdown`). The lifespan runs
            only after the server's own wait for the responses in flight (uvicorn's
            ``timeout_graceful_shutdown``, unbounded unless set): both together must end
            before the orchestrator's SIGKILL (Kubernetes: 30 s after SIGTERM by default).
        authorize: reserve each call's estimate before its upstream is opened (with an
            ``AsyncBillingClient``; :meth:`Meter.authorize`, :meth:`Meter.response`).
        fail_open: when the service is unavailable (503 or another 5xx, no answer): call
            the upstream (``True``) or answer 503; logged at WARNING. A request the service
            refuses (401, 409, ...) is a misconfiguration: the call is refused with 500
            either way (400 ``invalid_request_error`` for a 422, a field refused, which a
            client's SDK does not retry), logged at ERROR.
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
        shutdown_grace_s: float = 15.0,
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
        self.shutdown_grace_s = shutdown_grace_s
        self.slots = DrainSlots(self.policy.max_concurrent)
        #: the asyncio attempts reading an upstream now (relayed or drained)
        self.pumps: set[Pump] = set()
        #: :meth:`shutdown` has begun: a response cancelled now was cut by the gateway
        self.shutting_down = False
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
        api_key_id: str,
        model: str,
        protocol: str,
        request_id: str | None = None,
        client_request_id: str | None = None,
        input_tokens: int | None = None,
        metadata: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Meter:
        """The meter of one call (CONTRACT "Events": ``stream.started``'s fields).

        ``request_id`` is the call's id, the gateway's own (default: a new ``gw-<hex>``,
        :func:`~billing.gateway.headers.new_call_id`; ``meter.request_id``), never a value the
        client chose: events are idempotent by it, so two requests under one id would be
        billed as one call. ``client_request_id`` (the client's ``X-Request-Id``) is kept as
        the metadata ``client_request_id`` only (printable, at most 256 characters).
        ``input_tokens`` is the gateway's own count of the input (used when the upstream
        reports none, and in the authorization's estimate); ``metadata`` is added to the drain
        policy's entries; ``body`` is the request sent upstream, whose output limit
        (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``) bounds the hold.

        An ``api_key_id`` or ``model`` the service would refuse in ``stream.started`` (the same
        rule: at most 128 and 256 printable characters, not blank, not a secret key) makes no
        call: :meth:`Meter.authorize` (and so :meth:`Meter.response` given an opener) answers
        400 ``invalid_request_error`` in the protocol's shape, before anything is sent to the
        service or the upstream (``meter.invalid`` says why).

        Raises:
            ValueError: ``protocol`` is not one of :data:`billing.taps.PROTOCOLS`.
        """
        return Meter(
            self,
            CallAccount(
                self.client.send,
                request_id=request_id or new_call_id(),
                api_key_id=api_key_id,
                model=model,
                protocol=protocol,
                input_tokens=input_tokens,
                metadata={
                    **self.policy.metadata(),
                    **(metadata or {}),
                    **client_request_metadata(client_request_id),
                },
                progress_every=self.progress_every,
            ),
            body,
            invalid=invalid_call_fields(api_key_id, model),
        )

    @property
    def drains_running(self) -> int:
        """Drains running now (asyncio and threads)."""
        return self.slots.running

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """The gateway's lifespan (``FastAPI(lifespan=meters.lifespan)``, Starlette alike): at
        start, the billing client starts delivering (a spool left by a killed process is
        delivered now); at shutdown, :meth:`shutdown` with ``shutdown_grace_s``. A gateway with
        a lifespan of its own enters this one in it (``async with meters.lifespan(app):``)."""
        start: Callable[[], object] | None = getattr(self.client, "start", None)
        if start is not None:
            start()
        try:
            yield
        finally:
            await self.shutdown(self.shutdown_grace_s)

    async def shutdown(self, grace_s: float = 30.0, flush_s: float = 10.0) -> None:
        """End the process's metering without losing a call: wait at most ``grace_s`` seconds
        for the upstreams still read (streams in flight, drains) to end; settle those left on
        what their taps counted (an estimate flagged ``drain_skipped``, and ``stream.failed``
        ``gateway_shutdown`` for a stream the client still read), closing their upstreams;
        then close the billing client within ``flush_s`` seconds (what the service did not
        take by then stays in the client's spool, delivered by the next process)."""
        self.shutting_down = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (self.pumps or self.slots.running) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        left = list(self.pumps)
        for pump in left:
            pump.abandon()
        if left:
            await asyncio.wait([pump.task for pump in left], timeout=flush_s)
        close: Callable[..., object] | None = getattr(self.client, "close", None)
        if close is None:
            return
        if inspect.iscoroutinefunction(close):  # AsyncBillingClient
            await close(timeout=flush_s)
        else:  # BillingClient: its close blocks, off the loop
            await asyncio.to_thread(close, timeout=flush_s)

    async def wait_drains(self, timeout: float | None = None) -> bool:
        """Wait (``timeout`` seconds at most) until no drain runs, e.g. before closing the
        billing client at shutdown; ``True`` when none runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.slots.running:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
