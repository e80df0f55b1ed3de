"""The client a Python gateway embeds to post lifecycle events to the billing service.

Two flavours with the same behaviour:

* :class:`BillingClient` - synchronous API, delivery in a background thread;
* :class:`AsyncBillingClient` - asyncio API, delivery in a background task.

Typical use::

    with BillingClient("http://billing:8000", token=INGEST_TOKEN, spool_path="billing.spool") as c:
        c.send({"request_id": rid, "type": "stream.started", "api_key_id": "key_7f3a",
                "model": "gpt-4o", "protocol": "openai.chat_completions"})
        ...

What the client guarantees (CONTRACT "Events" and "Ingest"):

* ``send(event)`` never blocks on the network. It takes a contract event (a dict with the
  envelope fields), fills ``event_id`` (``evt_<uuid4 hex>``) and ``occurred_at`` (now, RFC 3339
  UTC with ``Z``) when they are missing, and queues it.
* Events are posted as ``{"events": [...]}`` to ``{url}/v1/events`` in batches of up to
  ``batch_size`` events (and under the service's 1 MiB body limit), as soon as a batch is full
  or ``flush_interval_s`` after the oldest queued event.
* Network errors, ``408``, ``429`` and ``5xx`` (``503`` included) are retried with exponential
  backoff and jitter, honouring ``Retry-After``. A retry re-posts the SAME events with the SAME
  ``event_id`` values, so the service's idempotency makes it safe (a batch stored before the
  connection broke comes back as ``duplicates``).
* A ``4xx`` verdict on the events is not retried: ``422`` and ``409`` name the offending
  events, which are dropped and reported (``on_error``, the ``rejected`` counter, a log line),
  and the rest of the batch is posted again (the service stores nothing of a refused batch, so
  one bad event must not cost the good ones). ``413`` splits the batch; a single event that is
  too large is rejected. Any other ``4xx`` rejects the whole batch.
* ``401``, ``403``, ``404`` and redirects say the client is misconfigured (token or URL), not
  that the events are wrong: they are reported and, when a spool is configured, kept in it
  instead of being dropped, so fixing the token loses nothing.
* Memory is bounded: past ``max_buffer`` queued events, new events go to the spool file; when
  the service stays unreachable past the retries, everything queued goes there too. The spool
  is an append-only JSON-lines file, replayed in order when the service answers again (see
  :class:`_Spool` for how it is rotated safely). A spool left by an earlier process is replayed
  at start. Without ``spool_path``, overflow events are dropped and reported, and events that
  cannot be delivered stay in memory and are tried again later.

Counters (:meth:`BillingClient.stats`): ``sent`` (events given to ``send``), ``acknowledged``
(``accepted`` + ``duplicates`` as the service answered), ``spooled`` (events written to the
spool), ``replayed`` (events read back from the spool and acknowledged), ``rejected`` (dropped
on a ``4xx``), ``dropped`` (lost on the client side), ``requests`` and ``retries`` (HTTP posts).

How it is built: every decision (batching, retries and backoff, the spool, reading the answers)
is made once, in :class:`_Engine`, as generators that yield "post this body" / "sleep this long"
actions; the two clients are thin drivers that perform them with ``httpx.Client`` on a thread
or ``httpx.AsyncClient`` on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar

import httpx
import orjson

from billing import __version__

__all__ = [
    "MAX_BATCH_EVENTS",
    "MAX_BODY_BYTES",
    "AsyncBillingClient",
    "BillingClient",
    "ClientClosedError",
    "ClientStats",
    "DeliveryError",
    "new_event_id",
    "utc_now",
]

log = logging.getLogger("billing.client")
log.addHandler(logging.NullHandler())  # a library: the application configures logging

#: The most events the service takes in one post (CONTRACT "Ingest").
MAX_BATCH_EVENTS = 1000
#: The largest request body the service takes, in bytes (CONTRACT "Ingest": 1 MiB).
MAX_BODY_BYTES = 1024 * 1024
#: Bytes of a batch body kept free below :data:`MAX_BODY_BYTES` (wrapper and headroom).
_BODY_MARGIN = 1024
_HEAD = b'{"events":['
_TAIL = b"]}"


def new_event_id() -> str:
    """A fresh event id: ``evt_`` followed by 32 hex digits of a random UUID (uuid4)."""
    return f"evt_{uuid.uuid4().hex}"


def utc_now() -> str:
    """Now as RFC 3339 in UTC with microseconds and ``Z`` (``2026-10-15T08:00:00.123456Z``)."""
    return _rfc3339(datetime.now(UTC))


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("occurred_at must be a timezone-aware datetime (or an RFC 3339 string)")
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class ClientClosedError(RuntimeError):
    """``send()`` was called after ``close()``."""


class DeliveryError(Exception):
    """A delivery problem, passed to the ``on_error`` callback (and logged).

    Attributes:
        kind: ``"rejected"`` - the service refused the events with a ``4xx`` (they are dropped);
            ``"refused"`` - ``401``/``403``/``404``/redirect: the client is misconfigured (events
            kept in the spool when there is one, else dropped);
            ``"unreachable"`` - no answer past the retries (events spooled or kept in memory);
            ``"dropped"`` - events lost on the client side (buffer full without a spool, closed
            before delivery without a spool);
            ``"spool_corrupt"`` - unreadable lines skipped in the spool file.
        status: the HTTP status, or ``None`` when there was no answer.
        event_ids: the events concerned (may be empty for ``spool_corrupt``).
        detail: the service's JSON answer (``{"errors": [...]}``, ``{"conflicts": [...]}``, ...)
            when there was one, else ``None``.
    """

    def __init__(
        self,
        kind: Literal["rejected", "refused", "unreachable", "dropped", "spool_corrupt"],
        message: str,
        *,
        status: int | None = None,
        event_ids: Sequence[str] = (),
        detail: Any = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.event_ids = list(event_ids)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of a client's counters (all counts are events, except ``requests`` and
    ``retries``, which count HTTP posts).

    ``acknowledged`` = ``accepted`` + ``duplicates`` as answered by the service; an event posted
    again after its answer was lost is acknowledged again (as a duplicate). ``pending`` is the
    number of events held in memory, not yet acknowledged, spooled or given up.
    """

    sent: int
    acknowledged: int
    accepted: int
    duplicates: int
    spooled: int
    replayed: int
    rejected: int
    dropped: int
    requests: int
    retries: int
    pending: int


