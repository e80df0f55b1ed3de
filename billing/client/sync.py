"""The synchronous client: the engine driven by a background thread over ``httpx.Client``."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator, Mapping
from types import TracebackType
from typing import Any, Self, Unpack

import httpx

from billing.client import authorizations as authz
from billing.client.authorizations import Authorization, AuthorizationFields, Release, Request
from billing.client.base import ClientBase, R
from billing.client.delivery import Action, Post, log

#: Seconds a client left open at interpreter exit may take to deliver what it holds before the
#: rest goes to the spool (see :meth:`BillingClient._close_at_exit`).
EXIT_FLUSH_S = 2.0


class BillingClient(ClientBase[httpx.BaseTransport]):
    """Posts lifecycle events to the billing service from a background thread.

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:8000``.
        token: a bearer token with the ``ingest`` (or ``admin``) role; ``None`` for a service
            without tokens.
        batch_size: events per post, 1-1000.
        flush_interval_s: seconds an event may wait for its batch to fill before it is posted.
        max_buffer: events held in memory at most; past it, new events go to the spool (or are
            dropped and reported when there is no spool).
        spool_path: the JSON-lines spool file (created when needed); by default
            (:data:`~billing.client.spool.DEFAULT_SPOOL`) one of this process in the user's
            cache directory (``$XDG_CACHE_HOME/billing/spool/``, see
            :func:`~billing.client.spool.claim_default_spool`); ``None`` for none (events the
            service cannot take are then kept in memory, or dropped past ``max_buffer`` or at
            ``close()``, each loss logged at WARNING).
        max_spool_bytes: the spool's bound (default
            :data:`~billing.client.spool.DEFAULT_MAX_SPOOL_BYTES`, 256 MiB); past it, events
            that would go to the spool are dropped and reported.
        max_retries: retries of a post after a network error, ``408``, ``429`` or ``5xx``
            before the service counts as unreachable (its events then go to the spool, or stay
            in memory, and are tried again after a pause of 1-30 s).
        timeout_s: HTTP timeout of one post, seconds.
        backoff_base_s, backoff_max_s: retry ``n`` (from 0) waits
            ``min(backoff_max_s, backoff_base_s * 2**n)`` times a random factor in [0.5, 1],
            unless the service sent ``Retry-After`` (honoured, up to ``max_retry_after_s``).
        on_error: called from the worker with a :class:`DeliveryError` for every rejection,
            give-up or loss; exceptions it raises are logged and ignored.
        transport: an ``httpx`` transport to post through (tests, proxies), else httpx's own.

    Raises:
        ValueError: a parameter out of range or a URL that is not http(s).
    """

    def _open(self, transport: httpx.BaseTransport | None) -> None:
        self._cond = threading.Condition(self._engine.lock)
        self._engine.notify = self._cond.notify_all
        self._http = httpx.Client(timeout=self._engine.timeout_s, transport=transport)
        self._thread = threading.Thread(
            target=self._drive, args=(self._engine.run(),), name="billing-client", daemon=True
        )
        self._thread.start()
        # the worker is a daemon thread, killed at interpreter exit with what it holds: a client
        # left open is closed at exit (the thread keeps it alive until then)
        self._left_open = weakref.finalize(self, self._close_at_exit)

    def send(self, event: Mapping[str, Any]) -> str:
        """Queue one contract event for delivery; returns its ``event_id``. Never blocks on I/O
        (except an append to the spool file when the buffer is full).

        ``event`` is a dict with the envelope fields (CONTRACT "Events"); the caller's dict is
        not modified. ``event_id`` is filled with :func:`new_event_id` and ``occurred_at`` with
        now (UTC) when missing; an aware ``datetime`` as ``occurred_at`` is written in RFC 3339.

        Raises:
            TypeError: ``event`` is not a dict, its ``event_id`` not a string, or it does not
                serialise to JSON.
            ValueError: ``occurred_at`` is a naive ``datetime``.
            ClientClosedError: the client is closed.
        """
        return self._engine.send(event)

    def authorize(self, **fields: Unpack[AuthorizationFields]) -> Authorization:
        """Reserve the call's estimate against the budgets before calling the upstream
        (``POST /v1/authorizations``, one request, no retry): the typed decision.

        ``request_id``, ``api_key_id``, ``model`` and ``estimate`` (``{"input_tokens": N,
        "max_output_tokens": M}`` or ``{"amount_usd": "0.05"}``); optional ``service_tier``,
        ``tags``, ``ttl_s`` and ``timeout_s`` (else the client's ``timeout_s``). The same
        ``request_id`` and arguments again get the first answer.

        Raises:
            AuthorizationUnavailable: the service could not decide (``503``, another ``5xx``,
                ``408``, ``429``) or did not answer: apply the gateway's ``fail_open``.
            AuthorizationRejected: the service refused the request (``401``, ``403``, ``409``,
                ``422``).
        """
        request = authz.authorization_request(self._engine.base_url, **fields)
        return authz.read_authorization(self._request(request, fields.get("timeout_s")))

    def release(self, request_id: str, *, timeout_s: float | None = None) -> Release:
        """Give the hold of ``request_id`` back (``DELETE /v1/authorizations/{request_id}``: the
        gateway did not call the upstream, or it failed before a byte). Raises as
        :meth:`authorize` (``AuthorizationRejected`` with ``status`` 404: no such
        authorization)."""
        request = authz.release_request(self._engine.base_url, request_id)
        return authz.read_release(self._request(request, timeout_s), request_id)

    def _request(self, request: Request, timeout_s: float | None) -> httpx.Response | Exception:
        try:
            return self._http.request(**self._request_args(request, timeout_s))
        except Exception as error:  # network errors, timeouts, protocol errors
            return error

    def flush(self, timeout: float | None = None) -> bool:
        """Deliver everything queued so far now, and replay the spool; block until done.

        Returns ``True`` when every event queued before the call is acknowledged by the
        service, the spool is empty and no event was rejected or dropped since the previous
        flush; ``False`` when the service is unreachable (events then wait in the spool or in
        memory), when events were rejected or dropped, or on ``timeout`` (seconds).
        """
        return self._drive(self._engine.flush(timeout))

    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to ``timeout`` seconds), then stop the worker and release the connection.

        What could not be delivered is left in the spool (or dropped and reported without one).
        Returns the flush result; closing again returns the first result.
        """
        if self._closed is not None:
            return self._closed
        ok = self.flush(timeout)
        self._engine.begin_close(abort=not ok)
        self._thread.join(None if ok else self._engine.timeout_s + 5.0)
        if self._thread.is_alive():  # pragma: no cover - a post hangs past its timeout
            log.warning("billing client: the worker did not stop in time")
        self._http.close()
        self._closed = ok
        self._left_open.detach()
        return ok

    def _close_at_exit(self) -> None:
        """The interpreter exits and the client was not closed: deliver what it holds for up
        to :data:`EXIT_FLUSH_S` seconds, then write the rest to the spool (or drop it,
        reported), logging a WARNING with the count."""
        pending = self._engine.stats().pending
        if pending:
            log.warning(
                "billing client: the process is exiting without close(): delivering %d queued "
                "event(s) (up to %g s, then to the spool)",
                pending,
                EXIT_FLUSH_S,
            )
        self.close(timeout=EXIT_FLUSH_S)
        self._engine.abandon()  # the worker is gone or stuck in a post: what it still holds

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _drive(self, steps: Generator[Action, object, R]) -> R:
        """Run an engine generator to its end on this thread; returns what it returns."""
        answer: object = None
        try:
            while True:
                answer = self._perform(steps.send(answer))
        except StopIteration as stop:
            value: R = stop.value
            return value
        finally:
            steps.close()

    def _perform(self, action: Action) -> object:
        if isinstance(action, Post):
            engine = self._engine
            try:
                return self._http.post(engine.endpoint, content=action.body, headers=engine.headers)
            except Exception as error:  # network errors, timeouts, protocol errors
                return error
        with self._cond:
            self._cond.wait_for(action.until, action.seconds)
        return None
