"""Play a recorded SSE stream to a running billing service as a gateway would (``billing replay``).

The recorded response body is fed through the protocol's tap (:func:`billing.taps.open_tap`) in
small chunks, as if it came off the upstream socket, and the lifecycle events a gateway would
emit are posted through :class:`billing.client.BillingClient`:

1. ``stream.started`` (``model``: the one given, else the model the stream reports, else
   ``"unknown"``; ``input_tokens``: the gateway's own count of the input, when given);
2. ``stream.tokens`` progress every ``progress_every`` generated tokens (cumulative generated
   and delivered counts, by the tap's count; by default every 16 tokens, or every eighth of the
   stream when it is longer, so a replay stays a handful of events);
3. with ``disconnect_after=N``: a ``stream.client_disconnected`` once the tap has counted ``N``
   output tokens; from then on ``delivered`` stays ``N`` while the upstream goes on generating to
   the end of the file (the tokens the provider bills but the client never saw);
4. a last ``stream.tokens`` with the final counts (without a disconnect, delivered = generated:
   a stream that ends normally delivered everything);
5. the tap's closing events: ``stream.usage`` (``source: upstream`` when the stream carried a
   final usage, else the tap's estimate, which leaves the input out when the stream did not
   report it: the service then bills ``stream.started.input_tokens``) and ``stream.failed``
   when the stream carried an error.

A ``.json`` file is a NON-streaming response body (the protocol's response object, CONTRACT
"Non-streaming calls, hosted-tool fees, provider-reported cost"): it is read whole
(:meth:`billing.taps.Tap.read_json`) and posted as ``stream.started``, one ``stream.tokens``
(delivered = the output) and the closing events.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx

from billing.client import BillingClient, DeliveryError, new_event_id
from billing.taps import Tap, open_tap

__all__ = ["DEFAULT_URL", "ReplayError", "ReplayResult", "fetch_call", "replay"]

#: Where ``billing serve`` listens by default.
DEFAULT_URL = "http://127.0.0.1:8000"


class ReplayError(Exception):
    """The replay could not be done; ``str()`` is one line saying why (for the command line)."""


class ReplayResult(NamedTuple):
    """The call's ``request_id`` and the events posted for it, in the order posted (each a
    complete contract event, envelope included)."""

    request_id: str
    events: list[dict[str, Any]]


class _Clock:
    """Strictly increasing RFC 3339 UTC timestamps starting now (1 ms apart at least), so the
    events' ``occurred_at`` order is the order they were posted in."""

    def __init__(self) -> None:
        self._last: datetime | None = None

    def __call__(self) -> str:
        now = datetime.now(UTC)
        if self._last is not None and now <= self._last:
            now = self._last + timedelta(milliseconds=1)
        self._last = now
        return now.isoformat(timespec="microseconds").replace("+00:00", "Z")


