"""Every error answer: the one renderer (``render``), the mapping of exceptions to domain errors
(``domain_error``), the handlers that use them, and the error shapes OpenAPI declares.

The shapes (CONTRACT "Ingest", "Who may do what"): ``{"error": sentence}`` for every status,
``{"errors": [{"index", "path", "message"}]}`` for 422, and ``{"error", "conflicts": [{"index",
"event_id"}]}`` for a reused ``event_id`` (409 on ``POST /v1/events``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from billing.errors import (
    MAX_LISTED_ERRORS,
    OUTCOME_UNKNOWN,
    BillingError,
    CommitOutcomeUnknown,
    FieldError,
    Unavailable,
    ValidationFailed,
)
from billing.fields import UNION_TAG_MARK
from billing.ingest.validation import plain_message
from billing.storage.db import is_unavailable
from billing.storage.disk import is_disk_full

log = logging.getLogger("billing.api")


class ErrorBody(BaseModel):
    """Any error but 422 and an event conflict: one sentence saying what to do."""

    model_config = ConfigDict(extra="forbid")

    error: str


class FieldProblem(BaseModel):
    """One problem of a 422: the event's ``index`` in the batch (null for a query parameter or a
    whole body), where it is (``events[1].occurred_at``, ``query.since``, ``body``), a sentence."""

    model_config = ConfigDict(extra="forbid")

    index: int | None
    path: str
    message: str


class ValidationErrors(BaseModel):
    """422: the problems of the request, at most 100 (``billing.errors.MAX_LISTED_ERRORS``);
    ``more_errors`` says how many more there were, when there were more."""

    model_config = ConfigDict(extra="forbid")

    errors: list[FieldProblem] = Field(min_length=1, max_length=MAX_LISTED_ERRORS)
    more_errors: int | None = Field(default=None, ge=1)


class ConflictItem(BaseModel):
    """An ``event_id`` already stored (or earlier in the batch) with different content."""

    model_config = ConfigDict(extra="forbid")

    index: int
    event_id: str


class ConflictBody(BaseModel):
    """409 on ``POST /v1/events``: nothing of the batch was stored."""

    model_config = ConfigDict(extra="forbid")

    error: str
    conflicts: list[ConflictItem] = Field(min_length=1)


_DESCRIPTIONS = {
    401: "no bearer token, or one that is unknown or revoked",
    403: "the token's role may not call this endpoint",
    404: "not found",
    408: "the request body did not arrive in full in time",
    400: "the request cannot be read (a Host not served in open mode, a body not valid gzip)",
    409: "a conflict with what is stored",
    413: "the request is too large",
    415: "the body is not Content-Type: application/json (or not in an encoding taken)",
    422: "the request is malformed: every problem is listed",
    503: "the database is unavailable; retry after Retry-After seconds",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
}


def answers(
    *errors: int,
    ok: Mapping[int, tuple[type[BaseModel], str]] | None = None,
    conflict: type[BaseModel] = ErrorBody,
    described: Mapping[int, str] | None = None,
) -> dict[int | str, dict[str, Any]]:
    """A route's OpenAPI ``responses``: each ``ok`` status as its (model, description), each of
    the ``errors`` statuses as its error shape (422 ``ValidationErrors``, 409 ``conflict``, any
    other ``ErrorBody``) with its default sentence, or the one in ``described``."""
    responses: dict[int | str, dict[str, Any]] = {
        status: {"model": model, "description": description}
        for status, (model, description) in (ok or {}).items()
    }
    for status in errors:
        model = ValidationErrors if status == 422 else conflict if status == 409 else ErrorBody
        response: dict[str, Any] = {
            "model": model,
            "description": (described or {}).get(status, _DESCRIPTIONS[status]),
        }
        if status in _HEADERS:
            response["headers"] = _HEADERS[status]
        responses[status] = response
    return responses


class RoutingError(BillingError):
    """A status the framework answers by itself (404 for an unknown path, 405 for a method the
    path does not take), in the shape of every other error."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None) -> None:
        super().__init__(message)
        self.status = status
        self._headers = dict(headers or {})

    def headers(self) -> dict[str, str]:
        return self._headers


