"""``POST /v1/events`` (CONTRACT "Ingest")."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from billing.api.errors import HANDLED, ConflictBody, answers, domain_error, render
from billing.api.limits import admitted_body
from billing.api.openapi import request_body
from billing.api.state import AppState
from billing.auth.guard import DeclaresBearer, allow
from billing.errors import BillingError, EventConflict
from billing.ingest.prepare import PreparedBatch, prepare_batch
from billing.ingest.schemas import Event
from billing.ingest.service import IngestResult
from billing.ingest.validation import MAX_BATCH, parse_batch

router = APIRouter()

#: The route answered by ``serve_ingest`` (see ``billing.server.app``'s middleware).
PATH = "/v1/events"

#: Bodies up to this size (some 300 events) are validated on the event loop: a thread hop costs
#: more than the work, and the work holds the GIL wherever it runs; larger ones in the thread
#: pool, so that a 1000-event batch does not stall the loop for the length of its validation.
INLINE_PARSE_BYTES = 64 * 1024


# The route reads its body itself (``parse_batch``: the contract's 422 messages, and speed); this
# model declares the body in OpenAPI.
class EventBatch(BaseModel):
    """The body of ``POST /v1/events``: 1 to 1000 events of any type, in any order; at most
    1 MiB."""

    model_config = ConfigDict(extra="forbid")

    events: list[Event] = Field(min_length=1, max_length=MAX_BATCH)


class IngestReply(BaseModel):
    """``accepted`` + ``duplicates`` = the number of events sent."""

    model_config = ConfigDict(extra="forbid")

    accepted: int = Field(ge=0, description="events newly stored")
    duplicates: int = Field(
        ge=0, description="events already stored, or repeated in the batch, with the same content"
    )


_allow_ingest = allow("ingest")


async def ingest_guard(request: Request, _declared: DeclaresBearer = None) -> None:
    """``allow("ingest")`` as an async dependency: FastAPI runs a plain ``def`` dependency in the
    thread pool, two thread hops per post; the check is a cache lookup (it reads the token table
    at most once per cache period), so it runs on the event loop."""
    _allow_ingest(request)


ingest_guard.allowed_roles = _allow_ingest.allowed_roles  # type: ignore[attr-defined]


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
    responses=answers(
        401,
        403,
        408,
        409,
        413,
        422,
        503,
        conflict=ConflictBody,
        described={
            409: "an event_id reused with different content; nothing was stored",
            413: "more than 1000 events or a body over 1 MiB",
            422: "invalid events, each listed by index and path; nothing was stored",
        },
    ),
    openapi_extra=request_body(EventBatch, "1 to 1000 events of any type, in any order"),
)
async def post_events(request: Request) -> Response:
    """Store a batch atomically and idempotently; see CONTRACT "Ingest".

    Answered once the batch is committed: it shares the transaction (and the disk flush) with the
    batches posted at the same time (``billing.ingest.writer``).
    """
    result = await _ingest(request, request.app.state.billing)
    return Response(_reply(result), media_type="application/json")


async def _ingest(request: Request, state: AppState) -> IngestResult:
    body = admitted_body(request)
    now = datetime.now(UTC)
    try:
        if len(body) <= INLINE_PARSE_BYTES:
            batch = prepare(body, now)
        else:
            batch = await run_in_threadpool(prepare, body, now)
        result = await state.writer().store(batch)
    except BillingError as error:
        _count_rejected(state, error)
        raise
    _count_stored(state, result)
    return result


def _reply(result: IngestResult) -> bytes:
    return orjson.dumps({"accepted": result.accepted, "duplicates": result.duplicates})


async def serve_ingest(scope: Scope, receive: Receive, send: Send, state: AppState) -> int:
    """``POST /v1/events`` in full, as an ASGI call without the framework's middleware, routing
    and dependency machinery; returns the status answered.

    The app sends this one hot route here (``billing.server.app``): the same guard, the same
    handler, and the same errors as the exception handlers of ``billing.api.errors``
    (``domain_error``, ``render``); any other exception propagates as it would from the route (a
    500).
    """
    request = Request(scope, receive)
    try:
        _allow_ingest(request)
        result = await _ingest(request, state)
    except HANDLED as error:
        answer = domain_error(error, state.settings.db_retry_after_s)
        if answer is None:
            raise
        response = render(answer)
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
