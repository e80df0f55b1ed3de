"""One place that renders every error as JSON with its status (never a 500 for client input)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from billing.errors import (
    OUTCOME_UNKNOWN,
    BillingError,
    CommitOutcomeUnknown,
    FieldError,
    Unavailable,
    ValidationFailed,
)
from billing.ingest.validation import plain_message
from billing.storage.db import is_unavailable

log = logging.getLogger("billing.api")


def _render(error: BillingError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def install(app: FastAPI, retry_after_s: int) -> None:
    """Register the handlers: domain errors, query validation (422), database outages (503)."""

    @app.exception_handler(BillingError)
    async def _billing_error(_request: Request, error: BillingError) -> JSONResponse:
        return _render(error)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        errors = []
        for item in error.errors():
            loc = [str(part) for part in item.get("loc", ())]
            if item.get("type") == "json_invalid":
                loc = loc[:1]  # FastAPI adds the character position, which is not a field
            path = ".".join(loc) if loc else "request"
            errors.append(FieldError(None, path, plain_message(item)))
        return _render(ValidationFailed(errors))

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(error.detail)}, status_code=error.status_code, headers=error.headers
        )

    @app.exception_handler(CommitOutcomeUnknown)
    async def _outcome_unknown(_request: Request, _error: CommitOutcomeUnknown) -> JSONResponse:
        log.warning("database unavailable during COMMIT; outcome unknown")
        return _render(Unavailable(retry_after_s, OUTCOME_UNKNOWN))

    @app.exception_handler(SQLAlchemyError)
    async def _database_error(_request: Request, error: SQLAlchemyError) -> JSONResponse:
        if is_unavailable(error):
            log.warning("database unavailable: %s", type(error).__name__)
            return _render(Unavailable(retry_after_s))
        raise error
