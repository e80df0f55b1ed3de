"""Delivery of a set of events: the retries with backoff, ``Retry-After``, the split of a batch
that is too large, and the events the service names as refused (CONTRACT "Ingest")."""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from billing import __version__
from billing.client.errors import DeliveryError, OnError
from billing.client.spool import (
    DEFAULT_MAX_SPOOL_BYTES,
    DEFAULT_SPOOL,
    DefaultSpool,
    Item,
    Spool,
    claim_default_spool,
)
from billing.client.wire import HEAD, MAX_BATCH_EVENTS, TAIL, Verdict, classify

log = logging.getLogger("billing.client")


@dataclass(frozen=True, slots=True)
class Post:
    """Action: POST ``body`` to the events endpoint; send back the response or the exception."""

    body: bytes


@dataclass(frozen=True, slots=True)
class Sleep:
    """Action: wait ``seconds`` (``None``: no limit), cut short once ``until()`` is true; send
    back ``None``. The driver calls ``until`` with the engine's ``lock`` held, at the start and
    after every ``notify``."""

    seconds: float | None
    until: Callable[[], bool]


Action = Post | Sleep
Outcome = Literal["ok", "unreachable", "refused"]


class Delivery:
    """The engine's settings, its shared state and counters, and :meth:`_deliver`: posting one
    set of events until each is acknowledged or rejected.

    Shared state is guarded by ``lock``; ``notify`` (set by the driver) is called with ``lock``
    held after every change a waiter may care about. :class:`billing.client.engine.Engine` adds
    the queue, ``flush`` and the worker.

    Raises:
        ValueError: a parameter out of range or a URL that is not http(s).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        batch_size: int,
        flush_interval_s: float,
        max_buffer: int,
        spool_path: str | os.PathLike[str] | DefaultSpool | None,
        max_retries: int,
        timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        max_retry_after_s: float,
        on_error: OnError | None,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {url!r}")
        if not 1 <= batch_size <= MAX_BATCH_EVENTS:
            raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_EVENTS}")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        if max_spool_bytes < 1:
            raise ValueError("max_spool_bytes must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        self.base_url = url.rstrip("/")
        self.endpoint = self.base_url + "/v1/events"
        self.headers = {
            "Content-Type": "application/json",
            "User-Agent": f"billing-client/{__version__}",
        }
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_buffer = max_buffer
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self.on_error = on_error
        self.spool: Spool | None = None
        if spool_path is DEFAULT_SPOOL:
            self.spool = Spool(*claim_default_spool(self.endpoint), max_bytes=max_spool_bytes)
        elif isinstance(spool_path, str | os.PathLike):
            self.spool = Spool(Path(spool_path), max_bytes=max_spool_bytes)

        self.lock = threading.Lock()
        self.notify: Callable[[], None] = lambda: None
        self.wake = False
        self.abort = False
        self.closing = False
        self.worker_done = False
        self._buffer: deque[Item] = deque()
        self._inflight: list[Item] = []
        self._seq = 0
        self._flush_gen = 0
        self._flushing = 0
        self._unreachable = 0
        self._loss_mark = 0
        # counters
        self._sent = 0
        self._accepted = 0
        self._duplicates = 0
        self._spooled = 0
        self._replayed = 0
        self._rejected = 0
        self._dropped = 0
        self._requests = 0
        self._retries = 0

    def _aborted(self) -> bool:
        return self.abort

    def _deliver(self, items: list[Item]) -> Generator[Action, Any, tuple[Outcome, list[Item]]]:
        """Post ``items`` until each is acknowledged or rejected.

        Returns ``("ok", [])``, or ``("unreachable" | "refused", events not yet acknowledged)``.
        """
        queue: list[list[Item]] = [items]
        while queue:
            batch = queue.pop(0)
            body = HEAD + b",".join(item.data for item in batch) + TAIL
            attempt = 0
            while True:
                with self.lock:
                    self._requests += 1
                result = yield Post(body)
                verdict = classify(result, self.max_retry_after_s)
                if verdict.kind == "ok":
                    if verdict.accepted + verdict.duplicates != len(batch):
                        log.warning(
                            "billing client: the service acknowledged %d of %d events",
                            verdict.accepted + verdict.duplicates,
                            len(batch),
                        )
                    with self.lock:
                        self._accepted += verdict.accepted
                        self._duplicates += verdict.duplicates
                        self.notify()
                    break
                if verdict.kind == "retry":
                    if attempt >= self.max_retries or self.abort:
                        rest = batch + [item for part in queue for item in part]
                        self._give_up("unreachable", verdict, rest, attempt + 1)
                        return "unreachable", rest
                    delay = verdict.retry_after
                    if delay is None:
                        cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
                        delay = cap * random.uniform(0.5, 1.0)
                    attempt += 1
                    with self.lock:
                        self._retries += 1
                    log.info(
                        "billing client: %s; retrying %d event(s) in %.2f s (retry %d of %d)",
                        verdict.message,
                        len(batch),
                        delay,
                        attempt,
                        self.max_retries,
                    )
                    yield Sleep(delay, self._aborted)
                    if self.abort:
                        rest = batch + [item for part in queue for item in part]
                        self._give_up("unreachable", verdict, rest, attempt)
                        return "unreachable", rest
                    continue
                if verdict.kind == "refused":
                    rest = batch + [item for part in queue for item in part]
                    self._give_up("refused", verdict, rest, attempt + 1)
                    return "refused", rest
                if verdict.kind == "too_large" and len(batch) > 1:
                    half = len(batch) // 2
                    queue[:0] = [batch[:half], batch[half:]]
                    break
                bad = [i for i in sorted(verdict.indexes) if 0 <= i < len(batch)]
                if verdict.kind == "invalid" and bad:
                    self._reject([batch[i] for i in bad], verdict)
                    good = [item for i, item in enumerate(batch) if i not in verdict.indexes]
                    if good:
                        queue.insert(0, good)
                    break
                self._reject(batch, verdict)
                break
        return "ok", []

    def _give_up(
        self,
        kind: Literal["unreachable", "refused"],
        verdict: Verdict,
        rest: list[Item],
        attempts: int,
    ) -> None:
        with self.lock:
            self._unreachable += 1
            self.notify()
        if kind == "unreachable":
            message = (
                f"the billing service at {self.endpoint} did not answer after {attempts} "
                f"attempt(s) ({verdict.message}); {len(rest)} event(s) "
                + ("go to the spool" if self.spool is not None else "kept in memory")
            )
        else:
            message = (
                f"the billing service refused the client ({verdict.message}); check the token "
                f"and URL; {len(rest)} event(s) "
                + ("kept in the spool" if self.spool is not None else "dropped")
            )
        self._report(
            DeliveryError(
                kind,
                message,
                status=verdict.status,
                event_ids=[item.event_id for item in rest],
                detail=verdict.detail,
            )
        )

    def _reject(self, items: list[Item], verdict: Verdict) -> None:
        with self.lock:
            self._rejected += len(items)
            self.notify()
        self._report(
            DeliveryError(
                "rejected",
                f"the service rejected {len(items)} event(s) ({verdict.message}); dropped",
                status=verdict.status,
                event_ids=[item.event_id for item in items],
                detail=verdict.detail,
            )
        )

    def _report(self, error: DeliveryError) -> None:
        """Log at WARNING and pass to ``on_error`` (never raises; called without ``lock``).

        Every report is a loss or a risk of one; WARNING is what Python's last-resort handler
        prints on standard error when the application configured no logging, so none of them
        passes unseen with the defaults."""
        log.warning("billing client: %s", error.message)
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception:
                log.exception("billing client: the on_error callback raised")
