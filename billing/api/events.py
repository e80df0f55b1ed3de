"""``POST /v1/events`` (CONTRACT "Ingest")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from billing.api.state import AppState, get_state
from billing.auth.guard import allow
from billing.errors import BillingError, EventConflict, TooLarge
from billing.ingest.service import IngestResult, store_batch
from billing.ingest.validation import MAX_BODY_BYTES, parse_batch
from billing.storage.db import write_transaction

router = APIRouter()


class IngestReply(BaseModel):
    """``accepted`` + ``duplicates`` = the number of events sent."""

    accepted: int
    duplicates: int


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refusing with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"request body is {declared} bytes; the limit is {limit} (1 MiB)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body is over the limit of {limit} bytes (1 MiB)")
        chunks.append(chunk)
    return b"".join(chunks)


def ingest(state: AppState, body: bytes) -> IngestResult:
    """Validate and store one batch in one transaction; committed before this returns."""
    now = datetime.now(UTC)
    try:
        batch = parse_batch(body, now)
        with write_transaction(state.sessions) as session:
            result = store_batch(session, batch, now)
    except BillingError as error:
        reason = {409: "conflict", 413: "too_large", 422: "invalid"}.get(error.status)
        if reason is not None:
            count = len(error.conflicts) if isinstance(error, EventConflict) else 1
            state.metrics.events_rejected.labels(reason).inc(count)
        raise
    state.metrics.events_accepted.inc(result.accepted)
    state.metrics.events_duplicate.inc(result.duplicates)
    return result


@router.post(
    "/v1/events",
    response_model=IngestReply,
    summary="Ingest a batch of 1–1000 lifecycle events",
    dependencies=[Depends(allow("ingest"))],
    responses={409: {}, 413: {}, 422: {}, 503: {}},
)
async def post_events(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> IngestReply:
    """Store a batch atomically and idempotently; see CONTRACT "Ingest"."""
    body = await read_body(request)
    result = await run_in_threadpool(ingest, state, body)
    return IngestReply(accepted=result.accepted, duplicates=result.duplicates)
