"""The synchronous client: the engine driven by a background thread over ``httpx.Client``."""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from billing.client.base import ClientBase, R
from billing.client.delivery import Action, Post, log


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

    def authorize(
        self,
        request_id: str,
        api_key_id: str,
        model: str,
        estimate: Mapping[str, Any],
        *,
        tags: Sequence[str] | None = None,
        service_tier: str | None = None,
        ttl_s: int | None = None,
    ) -> dict[str, Any]:
        """Reserve ``estimate`` (``{"input_tokens", "max_output_tokens"}`` or
        ``{"amount_usd": "0.05"}``) for the call ``request_id`` before calling the upstream;
        returns the service's answer (``decision``, ``reason``, ``retryable``,
        ``retry_after_s``, ``hold_usd``, ``expires_at``, …). Blocks on one HTTP request; the same
        ``request_id`` and arguments again get the first answer.

        Raises:
            ServiceError: no answer, or not 200 (``status`` 409, 422, 503…).
        """
        url, body = self._authorization(
            request_id, api_key_id, model, estimate, tags, service_tier, ttl_s
        )
        try:
            response: httpx.Response | Exception = self._http.post(
                url, json=body, headers=self._headers()
            )
        except Exception as error:  # network errors, timeouts, protocol errors
            response = error
        return self._answer(response)

    def release(self, request_id: str) -> dict[str, Any]:
        """Give back the hold of ``request_id`` (the gateway did not call the upstream);
        returns ``{"request_id", "state", "hold_usd", "expires_at", "released_at"}``.

        Raises:
            ServiceError: no answer, or not 200 (``status`` 404: no such authorization).
        """
        try:
            response: httpx.Response | Exception = self._http.delete(
                self._release_url(request_id), headers=self._headers()
            )
        except Exception as error:  # network errors, timeouts, protocol errors
            response = error
        return self._answer(response)

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
        return ok

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