def render(error: BillingError, *, close: bool = False) -> JSONResponse:
    """The response for any error: its JSON body, status and headers. ``close``: the answer
    ends the connection (``Connection: close``), for a request refused before its body was
    read (the rest of the body is not read off the connection)."""
    headers = error.headers()
    if close:
        headers = {**headers, "Connection": "close"}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def raw_answer(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer in the shape of every other (``{"error": sentence}``),
    that closes the connection: what the HTTP protocol answers itself, before a request
    reaches the app (``billing.api.limits``: 431, 408)."""
    body = orjson.dumps({"error": message})
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, reason.encode(), len(body))
    ) + body


def domain_error(error: Exception, retry_after_s: int) -> BillingError | None:
    """The domain error to answer for ``error``: itself for a ``BillingError``, 503 for a
    database that is unavailable (with ``OUTCOME_UNKNOWN`` when a COMMIT's outcome is unknown);
    None for anything else (a bug: it propagates and the server answers 500)."""
    if isinstance(error, BillingError):
        return error
    if isinstance(error, CommitOutcomeUnknown):
        log.warning("database unavailable during COMMIT; outcome unknown")
        return Unavailable(retry_after_s, OUTCOME_UNKNOWN)
    if isinstance(error, SQLAlchemyError) and is_unavailable(error):
        reason = "disk full (SQLITE_FULL)" if is_disk_full(error) else type(error).__name__
        log.warning("database unavailable: %s", reason)
        return Unavailable(retry_after_s)
    return None


#: The exceptions ``domain_error`` may turn into an answer.
HANDLED: tuple[type[Exception], ...] = (BillingError, CommitOutcomeUnknown, SQLAlchemyError)


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and part.startswith(UNION_TAG_MARK)


def request_invalid(error: RequestValidationError) -> ValidationFailed:
    """FastAPI's validation of a body or parameter (``POST /v1/prices``, ``GET /v1/prices``) as
    the service's 422, in its words."""
    errors = []
    for item in error.errors():
        # A tagged union's member tag is no field the client sent (``billing.fields.union_tag``).
        loc = [str(part) for part in item.get("loc", ()) if not _is_union_tag(part)]
        if item.get("type") == "json_invalid":
            loc = loc[:1]  # FastAPI adds the character position, which is not a field
        path = ".".join(loc) if loc else "request"
        errors.append(FieldError(None, path, plain_message(item)))
    return ValidationFailed(errors)


#: Why FastAPI could not read a JSON body that its parser did not refuse as JSON (its 400).
_UNREADABLE: tuple[type[Exception], ...] = (RecursionError, UnicodeDecodeError, ValueError)


def body_unreadable(error: HTTPException) -> ValidationFailed | None:
    """The 422 for FastAPI's 400 "There was an error parsing the body": JSON nested too deep or
    text that is not UTF-8 (its cause), a body a client sent like any other invalid JSON; None
    for any other HTTP error."""
    if error.status_code != 400 or not isinstance(error.__cause__, _UNREADABLE):
        return None
    message = (
        "is not UTF-8 text"
        if isinstance(error.__cause__, UnicodeDecodeError)
        else "is not JSON this service reads (nested too deep)"
    )
    return ValidationFailed([FieldError(None, "body", message)])


def install(app: FastAPI, retry_after_s: int) -> None:
    """Register the handlers: domain errors, request validation (422), routing errors, database
    outages (503); each answers through ``render``."""

    async def _domain(_request: Request, error: Exception) -> JSONResponse:
        answer = domain_error(error, retry_after_s)
        if answer is None:
            raise error
        return render(answer)

    async def _request_invalid(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return render(request_invalid(error))

    async def _routing(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        unreadable = body_unreadable(error)
        if unreadable is not None:
            return render(unreadable)
        return render(RoutingError(error.status_code, str(error.detail), error.headers))

    for kind in HANDLED:
        app.add_exception_handler(kind, _domain)
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(HTTPException, _routing)
