"""What both clients share: their arguments, the engine, and the counters."""

from __future__ import annotations

import os
from typing import Any, Generic, TypeVar

import httpx

from billing.client.authorizations import Request
from billing.client.engine import Engine
from billing.client.errors import ClientStats, OnError
from billing.client.spool import DEFAULT_MAX_SPOOL_BYTES, DEFAULT_SPOOL, DefaultSpool

_TransportT = TypeVar("_TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
R = TypeVar("R")


class _Counter:
    """A read-only attribute that reads one counter of :meth:`ClientBase.stats`."""

    def __init__(self, name: str, doc: str) -> None:
        self._name = name
        self.__doc__ = doc

    def __get__(self, client: ClientBase[Any], owner: type | None = None) -> int:
        value: int = getattr(client.stats(), self._name)
        return value


class ClientBase(Generic[_TransportT]):
    """What both clients share: the arguments (documented on :class:`BillingClient`;
    ``transport`` is an ``httpx.BaseTransport`` there, an ``httpx.AsyncBaseTransport`` for
    :class:`AsyncBillingClient`), the engine and the counters. A subclass opens its transport in
    :meth:`_open` and performs the engine's actions in ``_drive``."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        batch_size: int = 100,
        flush_interval_s: float = 1.0,
        max_buffer: int = 100_000,
        spool_path: str | os.PathLike[str] | DefaultSpool | None = DEFAULT_SPOOL,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
        max_retries: int = 5,
        timeout_s: float = 10.0,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        max_retry_after_s: float = 60.0,
        on_error: OnError | None = None,
        transport: _TransportT | None = None,
    ) -> None:
        self._engine = Engine(
            url,
            token=token,
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            max_buffer=max_buffer,
            spool_path=spool_path,
            max_spool_bytes=max_spool_bytes,
            max_retries=max_retries,
            timeout_s=timeout_s,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
            max_retry_after_s=max_retry_after_s,
            on_error=on_error,
        )
        self._closed: bool | None = None
        self._open(transport)

    def _open(self, transport: _TransportT | None) -> None:
        raise NotImplementedError

    def _request_args(self, request: Request, timeout_s: float | None) -> dict[str, Any]:
        """The arguments of ``httpx``'s ``request`` for ``request`` (an authorization's)."""
        return {
            "method": request.method,
            "url": request.url,
            "content": request.body,
            "headers": self._engine.headers,
            "timeout": timeout_s or self._engine.timeout_s,
        }

    def stats(self) -> ClientStats:
        """A snapshot of the counters."""
        return self._engine.stats()

    sent = _Counter("sent", "Events given to :meth:`send`.")
    acknowledged = _Counter(
        "acknowledged", "Events the service answered for (accepted + duplicates)."
    )
    spooled = _Counter("spooled", "Events written to the spool file.")
    rejected = _Counter("rejected", "Events the service rejected (``4xx``), dropped.")