OnError = Callable[[DeliveryError], None]


# -- the spool file ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    """One queued event: its sequence number (0 when read from the spool), its id, its JSON
    bytes, and when it was queued (``time.monotonic()`` seconds)."""

    seq: int
    event_id: str
    data: bytes
    queued_at: float


class _Spool:
    """The append-only JSON-lines spool: one event (compact JSON) per line.

    New events are appended to ``path`` (and fsync'ed). To replay, the file is first renamed to
    ``path + ".replay"`` (an atomic rename, so appends go on into a fresh ``path``), then read
    in order, a batch at a time; the read position advances only after the service acknowledged
    the batch, and the file is deleted once fully acknowledged. If the process dies mid-replay,
    the ``.replay`` file is replayed again from its start by the next client: events already
    stored come back as duplicates, so nothing is lost and nothing is billed twice. A line left
    half-written by a crash is skipped and reported.

    One process at a time may use a spool path. Thread-safe.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replay_path = path.with_name(path.name + ".replay")
        self._lock = threading.Lock()
        self._offset = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._end_with_newline(self.path)
        self._end_with_newline(self.replay_path)

    @staticmethod
    def _end_with_newline(path: Path) -> None:
        """Terminate a line cut short by a crash, so that the next append starts a new line."""
        with contextlib.suppress(FileNotFoundError), open(path, "rb+") as file:
            file.seek(0, os.SEEK_END)
            if file.tell() == 0:
                return
            file.seek(-1, os.SEEK_END)
            if file.read(1) != b"\n":
                file.write(b"\n")
                file.flush()
                os.fsync(file.fileno())

    def append(self, items: Iterable[_Item]) -> int:
        """Append events durably (written and fsync'ed); returns how many."""
        lines = [item.data + b"\n" for item in items]
        if not lines:
            return 0
        with self._lock, open(self.path, "ab") as file:
            file.write(b"".join(lines))
            file.flush()
            os.fsync(file.fileno())
        return len(lines)

    def pending(self) -> bool:
        """Whether the spool holds events not yet acknowledged."""
        with self._lock:
            return self.replay_path.exists() or _size(self.path) > 0

    def read_batch(self, max_events: int, max_bytes: int) -> tuple[list[_Item], int, int]:
        """The next events to replay, in file order: ``(items, end_offset, unreadable_lines)``.

        ``end_offset`` is what to pass to :meth:`commit` once the items are acknowledged.
        Returns no items and ``end_offset`` 0 when the spool is empty.
        """
        with self._lock:
            if not self.replay_path.exists():
                if _size(self.path) == 0:
                    return [], 0, 0
                os.replace(self.path, self.replay_path)
                self._offset = 0
            offset = self._offset
        items: list[_Item] = []
        unreadable = 0
        size = len(_HEAD) + len(_TAIL)
        with open(self.replay_path, "rb") as file:
            file.seek(offset)
            while len(items) < max_events:
                line = file.readline()
                if not line:
                    break
                data = line.rstrip(b"\r\n")
                event_id = _spooled_event_id(data)
                if event_id is None:
                    if data.strip():
                        unreadable += 1
                    offset += len(line)
                    continue
                if items and size + len(data) + 1 > max_bytes:
                    break
                size += len(data) + 1
                items.append(_Item(0, event_id, data, 0.0))
                offset += len(line)
        return items, offset, unreadable

    def commit(self, end_offset: int) -> None:
        """Mark everything before ``end_offset`` of the replay file as acknowledged; delete the
        file once it is all acknowledged."""
        with self._lock:
            self._offset = end_offset
            if end_offset >= _size(self.replay_path):
                with contextlib.suppress(FileNotFoundError):
                    self.replay_path.unlink()
                self._offset = 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _spooled_event_id(data: bytes) -> str | None:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(event, dict):
        event_id = event.get("event_id")
        if isinstance(event_id, str) and event_id:
            return event_id
    return None


# -- the delivery engine, free of I/O ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Post:
    """Action: POST ``body`` to the events endpoint; send back the response or the exception."""

    body: bytes


@dataclass(frozen=True, slots=True)
class _Sleep:
    """Action: wait ``seconds`` (``None``: no limit), cut short once ``until()`` is true; send
    back ``None``. The driver calls ``until`` with the engine's ``lock`` held, at the start and
    after every ``notify``."""

    seconds: float | None
    until: Callable[[], bool]


_Action = _Post | _Sleep
_Outcome = Literal["ok", "unreachable", "refused"]


@dataclass(frozen=True, slots=True)
class _Verdict:
    kind: Literal["ok", "retry", "refused", "too_large", "invalid", "rejected"]
    status: int | None
    message: str
    detail: Any = None
    retry_after: float | None = None
    indexes: frozenset[int] = frozenset()
    accepted: int = 0
    duplicates: int = 0


class _Engine:
    """State and delivery logic shared by both clients, with no I/O of its own but the spool.

    The decisions live in generators that yield actions (:class:`_Post`, :class:`_Sleep`) and
    receive their results: :meth:`run`, the background worker, and :meth:`flush`. A driver
    (:meth:`BillingClient._drive` on threads, :meth:`AsyncBillingClient._drive` on asyncio)
    performs the actions. Shared state is guarded by ``lock``; ``notify`` (set by the driver) is
    called with ``lock`` held after every change a waiter may care about.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        batch_size: int,
        flush_interval_s: float,
        max_buffer: int,
        spool_path: str | os.PathLike[str] | None,
        max_retries: int,
        timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        max_retry_after_s: float,
        on_error: OnError | None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {url!r}")
        if not 1 <= batch_size <= MAX_BATCH_EVENTS:
            raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_EVENTS}")
        if flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        if max_buffer < 1:
            raise ValueError("max_buffer must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        self.endpoint = url.rstrip("/") + "/v1/events"
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
        self.spool = _Spool(Path(spool_path)) if spool_path is not None else None

        self.lock = threading.Lock()
        self.notify: Callable[[], None] = lambda: None
        self.wake = False
        self.abort = False
        self.closing = False
        self.worker_done = False
        self._buffer: deque[_Item] = deque()
        self._inflight: list[_Item] = []
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

    # -- called by the public clients ------------------------------------------------------

    def prepare(self, event: Mapping[str, Any]) -> tuple[str, bytes]:
        """The event with ``event_id`` / ``occurred_at`` filled in, as JSON bytes."""
        if not isinstance(event, Mapping):
            raise TypeError(f"an event is a dict, not {type(event).__name__}")
        data = dict(event)
        event_id = data.get("event_id")
        if event_id is None or event_id == "":
            event_id = data["event_id"] = new_event_id()
        elif not isinstance(event_id, str):
            raise TypeError("event_id must be a string")
        occurred_at = data.get("occurred_at")
        if occurred_at is None or occurred_at == "":
            data["occurred_at"] = utc_now()
        elif isinstance(occurred_at, datetime):
            data["occurred_at"] = _rfc3339(occurred_at)
        try:
            payload = orjson.dumps(data)
        except TypeError as error:
            raise TypeError(f"event {event_id} is not JSON-serialisable: {error}") from None
        return event_id, payload

    def send(self, event: Mapping[str, Any]) -> str:
        """Queue one event (see :meth:`BillingClient.send`)."""
        event_id, payload = self.prepare(event)
        with self.lock:
            if self.closing or self.worker_done:
                raise ClientClosedError("the billing client is closed")
            self._seq += 1
            self._sent += 1
            item = _Item(self._seq, event_id, payload, time.monotonic())
            if len(self._buffer) + len(self._inflight) < self.max_buffer:
                self._buffer.append(item)
                if len(self._buffer) == 1 or len(self._buffer) >= self.batch_size:
                    self.wake = True
                    self.notify()
                return event_id
            if self.spool is not None:  # the buffer is full: to disk (under the lock, so a
                self.spool.append([item])  # flush never misses an event in between)
                self._spooled += 1
                self.wake = True
                self.notify()
                return event_id
            self._dropped += 1
            self.notify()
        self._report(
            DeliveryError(
                "dropped",
                f"the in-memory buffer is full ({self.max_buffer} events) and no spool_path "
                "is configured: event dropped",
                event_ids=[event_id],
            )
        )
        return event_id

    def flush(self, timeout: float | None) -> Generator[_Action, Any, bool]:
        """The body of ``flush()``: ask the worker to deliver everything and replay the spool
        now, then wait (``timeout`` seconds at most) until it is done; returns the result
        described in :meth:`BillingClient.flush`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            self._flush_gen += 1
            self._flushing += 1
            self.wake = True
            self.notify()
            target, unreachable_mark = self._seq, self._unreachable

        def result() -> bool | None:
            """With ``lock`` held: ``None`` while the flush must wait, else its result."""
            in_memory = self._min_unresolved() <= target
            if in_memory or (self.spool is not None and self.spool.pending()):
                if self.worker_done:
                    return False
                if self._unreachable > unreachable_mark and not self._inflight:
                    return False  # the service did not answer; what is left waits (spool/memory)
                return None
            return self._rejected + self._dropped == self._loss_mark

        try:
            while True:
                with self.lock:
                    state = result()
                if state is not None:
                    return state
                wait = 1.0
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return False
                yield _Sleep(wait, lambda: result() is not None)
        finally:
            with self.lock:
                self._flushing -= 1
                self._loss_mark = self._rejected + self._dropped

    def begin_close(self, abort: bool) -> None:
        with self.lock:
            self.closing = True
            self.abort = self.abort or abort
            self._flush_gen += 1
            self.wake = True
            self.notify()

    def stats(self) -> ClientStats:
        with self.lock:
            return ClientStats(
                sent=self._sent,
                acknowledged=self._accepted + self._duplicates,
                accepted=self._accepted,
                duplicates=self._duplicates,
                spooled=self._spooled,
                replayed=self._replayed,
                rejected=self._rejected,
                dropped=self._dropped,
                requests=self._requests,
                retries=self._retries,
                pending=len(self._buffer) + len(self._inflight),
            )

    # -- the worker ------------------------------------------------------------------------

    def _min_unresolved(self) -> int:
        seqs = [item.seq for item in self._inflight if item.seq]
        if self._buffer:
            seqs.append(self._buffer[0].seq)
        return min(seqs, default=self._seq + 1)

    def _aborted(self) -> bool:
        return self.abort

    def _woken(self) -> bool:
        return self.abort or self.wake

    def run(self) -> Generator[_Action, Any, None]:
        """The worker: yields actions until the client is closed (and drained) or aborted."""
        try:
            yield from self._work()
        except Exception:  # pragma: no cover - a bug; make flush() return instead of hanging
            log.exception("billing client: the delivery worker failed")
        finally:
            with self.lock:
                self.worker_done = True
                self.notify()

    def _work(self) -> Generator[_Action, Any, None]:
        down_until = 0.0  # the service did not answer: no attempt before this (monotonic)
        down_delay = 0.0
        forced_gen = 0
        prefer_spool = True
        if self.spool is not None and self.spool.pending():
            log.info("billing client: replaying the spool left at %s", self.spool.path)
        while True:
            with self.lock:
                self.wake = False
                now = time.monotonic()
                if self._flush_gen > forced_gen:  # flush()/close(): one attempt now
                    forced_gen = self._flush_gen
                    down_until = 0.0
                abort, closing = self.abort, self.closing
                urgent = closing or self._flushing > 0
                queued = len(self._buffer)
                due = self._buffer[0].queued_at + self.flush_interval_s if queued else None
            if abort:
                self._evacuate("the client was closed before these events were delivered")
                return
            ready = due is not None and (urgent or queued >= self.batch_size or now >= due)
            if now < down_until:
                if ready and self.spool is not None:
                    self._move_to_spool([])
                    continue
                if closing:
                    self._evacuate("the service is unreachable and the client is closing")
                    return
                wait = down_until - now
                if due is not None and not ready:
                    wait = min(wait, due - now)
                yield _Sleep(max(wait, 0.0), self._woken)
                continue
            spool_pending = self.spool is not None and self.spool.pending()
            outcome: _Outcome
            if spool_pending and (prefer_spool or not ready):
                prefer_spool = False
                outcome = yield from self._replay_batch()
            elif ready:
                prefer_spool = True
                outcome = yield from self._send_batch()
            else:
                if closing:
                    return
                yield _Sleep(None if due is None else max(due - now, 0.0), self._woken)
                continue
            if outcome == "ok":
                down_delay = 0.0
            else:
                down_delay = min(30.0, max(1.0, down_delay * 2))
                down_until = time.monotonic() + down_delay * random.uniform(0.5, 1.0)

    def _take_batch(self) -> list[_Item]:
        """With ``lock`` held: the oldest queued events, within the count and size limits."""
        items: list[_Item] = []
        size = len(_HEAD) + len(_TAIL)
        budget = MAX_BODY_BYTES - _BODY_MARGIN
        while self._buffer and len(items) < self.batch_size:
            nxt = self._buffer[0]
            if items and size + len(nxt.data) + 1 > budget:
                break
            size += len(nxt.data) + 1
            items.append(self._buffer.popleft())
        return items

    def _send_batch(self) -> Generator[_Action, Any, _Outcome]:
        with self.lock:
            items = self._take_batch()
            self._inflight = items
        outcome, remaining = yield from self._deliver(items)
        if outcome == "ok":
            with self.lock:
                self._inflight = []
                self.notify()
        elif self.spool is not None:
            self._move_to_spool(remaining)
        else:
            with self.lock:
                self._inflight = []
                if outcome == "refused":
                    self._dropped += len(remaining)
                else:  # keep them; try again when the service is back
                    self._buffer.extendleft(reversed(remaining))
                self.notify()
            if outcome == "refused":
                self._report(
                    DeliveryError(
                        "dropped",
                        f"{len(remaining)} event(s) dropped: the service refused the client "
                        "and no spool_path is configured",
                        event_ids=[item.event_id for item in remaining],
                    )
                )
        return outcome

    def _move_to_spool(self, remaining: list[_Item]) -> None:
        """Write ``remaining`` and everything queued to the spool (keeping them visible to
        flush waiters until they are on disk)."""
        assert self.spool is not None
        with self.lock:
            self._inflight = remaining + list(self._buffer)
            self._buffer.clear()
            moving = list(self._inflight)
        count = self.spool.append(moving)
        with self.lock:
            self._inflight = []
            self._spooled += count
            self.notify()
        if count:
            log.warning(
                "billing client: %d event(s) written to the spool %s", count, self.spool.path
            )

    def _evacuate(self, why: str) -> None:
        """Closing for good: spool what is left in memory, or drop it (reported)."""
        if self.spool is not None:
            self._move_to_spool(list(self._inflight))
            return
        with self.lock:
            lost = list(self._inflight) + list(self._buffer)
            self._inflight = []
            self._buffer.clear()
            self._dropped += len(lost)
            self.notify()
        if lost:
            self._report(
                DeliveryError(
                    "dropped",
                    f"{len(lost)} event(s) dropped: {why} and no spool_path is configured",
                    event_ids=[item.event_id for item in lost],
                )
            )

    def _replay_batch(self) -> Generator[_Action, Any, _Outcome]:
        assert self.spool is not None
        items, end, unreadable = self.spool.read_batch(
            self.batch_size, MAX_BODY_BYTES - _BODY_MARGIN
        )
        outcome: _Outcome = "ok"
        if items:
            outcome, _remaining = yield from self._deliver(items)
        if outcome != "ok":
            return outcome
        with self.lock:  # one step for flush waiters: spool position and counters
            self.spool.commit(end)
            self._replayed += len(items)
            self._dropped += unreadable
            self.notify()
        if unreadable:
            self._report(
                DeliveryError(
                    "spool_corrupt",
                    f"{unreadable} unreadable line(s) skipped in the spool {self.spool.path}",
                )
            )
        return outcome

    def _deliver(self, items: list[_Item]) -> Generator[_Action, Any, tuple[_Outcome, list[_Item]]]:
        """Post ``items`` until each is acknowledged or rejected.

        Returns ``("ok", [])``, or ``("unreachable" | "refused", events not yet acknowledged)``.
        """
        queue: list[list[_Item]] = [items]
        while queue:
            batch = queue.pop(0)
            body = _HEAD + b",".join(item.data for item in batch) + _TAIL
            attempt = 0
            while True:
                with self.lock:
                    self._requests += 1
                result = yield _Post(body)
                verdict = self._classify(result)
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
                    yield _Sleep(delay, self._aborted)
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
        verdict: _Verdict,
        rest: list[_Item],
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

    def _reject(self, items: list[_Item], verdict: _Verdict) -> None:
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
        """Log and pass to ``on_error`` (never raises; called without ``lock``)."""
        if error.kind == "spool_corrupt" or error.kind == "unreachable":
            log.warning("billing client: %s", error.message)
        else:
            log.error("billing client: %s", error.message)
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception:
                log.exception("billing client: the on_error callback raised")

    def _classify(self, result: object) -> _Verdict:
        if isinstance(result, BaseException):
            return _Verdict("retry", None, f"{type(result).__name__}: {result}".rstrip(": "))
        assert isinstance(result, httpx.Response)
        status = result.status_code
        try:
            detail: Any = result.json()
        except ValueError:
            detail = None
        if 200 <= status < 300:
            accepted = duplicates = 0
            if isinstance(detail, dict):
                accepted = _int(detail.get("accepted"))
                duplicates = _int(detail.get("duplicates"))
            return _Verdict("ok", status, "ok", detail, accepted=accepted, duplicates=duplicates)
        message = f"HTTP {status}" + _summary(detail)
        if status in (408, 429) or status >= 500:
            retry_after = _retry_after(result.headers.get("retry-after"))
            if retry_after is not None:
                retry_after = min(retry_after, self.max_retry_after_s)
            return _Verdict("retry", status, message, detail, retry_after=retry_after)
        if status in (401, 403, 404) or 300 <= status < 400 or status < 200:
            return _Verdict("refused", status, message, detail)
        if status == 413:
            return _Verdict("too_large", status, message, detail)
        if status in (409, 422) and isinstance(detail, dict):
            key = "conflicts" if status == 409 else "errors"
            entries = detail.get(key)
            indexes = frozenset(
                entry["index"]
                for entry in (entries if isinstance(entries, list) else [])
                if isinstance(entry, dict) and type(entry.get("index")) is int
            )
            return _Verdict("invalid", status, message, detail, indexes=indexes)
        return _Verdict("rejected", status, message, detail)


def _int(value: object) -> int:
    return value if type(value) is int else 0


def _summary(detail: object) -> str:
    """A short excerpt of an error answer, for messages."""
    if not isinstance(detail, dict):
        return ""
    for key in ("errors", "conflicts"):
        entries = detail.get(key)
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            first = entries[0]
            text = first.get("message") or f"event_id {first.get('event_id')} conflicts"
            more = f" (+{len(entries) - 1} more)" if len(entries) > 1 else ""
            return f": {first.get('path', key)}: {text}{more}"
    error = detail.get("error")
    return f": {error}" if isinstance(error, str) else ""


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``None``."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# -- the two clients: thin drivers around the engine ---------------------------------------------

_TransportT = TypeVar("_TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)
_R = TypeVar("_R")


class _ClientBase(Generic[_TransportT]):
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
        spool_path: str | os.PathLike[str] | None = None,
        max_retries: int = 5,
        timeout_s: float = 10.0,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        max_retry_after_s: float = 60.0,
        on_error: OnError | None = None,
        transport: _TransportT | None = None,
    ) -> None:
        self._engine = _Engine(
            url,
            token=token,
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            max_buffer=max_buffer,
            spool_path=spool_path,
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

    def stats(self) -> ClientStats:
        """A snapshot of the counters."""
        return self._engine.stats()

    @property
    def sent(self) -> int:
        """Events given to :meth:`send`."""
        return self.stats().sent

    @property
    def acknowledged(self) -> int:
        """Events the service answered for (accepted + duplicates)."""
        return self.stats().acknowledged

    @property
    def spooled(self) -> int:
        """Events written to the spool file."""
        return self.stats().spooled

    @property
    def rejected(self) -> int:
        """Events the service rejected (``4xx``), dropped."""
        return self.stats().rejected


class BillingClient(_ClientBase[httpx.BaseTransport]):
    """Posts lifecycle events to the billing service from a background thread.

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:8000``.
        token: a bearer token with the ``ingest`` (or ``admin``) role; ``None`` for a service
            without tokens.
        batch_size: events per post, 1-1000.
        flush_interval_s: seconds an event may wait for its batch to fill before it is posted.
        max_buffer: events held in memory at most; past it, new events go to the spool (or are
            dropped and reported when there is no spool).
        spool_path: the JSON-lines spool file (created when needed), or ``None`` for none.
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

    def _drive(self, steps: Generator[_Action, object, _R]) -> _R:
        """Run an engine generator to its end on this thread; returns what it returns."""
        answer: object = None
        try:
            while True:
                answer = self._perform(steps.send(answer))
        except StopIteration as stop:
            value: _R = stop.value
            return value
        finally:
            steps.close()

    def _perform(self, action: _Action) -> object:
        if isinstance(action, _Post):
            engine = self._engine
            try:
                return self._http.post(engine.endpoint, content=action.body, headers=engine.headers)
            except Exception as error:  # network errors, timeouts, protocol errors
                return error
        with self._cond:
            self._cond.wait_for(action.until, action.seconds)
        return None


class AsyncBillingClient(_ClientBase[httpx.AsyncBaseTransport]):
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

    def send(self, event: Mapping[str, Any]) -> str:
        """Queue one event; see :meth:`BillingClient.send`. Call it from the event loop."""
        self._start()
        return self._engine.send(event)

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

    def _start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()  # RuntimeError outside a running loop
        self._http = httpx.AsyncClient(timeout=self._engine.timeout_s, transport=self._transport)
        self._task = self._loop.create_task(self._drive(self._engine.run()), name="billing-client")

    def _notify(self) -> None:
        """Wake every waiter; the engine calls it after each change, maybe from another thread."""
        loop = self._loop
        if loop is None:
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

    async def _drive(self, steps: Generator[_Action, object, _R]) -> _R:
        """Run an engine generator to its end on the loop; returns what it returns."""
        answer: object = None
        try:
            while True:
                answer = await self._perform(steps.send(answer))
        except StopIteration as stop:
            value: _R = stop.value
            return value
        finally:
            steps.close()

    async def _perform(self, action: _Action) -> object:
        engine = self._engine
        if isinstance(action, _Post):
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
