"""The sans-IO delivery engine both clients share: the queue, ``flush`` and the worker loop.

Every decision (batching, retries and backoff, the spool, reading the answers) is made here, as
generators that yield :class:`~billing.client.delivery.Post` and
:class:`~billing.client.delivery.Sleep` actions and receive their results; the clients only
perform them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator, Mapping
from datetime import datetime
from typing import Any

import orjson

from billing.client.delivery import Action, Delivery, Outcome, Sleep, log
from billing.client.errors import ClientClosedError, ClientStats, DeliveryError
from billing.client.spool import Item
from billing.client.wire import (
    BODY_MARGIN,
    HEAD,
    MAX_BODY_BYTES,
    TAIL,
    new_event_id,
    rfc3339,
    utc_now,
)


class Engine(Delivery):
    """State and delivery logic shared by both clients, with no I/O of its own but the spool.

    The decisions live in generators that yield actions and receive their results: :meth:`run`,
    the background worker, and :meth:`flush`. A driver (:meth:`BillingClient._drive` on threads,
    :meth:`AsyncBillingClient._drive` on asyncio) performs the actions.
    """

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
            data["occurred_at"] = rfc3339(occurred_at)
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
            item = Item(self._seq, event_id, payload, time.monotonic())
            if len(self._buffer) + len(self._inflight) < self.max_buffer:
                self._buffer.append(item)
                if len(self._buffer) == 1 or len(self._buffer) >= self.batch_size:
                    self.wake = True
                    self.notify()
                return event_id
            # the buffer is full: to disk (under the lock, so a flush never misses an event in
            # between), as far as the spool's bound allows
            if self.spool is not None and self.spool.append([item]):
                self._spooled += 1
                self.wake = True
                self.notify()
                return event_id
            self._dropped += 1
            self.notify()
        where = "no spool_path is configured" if self.spool is None else "the spool is full"
        self._report(
            DeliveryError(
                "dropped",
                f"the in-memory buffer is full ({self.max_buffer} events) and {where}: "
                "event dropped",
                event_ids=[event_id],
            )
        )
        return event_id

    def flush(self, timeout: float | None) -> Generator[Action, Any, bool]:
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
                yield Sleep(wait, lambda: result() is not None)
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

    def abandon(self) -> int:
        """The client was left open and its worker will not deliver any more (the interpreter
        is exiting, or an asyncio client's loop is gone): take no more events, and write what
        is still queued to the spool synchronously (or drop it, reported), with a WARNING that
        gives the count. Returns that count. Events a still-running worker posts meanwhile may
        be spooled too; the service answers them as duplicates when the spool is replayed."""
        with self.lock:
            self.closing = self.abort = True
            self.wake = True
            self.notify()
            count = len(self._buffer) + len(self._inflight)
        if count:
            log.warning(
                "billing client: the client was not closed: %d event(s) still queued", count
            )
            self._evacuate("the client was not closed")
        return count

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

    def _woken(self) -> bool:
        return self.abort or self.wake

    def run(self) -> Generator[Action, Any, None]:
        """The worker: yields actions until the client is closed (and drained) or aborted."""
        try:
            yield from self._work()
        except Exception:  # pragma: no cover - a bug; make flush() return instead of hanging
            log.exception("billing client: the delivery worker failed")
        finally:
            if self.spool is not None:
                self.spool.release()
            with self.lock:
                self.worker_done = True
                self.notify()

    def _work(self) -> Generator[Action, Any, None]:
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
                yield Sleep(max(wait, 0.0), self._woken)
                continue
            spool_pending = self.spool is not None and self.spool.pending()
            outcome: Outcome
            if spool_pending and (prefer_spool or not ready):
                prefer_spool = False
                outcome = yield from self._replay_batch()
            elif ready:
                prefer_spool = True
                outcome = yield from self._send_batch()
            else:
                if closing:
                    return
                yield Sleep(None if due is None else max(due - now, 0.0), self._woken)
                continue
            if outcome == "ok":
                down_delay = 0.0
            else:
                down_delay = min(30.0, max(1.0, down_delay * 2))
                down_until = time.monotonic() + down_delay * random.uniform(0.5, 1.0)

    def _take_batch(self) -> list[Item]:
        """With ``lock`` held: the oldest queued events, within the count and size limits."""
        items: list[Item] = []
        size = len(HEAD) + len(TAIL)
        budget = MAX_BODY_BYTES - BODY_MARGIN
        while self._buffer and len(items) < self.batch_size:
            nxt = self._buffer[0]
            if items and size + len(nxt.data) + 1 > budget:
                break
            size += len(nxt.data) + 1
            items.append(self._buffer.popleft())
        return items

    def _send_batch(self) -> Generator[Action, Any, Outcome]:
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

    def _move_to_spool(self, remaining: list[Item]) -> None:
        """Write ``remaining`` and everything queued to the spool (keeping them visible to
        flush waiters until they are on disk)."""
        assert self.spool is not None
        with self.lock:
            self._inflight = remaining + list(self._buffer)
            self._buffer.clear()
            moving = list(self._inflight)
        count = self.spool.append(moving)
        lost = moving[count:]
        with self.lock:
            self._inflight = []
            self._spooled += count
            self._dropped += len(lost)
            self.notify()
        if count:
            log.warning(
                "billing client: %d event(s) written to the spool %s", count, self.spool.path
            )
        if lost:
            self._report(
                DeliveryError(
                    "dropped",
                    f"{len(lost)} event(s) dropped: the spool {self.spool.path} is full "
                    f"({self.spool.max_bytes} bytes, max_spool_bytes)",
                    event_ids=[item.event_id for item in lost],
                )
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

    def _replay_batch(self) -> Generator[Action, Any, Outcome]:
        assert self.spool is not None
        items, end, unreadable = self.spool.read_batch(
            self.batch_size, MAX_BODY_BYTES - BODY_MARGIN
        )
        outcome: Outcome = "ok"
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
