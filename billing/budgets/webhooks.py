"""Delivering the budget alerts' webhooks from the outbox (CONTRACT "Budgets and alerts (v2)").

Standard Webhooks: ``POST url`` with the alert's stored JSON body and the headers
``webhook-id`` (the alert id: the same on every retry), ``webhook-timestamp`` (Unix seconds of
this attempt) and ``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of
``"{id}.{timestamp}.{body}"`` keyed with the base64-decoded part of the budget's ``whsec_…``
secret; the ``standardwebhooks`` package's ``Webhook(secret).verify`` accepts it).

The worker (``DeliveryWorker``, started by ``billing serve``) claims due rows with a lease
(``BudgetsRepository.claim_due``: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas share
the work and a crashed worker's rows come back when the lease ends), posts them with httpx (10 s
timeout), and records the outcome: a 2xx is ``delivered``; anything else is retried with
exponential backoff and full jitter until ``webhook_retry_s`` (24 h) after the alert, then
``failed``. Delivery is at least once. It runs on the server's event loop with the database work
in threads, never on the ingest path. A URL's credentials, path and query are never logged (only
its scheme, host and port).
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
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker

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


class DeliveryWorker:
    """Claims, posts and records the outbox's due webhooks; ``run`` loops until cancelled."""

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

    def _claim(self) -> list[Claimed]:
        now = datetime.now(UTC)
        lease = timedelta(seconds=self.settings.webhook_timeout_s + LEASE_MARGIN_S)
        with write_transaction(self.sessions) as session:
            return repository(session).claim_due(session, now, now + lease, self.owner, CLAIM_BATCH)

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
        timestamp = int(datetime.now(UTC).timestamp())
        status: int | None = None
        error: str | None = None
        try:
            response = await client.post(
                item.url,
                content=item.body.encode(),
                headers=headers_for(item.secret, item.alert_id, timestamp, item.body),
            )
            status = response.status_code
            if not 200 <= status < 300:
                error = f"answered {status}"
        except httpx.TimeoutException:
            error = "timed out"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        if error is not None:
            log.info(
                "webhook %s to %s not delivered (%s); retrying later",
                item.alert_id,
                safe_url(item.url),
                error,
            )
        await asyncio.to_thread(self._record, item, status, error)

    async def deliver_once(self, client: httpx.AsyncClient) -> int:
        """One round: claim the due webhooks and post them concurrently; returns how many."""
        claimed = await asyncio.to_thread(self._claim)
        if claimed:
            await asyncio.gather(*(self._post(client, item) for item in claimed))
        return len(claimed)

    async def run(self) -> None:
        """Deliver until cancelled; a failed round (the database away) is logged and retried."""
        timeout = httpx.Timeout(self.settings.webhook_timeout_s)
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, transport=self.transport
        ) as client:
            while True:
                try:
                    busy = await self.deliver_once(client)
                except Exception as error:  # the database away: try again next round
                    log.warning("webhook delivery round failed (%s)", type(error).__name__)
                    busy = 0
                if busy < CLAIM_BATCH:
                    await asyncio.sleep(self.settings.webhook_poll_s)
