"""Delivering the budget alerts' webhooks from the outbox (CONTRACT "Budgets and alerts (v2)").

Standard Webhooks: ``POST url`` with the alert's stored JSON body and the headers
``webhook-id`` (the alert id: the same on every retry), ``webhook-timestamp`` (Unix seconds of
this attempt) and ``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of
``"{id}.{timestamp}.{body}"`` keyed with the base64-decoded part of the budget's ``whsec_…``
secret; the ``standardwebhooks`` package's ``Webhook(secret).verify`` accepts it).

The worker (``DeliveryWorker``, started by ``billing serve``) claims due rows with a lease
(``BudgetsRepository.claim_due``: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas share
the work and a crashed worker's rows come back when the lease ends), posts each in its own task
(up to ``webhook_concurrency`` at once) with httpx within one deadline for the whole attempt
(``webhook_timeout_s``: resolving, connecting, sending and reading), reads at most
``REPLY_LIMIT`` bytes of the reply and drops them, and records the outcome: a 2xx is
``delivered``; anything else (a status, a timeout, a refused destination, an invalid URL, any
error) is a counted attempt, retried with exponential backoff and full jitter until
``webhook_retry_s`` (24 h) after the alert, then ``failed``; ``last_error`` is a fixed category.
Every connection goes through the destination policy (``billing.destinations``: the addresses a
name resolves to are checked, and the address checked is the one connected to). Delivery is at
least once. It runs on the server's event loop with the database work in threads, never on the
ingest path. A URL's credentials, path and query are never logged (only its scheme, host and
port).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import random
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import httpcore
import httpx
from sqlalchemy.orm import Session, sessionmaker

from billing import destinations
from billing.budgets.repository import repository
from billing.budgets.rows import Claimed
from billing.settings import Settings
from billing.storage.db import write_transaction

log = logging.getLogger("billing.webhooks")

#: Rows claimed per round; a claim holds for the delivery's timeout and this much more (a
#: worker that died holding one leaves it to another that long after).
CLAIM_BATCH = 50
LEASE_MARGIN_S = 5.0
#: The first retry's pause and the longest pause, seconds (exponential between them, jittered).
FIRST_RETRY_S = 1.0
MAX_RETRY_PAUSE_S = 3600.0


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``
    keyed with the base64 part of ``secret`` (``whsec_…``)."""
    key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    mac = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers_for(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def safe_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what a log line may name (no credentials, path or
    query)."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}"
    except ValueError:
        return "(a webhook URL)"


def retry_pause_s(attempts: int, rng: random.Random | None = None) -> float:
    """The pause before the next try after ``attempts`` failed ones: full jitter over
    ``FIRST_RETRY_S * 2**(attempts-1)``, at most ``MAX_RETRY_PAUSE_S``, at least half of it."""
    ceiling = min(MAX_RETRY_PAUSE_S, FIRST_RETRY_S * 2 ** max(attempts - 1, 0))
    return (rng or random).uniform(ceiling / 2, ceiling)


class _RedactUrls(logging.Filter):
    """httpx logs each request's URL at INFO: keep only its scheme, host and port (a webhook
    URL's credentials and query never reach a log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(map(_is_url, record.args)):
            record.args = tuple(safe_url(str(a)) if _is_url(a) else a for a in record.args)
        elif not record.args and isinstance(record.msg, str) and "://" in record.msg:
            # another filter (an installed SDK's, e.g. LiteLLM's on "httpx") formatted it first
            record.msg = _URL_TEXT.sub(lambda m: safe_url(m.group(0)), record.msg)
        return True


#: A URL in a formatted log line.
_URL_TEXT = re.compile(r"https?://[^\s\"'<>]+")


def _is_url(arg: object) -> bool:
    """An ``httpx.URL``, or its text (another filter, e.g. an installed SDK's, may have
    turned it into a string before this one runs)."""
    return isinstance(arg, httpx.URL) or (
        isinstance(arg, str) and arg.startswith(("http://", "https://"))
    )


def _redact_httpx_logs() -> None:
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, _RedactUrls) for f in logger.filters):
        logger.addFilter(_RedactUrls())


#: The most bytes of a reply read (then the connection is closed; the reply is never kept).
REPLY_LIMIT = 64 * 1024
#: What ``last_error`` (and ``GET /v1/alerts``) says of a failed attempt: a fixed category,
#: never the receiver's response or the network's details.
TIMED_OUT = "timed out"
REFUSED = "refused by the destination policy"
INVALID_URL = "invalid URL"
UNREACHABLE = "connection failed"
FAILED = "delivery failed"
#: The longest pause of the worker's loop after failed rounds (the database away), seconds.
MAX_OUTAGE_PAUSE_S = 30.0


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses the destination policy allows:
    the host's addresses are resolved and checked (``billing.destinations.checked_addresses``)
    and the connection goes to the address checked (a name that resolves anew to a private
    address between the check and the connection is never reached)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self.inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        [address, *_] = await destinations.checked_addresses(host, port)
        return await self.inner.connect_tcp(
            address, port, timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise destinations.RefusedDestination("must not be a Unix socket")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def guarded_transport() -> httpx.AsyncHTTPTransport:
    """An httpx transport that takes no proxy from the environment and connects through
    ``_GuardedBackend``."""
    transport = httpx.AsyncHTTPTransport(trust_env=False, retries=0)
    pool = transport._pool  # httpx exposes no network_backend argument
    pool._network_backend = _GuardedBackend(pool._network_backend)
    return transport


async def _attempt(
    client: httpx.AsyncClient, item: Claimed, deadline_s: float
) -> tuple[int | None, str | None]:
    """Post ``item`` once within ``deadline_s`` for the whole attempt (resolving, connecting,
    sending, reading), reading at most ``REPLY_LIMIT`` bytes of the reply; its status and error
    category (every failure is one)."""
    timestamp = int(datetime.now(UTC).timestamp())
    try:
        async with asyncio.timeout(deadline_s):
            async with client.stream(
                "POST",
                item.url,
                content=item.body.encode(),
                headers=headers_for(item.secret, item.alert_id, timestamp, item.body),
            ) as response:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= REPLY_LIMIT:
                        break
                status = response.status_code
    except (TimeoutError, httpx.TimeoutException):
        return None, TIMED_OUT
    except destinations.RefusedDestination:
        return None, REFUSED
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError):  # UnicodeError too
        return None, INVALID_URL
    except (httpx.HTTPError, OSError):
        return None, UNREACHABLE
    except Exception as error:  # whatever else a library raises for a hostile destination
        log.warning("webhook %s: %s while posting", item.alert_id, type(error).__name__)
        return None, FAILED
    return status, None if 200 <= status < 300 else f"answered {status}"


class _Outage:
    """The loop's failed rounds in a row: the pause before the next (doubling up to
    ``MAX_OUTAGE_PAUSE_S``) and which of them are logged (the 1st, 2nd, 4th, 8th, …)."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self.failures = 0

    def failed(self, error: Exception) -> None:
        self.failures += 1
        if self.failures & (self.failures - 1) == 0:
            log.warning(
                "webhook delivery round failed (%s; %d in a row)",
                type(error).__name__,
                self.failures,
            )

    def succeeded(self) -> None:
        if self.failures:
            log.warning("webhook delivery resumed after %d failed rounds", self.failures)
        self.failures = 0

    def pause_s(self) -> float:
        return min(MAX_OUTAGE_PAUSE_S, self.poll_s * float(2 ** min(self.failures, 30)))