def replay(
    path: str | os.PathLike[str],
    *,
    protocol: str,
    api_key_id: str,
    url: str = DEFAULT_URL,
    token: str | None = None,
    model: str | None = None,
    request_id: str | None = None,
    disconnect_after: int | None = None,
    input_tokens: int | None = None,
    chunk_size: int = 64,
    progress_every: int | None = None,
    timeout_s: float = 30.0,
    max_retries: int = 2,
    client: BillingClient | None = None,
) -> ReplayResult:
    """Play the recorded stream at ``path`` to the service at ``url``; see the module docstring.

    Args:
        path: a recorded SSE response body (bytes as sent by the upstream).
        protocol: one of :data:`billing.taps.PROTOCOLS`.
        api_key_id: the gateway customer's key id for ``stream.started``.
        url, token: the service and a bearer token allowed to ingest (``None``: no token).
        model: the model for ``stream.started``; default: what the stream reports, else
            ``"unknown"``.
        request_id: the call's id; default ``replay-<uuid4 hex>``.
        disconnect_after: the client leaves once this many output tokens were delivered (tap's
            count); ``None``: the client stays to the end.
        input_tokens: the gateway's own count of the input tokens, sent as
            ``stream.started.input_tokens`` (``None``: not sent).
        chunk_size: bytes fed to the tap at a time (>= 1).
        progress_every: generated tokens between two ``stream.tokens`` progress events (>= 1);
            default ``max(16, total / 8)``.
        timeout_s: how long to wait for the service to acknowledge everything, seconds.
        max_retries: retries of a failed post before the service counts as unreachable.
        client: post through this client (flushed, not closed) instead of a new one.

    Returns:
        :class:`ReplayResult`: the request id and the events posted.

    Raises:
        ReplayError: the file cannot be read, the protocol is unknown, an argument is out of
            range, the service is unreachable or rejected an event.
    """
    try:
        open_tap(protocol)
    except ValueError as error:
        raise ReplayError(str(error)) from None
    source = Path(path)
    try:
        body = source.read_bytes()
    except OSError as error:
        raise ReplayError(f"cannot read {source}: {error.strerror or error}") from None
    if disconnect_after is not None and disconnect_after < 0:
        raise ReplayError("--disconnect-after must be a token count >= 0")
    if input_tokens is not None and input_tokens < 0:
        raise ReplayError("--input-tokens must be a token count >= 0")
    if chunk_size < 1 or (progress_every is not None and progress_every < 1):
        raise ReplayError("chunk_size and progress_every must be >= 1")
    request_id = request_id or f"replay-{uuid.uuid4().hex}"
    whole = source.suffix.lower() == ".json"
    if whole and disconnect_after is not None:
        raise ReplayError("--disconnect-after applies to a stream, not to a .json response")
    scout = open_tap(protocol)  # a first reading, for the model and the stream's length
    if not whole:
        scout.feed(body)
    _read(scout, body, whole)
    if (scout.model, scout.usage, scout.error, scout.output_tokens) == (None, None, None, 0):
        # Nothing of the protocol was read: posting would bill an `unknown`, unpriced call.
        what = "response" if whole else "stream event"
        raise ReplayError(
            f"{source} holds no {protocol} {what} that can be read "
            f"({scout.malformed_events} unreadable); check the file and --protocol"
        )
    if model is None:
        model = scout.model or "unknown"
    if progress_every is None:
        progress_every = max(16, -(-scout.output_tokens // 8))

    problems: list[DeliveryError] = []
    own_client = client is None
    if client is None:
        try:
            client = BillingClient(
                url,
                token=token,
                batch_size=100,
                flush_interval_s=0.05,
                max_retries=max_retries,
                backoff_base_s=0.1,
                timeout_s=min(timeout_s, 10.0),
                on_error=problems.append,
                # one shot: what was not delivered is the command's error (non-zero exit), and
                # the recorded stream can be played again; no spool to replay it later
                spool_path=None,
            )
        except ValueError as error:
            raise ReplayError(f"--url: {error}") from None
    try:
        events = _play(
            client.send,
            body,
            protocol=protocol,
            api_key_id=api_key_id,
            model=model,
            request_id=request_id,
            disconnect_after=disconnect_after,
            input_tokens=input_tokens,
            chunk_size=len(body) + 1 if whole else chunk_size,
            progress_every=progress_every,
            whole=whole,
        )
        delivered = client.flush(timeout_s)
    finally:
        if own_client:
            client.close(timeout=0.1)
    if not delivered:
        raise ReplayError(_why(problems, url))
    return ReplayResult(request_id, events)


def _play(
    send: Callable[[dict[str, Any]], str],
    body: bytes,
    *,
    protocol: str,
    api_key_id: str,
    model: str,
    request_id: str,
    disconnect_after: int | None,
    input_tokens: int | None,
    chunk_size: int,
    progress_every: int,
    whole: bool = False,
) -> list[dict[str, Any]]:
    clock = _Clock()
    events: list[dict[str, Any]] = []

    def post(payload: dict[str, Any]) -> None:
        event = {
            "event_id": new_event_id(),
            "request_id": request_id,
            "occurred_at": clock(),
            **payload,
        }
        send(event)
        events.append(event)

    started: dict[str, Any] = {
        "type": "stream.started",
        "api_key_id": api_key_id,
        "model": model,
        "protocol": protocol,
    }
    if input_tokens is not None:
        started["input_tokens"] = input_tokens
    post(started)
    tap = open_tap(protocol)
    reported = 0
    disconnected = False
    for start in range(0, 0 if whole else len(body), chunk_size):
        tap.feed(body[start : start + chunk_size])
        generated = tap.output_tokens
        if not disconnected and disconnect_after is not None and generated >= disconnect_after:
            post(
                {
                    "type": "stream.client_disconnected",
                    "output_tokens_delivered": disconnect_after,
                    "output_tokens_generated": generated,
                }
            )
            disconnected = True
            reported = generated
        elif generated - reported >= progress_every:
            post(
                {
                    "type": "stream.tokens",
                    "output_tokens_generated": generated,
                    # after a disconnect the upstream goes on; delivered stays where it was
                    "output_tokens_delivered": disconnect_after if disconnected else generated,
                }
            )
            reported = generated
    _read(tap, body, whole)
    generated = tap.output_tokens
    post(
        {
            "type": "stream.tokens",
            "output_tokens_generated": generated,
            "output_tokens_delivered": disconnect_after if disconnected else generated,
        }
    )
    for payload in tap.final_events():
        post(payload)
    return events


def _read(tap: Tap, body: bytes, whole: bool) -> None:
    """Read the rest of ``body`` (all of a ``whole`` response body) and close the tap."""
    if whole:
        tap.read_json(body)
    else:
        tap.close()


def _why(problems: list[DeliveryError], url: str) -> str:
    for problem in problems:
        if problem.kind == "rejected":
            return f"the billing service rejected the events: {problem.message}"
    for problem in problems:
        if problem.kind == "refused":
            return f"the billing service at {url} refused the client: {problem.message}"
    return f"cannot reach the billing service at {url} (is `billing serve` running?)"


def fetch_call(
    request_id: str, *, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = 30.0
) -> dict[str, Any]:
    """Run one reconciliation pass (``POST /v1/reconcile``), then return the call object
    (``GET /v1/calls/{request_id}``: the call's figures, its events and ledger entries).

    A call whose every attempt carries an upstream usage settles in that pass; others show
    provisional figures until ``settle_after``.

    Raises:
        ReplayError: the service is unreachable or answered with an error.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = url.rstrip("/")
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=timeout_s) as http:
            settled = http.post("/v1/reconcile", json={})
            if settled.status_code != 200:
                raise ReplayError(f"POST /v1/reconcile failed: {_answer(settled)}")
            answer = http.get(f"/v1/calls/{quote(request_id, safe='')}")
            if answer.status_code != 200:
                raise ReplayError(f"GET /v1/calls/{request_id} failed: {_answer(answer)}")
            call: dict[str, Any] = answer.json()
            return call
    except httpx.HTTPError as error:
        raise ReplayError(f"cannot reach the billing service at {base}: {error}") from None
    except ValueError as error:
        raise ReplayError(
            f"the billing service answered something that is not JSON: {error}"
        ) from None


def _answer(response: httpx.Response) -> str:
    text = " ".join(response.text.split())
    return f"HTTP {response.status_code} {text[:300]}".rstrip()
