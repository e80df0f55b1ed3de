"""``GET/POST /v1/tokens`` and ``DELETE /v1/tokens/{token_id}``: the admin token API (as
``billing tokens``). The secret is in the answer of the ``POST`` only; it is not stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from billing.api.errors import answers
from billing.api.state import AppState, get_state
from billing.auth.guard import TokenCache, allow
from billing.auth.schemas import CreatedToken, TokenIn, TokenList, TokenOut, token_json
from billing.auth.tokens import create_token, list_tokens, revoke_token
from billing.errors import FieldError, ValidationFailed
from billing.storage.db import read_transaction, write_transaction

router = APIRouter()


@router.get(
    "/v1/tokens",
    summary="List API tokens (never their secrets)",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 503, ok={200: (TokenList, "every token, oldest first")}),
)
async def get_tokens(
    request: Request, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """Every token, revoked and expired ones too, with when each was last used."""
    cache: TokenCache = request.app.state.tokens

    def run() -> list[dict[str, object]]:
        cache.flush_last_used()  # what this process noted, so the answer is up to date
        with read_transaction(state.sessions) as session:
            return [token_json(info) for info in list_tokens(session)]

    return JSONResponse({"data": await run_in_threadpool(run)})


@router.post(
    "/v1/tokens",
    summary="Create an API token",
    dependencies=[Depends(allow())],
    status_code=201,
    responses=answers(
        401, 403, 422, 503, ok={201: (CreatedToken, "the token, with its secret shown this once")}
    ),
)
async def post_token(
    token: TokenIn, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """201 with the new token and its secret (``token``), which is never shown again."""
    now = datetime.now(UTC)
    if token.expires_at is not None and token.expires_at <= now:
        raise ValidationFailed(
            [FieldError(None, "body.expires_at", "must be in the future (RFC 3339, UTC offset)")]
        )

    def run() -> dict[str, object]:
        with write_transaction(state.sessions) as session:
            secret, info = create_token(session, token.role, token.name, now, token.expires_at)
        return {**token_json(info), "token": secret}

    return JSONResponse(await run_in_threadpool(run), status_code=201)


@router.delete(
    "/v1/tokens/{token_id}",
    summary="Revoke an API token",
    dependencies=[Depends(allow())],
    responses=answers(401, 403, 404, 503, ok={200: (TokenOut, "the token, revoked")}),
)
async def delete_token(
    token_id: str, state: Annotated[AppState, Depends(get_state)]
) -> JSONResponse:
    """Revoke a token (idempotent); it stops working within a few seconds. 404 for an unknown
    id."""

    def run() -> dict[str, object]:
        with write_transaction(state.sessions) as session:
            return token_json(revoke_token(session, token_id, datetime.now(UTC)))

    return JSONResponse(await run_in_threadpool(run))
