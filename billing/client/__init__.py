"""The client a Python gateway embeds to post lifecycle events to the billing service.

Two flavours with the same behaviour:

* :class:`BillingClient` - synchronous API, delivery in a background thread;
* :class:`AsyncBillingClient` - asyncio API, delivery in a background task.

Typical use::

    with BillingClient("http://billing:8000", token=INGEST_TOKEN) as c:
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
  :class:`billing.client.spool.Spool` for how it is rotated safely). A spool left by an earlier
  process is replayed at start. The spool is on by default, in the per-user cache directory
  (``$XDG_CACHE_HOME/billing/spool/``, one file per process and service: see
  :func:`billing.client.spool.claim_default_spool`); ``spool_path=PATH`` puts it elsewhere.
  Its size is bounded (``max_spool_bytes``, 256 MiB by default): past it, events are dropped
  and reported.
  With ``spool_path=None`` (off), overflow events are dropped and reported, and events that
  cannot be delivered stay in memory and are tried again later (dropped at ``close()``).

Before it calls the upstream, a gateway may reserve the call's estimate against the budgets:
``authorize(request_id=..., api_key_id=..., model=..., estimate={"input_tokens": N,
"max_output_tokens": M})`` (or ``{"amount_usd": "0.05"}``) returns the typed decision
(:class:`Authorization`), ``release(request_id)`` gives a hold back (:class:`Release`; CONTRACT
"Authorizations and holds (v3)"). One request each, no retry; anything but a 200 raises a
:class:`ServiceError`: :class:`AuthorizationUnavailable` when the service could not decide (503,
no answer), :class:`AuthorizationRejected` when it refused the request (``authorizations.py``
reads the answers).

No silent loss: every event rejected, dropped or given up is logged at WARNING on the
``billing.client`` logger (and passed to ``on_error``). The library adds no handler of its own,
so with no logging configured Python's last-resort handler prints these lines on standard
error; an application that configures logging routes them as it likes.

Counters (:meth:`BillingClient.stats`): ``sent`` (events given to ``send``), ``acknowledged``
(``accepted`` + ``duplicates`` as the service answered), ``spooled`` (events written to the
spool), ``replayed`` (events read back from the spool and acknowledged), ``rejected`` (dropped
on a ``4xx``), ``dropped`` (lost on the client side), ``requests`` and ``retries`` (HTTP posts).

How it is built: every decision (batching, retries and backoff, the spool, reading the answers)
is made once, in the sans-IO engine (``engine.py`` on ``delivery.py``), as generators that yield
"post this body" / "sleep this long" actions; the two clients are thin drivers that perform them
with ``httpx.Client`` on a thread (``sync.py``) or ``httpx.AsyncClient`` on the event loop
(``aio.py``). ``wire.py`` holds the limits of a post and reads the answers; ``spool.py`` the file.
"""

from __future__ import annotations

from billing.client.aio import AsyncBillingClient
from billing.client.authorizations import Authorization, Release
from billing.client.errors import (
    AuthorizationRejected,
    AuthorizationUnavailable,
    ClientClosedError,
    ClientStats,
    DeliveryError,
    ServiceError,
)
from billing.client.spool import DEFAULT_MAX_SPOOL_BYTES, DEFAULT_SPOOL, default_spool_dir
from billing.client.sync import BillingClient
from billing.client.wire import MAX_BATCH_EVENTS, MAX_BODY_BYTES, new_event_id, utc_now

__all__ = [
    "DEFAULT_MAX_SPOOL_BYTES",
    "DEFAULT_SPOOL",
    "MAX_BATCH_EVENTS",
    "MAX_BODY_BYTES",
    "AsyncBillingClient",
    "Authorization",
    "AuthorizationRejected",
    "AuthorizationUnavailable",
    "BillingClient",
    "ClientClosedError",
    "ClientStats",
    "DeliveryError",
    "Release",
    "ServiceError",
    "default_spool_dir",
    "new_event_id",
    "utc_now",
]
