"""One place that renders every error as JSON with its status (never a 500 for client input)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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
from billing.ingest.validation import NO_OFFSET, NOT_A_TIMESTAMP, NOT_A_TIMESTAMP_KINDS
from billing.storage.db import is_unavailable

log = logging.getLogger("billing.api")


def _render(error: BillingError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def request_message(item: Mapping[str, Any]) -> str:
    """A sentence for one pydantic error of a request body other than ``POST /v1/events`` (which
    has its own, ``billing.ingest.validation``): the same words for timestamps, the validator's own
    sentence for a value error, and plain words for a missing or unknown field; pydantic's message
    otherwise."""
    kind = item.get("type")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of this request; remove it"
    if kind == "timezone_aware":
        return NO_OFFSET
    if kind in NOT_A_TIMESTAMP_KINDS:
        return NOT_A_TIMESTAMP
    if kind == "value_error":
        ctx = item.get("ctx") or {}
        return str(ctx.get("error") or item.get("msg", "is invalid"))
    if kind == "string_type":
        return "must be a string"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"is too long: at most {(item.get('ctx') or {}).get('max_length')} characters"
    if kind in ("model_attributes_type", "dict_type", "model_type"):
        if isinstance(item.get("input"), (str, bytes)):  # a body FastAPI did not read as JSON
            return "must be a JSON object sent with Content-Type: application/json"
        return "must be a JSON object"
    if kind == "json_invalid":
        error = (item.get("ctx") or {}).get("error")
        return f"is not valid JSON ({error})" if error else "is not valid JSON"
    return str(item.get("msg", "is invalid"))


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
            errors.append(FieldError(None, path, request_message(item)))
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