class DeliveryWorker:
    """Claims, posts and records the outbox's due webhooks; ``run`` loops until cancelled, with
    up to ``webhook_concurrency`` deliveries in flight."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.owner = uuid.uuid4().hex
        self.transport = transport
        _redact_httpx_logs()

    def client(self) -> httpx.AsyncClient:
        """The delivery's HTTP client: no redirects, no proxy, the guarded transport."""
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.settings.webhook_timeout_s),
            follow_redirects=False,
            trust_env=False,
            transport=self.transport or guarded_transport(),
        )

    def _claim(self, limit: int = CLAIM_BATCH) -> list[Claimed]:
        now = datetime.now(UTC)
        lease = timedelta(seconds=self.settings.webhook_timeout_s + LEASE_MARGIN_S)
        with write_transaction(self.sessions) as session:
            return repository(session).claim_due(session, now, now + lease, self.owner, limit)

    def _record(self, item: Claimed, status: int | None, error: str | None) -> None:
        now = datetime.now(UTC)
        attempts = item.attempts + 1
        values: dict[str, object] = {
            "attempts": attempts,
            "last_status": status,
            "last_error": error,
        }
        if status is not None and 200 <= status < 300:
            values.update(state="delivered", delivered_at=now, last_error=None)
        else:
            due = now + timedelta(seconds=retry_pause_s(attempts))
            if due - item.created_at > timedelta(seconds=self.settings.webhook_retry_s):
                values["state"] = "failed"
            else:
                values["next_attempt_at"] = due
        with write_transaction(self.sessions) as session:
            repository(session).record_attempt(session, item.alert_id, self.owner, values)

    async def _post(self, client: httpx.AsyncClient, item: Claimed) -> None:
        with destinations.allowing_private(self.settings.webhook_allow_private):
            status, error = await _attempt(client, item, self.settings.webhook_timeout_s)
        if error is not None:
            log.info(
                "webhook %s to %s not delivered (%s); retrying later",
                item.alert_id,
                safe_url(item.url),
                error,
            )
        await asyncio.to_thread(self._record, item, status, error)

    async def _post_logged(self, client: httpx.AsyncClient, item: Claimed) -> None:
        try:
            await self._post(client, item)
        except Exception as error:  # the database away: the lease ends and it comes back
            log.warning(
                "webhook %s: outcome not recorded (%s)", item.alert_id, type(error).__name__
            )

    async def deliver_once(self, client: httpx.AsyncClient) -> int:
        """One round: claim the due webhooks and post them concurrently; returns how many."""
        claimed = await asyncio.to_thread(self._claim)
        if claimed:
            await asyncio.gather(*(self._post(client, item) for item in claimed))
        return len(claimed)

    async def run(self) -> None:
        """Deliver until cancelled: claim as many due webhooks as there are free places in the
        pool, each posted in its own task (a slow receiver holds one place for at most
        ``webhook_timeout_s``); failed rounds (the database away) back off, and are logged
        less and less often."""
        outage = _Outage(self.settings.webhook_poll_s)
        in_flight: set[asyncio.Task[None]] = set()
        async with self.client() as client:
            try:
                while True:
                    free = self.settings.webhook_concurrency - len(in_flight)
                    claimed: list[Claimed] = []
                    if free > 0:
                        try:
                            claimed = await asyncio.to_thread(self._claim, min(free, CLAIM_BATCH))
                            outage.succeeded()
                        except Exception as error:  # the database away: try again later
                            outage.failed(error)
                            await asyncio.sleep(outage.pause_s())
                            continue
                    for item in claimed:
                        task = asyncio.create_task(self._post_logged(client, item))
                        in_flight.add(task)
                        task.add_done_callback(in_flight.discard)
                    if len(claimed) < free:
                        await asyncio.sleep(self.settings.webhook_poll_s)
                    elif in_flight:  # the pool is full: wait for a place
                        await asyncio.wait(
                            in_flight,
                            timeout=self.settings.webhook_poll_s,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
            finally:
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)
