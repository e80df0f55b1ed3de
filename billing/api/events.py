"""``POST /v1/events`` (CONTRACT "Ingest")."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from billing.api.state import AppState
from billing.auth.guard import allow
from billing.errors import (
    OUTCOME_UNKNOWN,
    BillingError,
    BodyTimeout,
    CommitOutcomeUnknown,
    EventConflict,
    TooLarge,
    Unavailable,
)
from billing.ingest.service import IngestResult, PreparedBatch, prepare_batch
from billing.ingest.validation import MAX_BODY_BYTES, parse_batch
from billing.ingest.writer import GroupWriter, new_writer
from billing.storage.db import is_unavailable

router = APIRouter()
log = logging.getLogger("billing.api")

#: The route answered by ``serve_ingest`` (see ``billing.api.app``'s middleware).
PATH = "/v1/events"

#: Bodies up to this size (some 300 events) are validated on the event loop: a thread hop costs
#: more than the work, and the work holds the GIL wherever it runs; larger ones in the thread
#: pool, so that a 1000-event batch does not stall the loop for the length of its validation.
INLINE_PARSE_BYTES = 64 * 1024

_writer_lock = threading.Lock()


class IngestReply(BaseModel):
    """``accepted`` + ``duplicates`` = the number of events sent."""

    accepted: int
    duplicates: int


async def read_body(request: Request, timeout_s: float, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refusing with 413 as soon as it passes ``limit`` bytes, and with 408
    (``BodyTimeout``) when it has not arrived in full within ``timeout_s`` seconds (a client that
    declares more than it sends must not hold a connection and its memory for ever)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"request body is {declared} bytes; the limit is {limit} (1 MiB)")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"request body is over the limit of {limit} bytes (1 MiB)")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not arrive in full within {timeout_s:g} s ({size} bytes "
            f"received{'' if declared is None else f' of the {declared} declared'}); "
            "send the whole body at once"
        ) from None
    return b"".join(chunks)


_allow_ingest = allow("ingest")


async def ingest_guard(request: Request) -> None:
    """``allow("ingest")`` as an async dependency: FastAPI runs a plain ``def`` dependency in the
    thread pool, two thread hops per post; the check is a cache lookup (it reads the token table
    at most once per cache period), so it runs on the event loop."""
    _allow_ingest(request)


ingest_guard.allowed_roles = _allow_ingest.allowed_roles  # type: ignore[attr-defined]


def writer_of(state: AppState) -> GroupWriter:
    """The app's group-commit writer (created on first use)."""
    writer: GroupWriter | None = getattr(state, "ingest_writer", None)
    if writer is None:
        with _writer_lock:
            writer = getattr(state, "ingest_writer", None)
            if writer is None:
                writer = new_writer(state.settings, state.sessions)
                state.ingest_writer = writer  # type: ignore[attr-defined]
    return writer


def prepare(body: bytes, now: datetime) -> PreparedBatch:
    """Validate and hash a body (CPU only): 413/422/409-in-batch are raised here."""
    return prepare_batch(parse_batch(body, now), now)


def _count_rejected(state: AppState, error: BillingError) -> None:
    reason = {409: "conflict", 413: "too_large", 422: "invalid"}.get(error.status)
    if reason is not None:
        count = len(error.conflicts) if isinstance(error, EventConflict) else 1
        state.metrics.events_rejected.labels(reason).inc(count)


def _count_stored(state: AppState, result: IngestResult) -> None:
    state.metrics.events_accepted.inc(result.accepted)
    state.metrics.events_duplicate.inc(result.duplicates)


@router.post(
    "/v1/events",
    response_model=IngestReply,
    summary="Ingest a batch of 1–1000 lifecycle events",
    dependencies=[Depends(ingest_guard)],
    responses={409: {}, 413: {}, 422: {}, 503: {}},
)
async def post_events(request: Request) -> Response:
    """Store a batch atomically and idempotently; see CONTRACT "Ingest".

    Answered once the batch is committed: it shares the transaction (and the disk flush) with the
    batches posted at the same time (``billing.ingest.writer``).
    """
    result = await _ingest(request, request.app.state.billing)
    return Response(_reply(result), media_type="application/json")


async def _ingest(request: Request, state: AppState) -> IngestResult:
    body = await read_body(request, state.settings.body_timeout_s)
    now = datetime.now(UTC)
    try:
        if len(body) <= INLINE_PARSE_BYTES:
            batch = prepare(body, now)
        else:
            batch = await run_in_threadpool(prepare, body, now)
        result = await writer_of(state).store(batch)
    except BillingError as error:
        _count_rejected(state, error)
        raise
    _count_stored(state, result)
    return result


def _reply(result: IngestResult) -> bytes:
    return orjson.dumps({"accepted": result.accepted, "duplicates": result.duplicates})


def _render(error: BillingError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def serve_ingest(scope: Scope, receive: Receive, send: Send, state: AppState) -> int:
    """``POST /v1/events`` in full, as an ASGI call without the framework's middleware, routing
    and dependency machinery; returns the status answered.

    The app sends this one hot route here (``billing.api.app``): the same guard, the same
    handler, and the same error rendering as the exception handlers of ``billing.api.errors`` (a
    domain error as its JSON body and status, an unavailable database as 503 with
    ``Retry-After``); any other exception propagates as it would from the route (a 500).
    """
    request = Request(scope, receive)
    try:
        _allow_ingest(request)
        result = await _ingest(request, state)
    except BillingError as error:
        response = _render(error)
    except ClientDisconnect:
        # The client hung up before its body arrived: nothing was stored, nobody to answer.
        return 499
    except CommitOutcomeUnknown:
        log.warning("database unavailable during COMMIT; outcome unknown")
        response = _render(Unavailable(state.settings.db_retry_after_s, OUTCOME_UNKNOWN))
    except SQLAlchemyError as error:
        if not is_unavailable(error):
            raise
        log.warning("database unavailable: %s", type(error).__name__)
        response = _render(Unavailable(state.settings.db_retry_after_s))
    else:
        body = _reply(result)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-length", b"%d" % len(body)),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return 200
    await response(scope, receive, send)
    return response.status_code
