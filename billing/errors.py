"""Typed domain errors; each carries its HTTP status, and one API handler renders them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One validation problem: event ``index`` (None for query/body), ``path``, a sentence."""

    index: int | None
    path: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "path": self.path, "message": self.message}


class BillingError(Exception):
    """Base of every error a client can cause; ``status`` is the HTTP status to answer with."""

    status = 400

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return {"error": str(self)}

    def headers(self) -> dict[str, str]:
        """Extra response headers (``Retry-After``, ``WWW-Authenticate``…)."""
        return {}


#: A 422 lists at most this many problems: a batch of a million bad fields must not get an
#: answer twenty times its own size.
MAX_LISTED_ERRORS = 100


class ValidationFailed(BillingError):
    """422: the request is malformed; ``errors`` lists every problem (CONTRACT "Ingest")."""

    status = 422

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.path}: {e.message}" for e in errors[:5]))
        self.errors = errors

    def body(self) -> dict[str, Any]:
        """``{"errors": [...]}`` with at most ``MAX_LISTED_ERRORS`` problems (the first ones, in
        batch order), and ``more_errors``: how many more there were, when there were more."""
        listed: dict[str, Any] = {"errors": [e.as_dict() for e in self.errors[:MAX_LISTED_ERRORS]]}
        if len(self.errors) > MAX_LISTED_ERRORS:
            listed["more_errors"] = len(self.errors) - MAX_LISTED_ERRORS
        return listed


class TooLarge(BillingError):
    """413: more than 1000 events or a body over 1 MiB."""

    status = 413


@dataclass(frozen=True)
class Conflict:
    """An ``event_id`` reused with different content, at ``index`` of the batch."""

    index: int
    event_id: str


class BadRequest(BillingError):
    """400: a request the server cannot read (a ``Host`` it does not serve, a body that is not
    valid gzip)."""

    status = 400


class UnsupportedMediaType(BillingError):
    """415: a POST whose body is not ``application/json``, or in an encoding the route does not
    take."""

    status = 415


class BodyTimeout(BillingError):
    """408: the request body did not arrive in full within the server's body timeout."""

    status = 408


class EventConflict(BillingError):
    """409: an event_id already stored (or repeated in the batch) with different content."""

    status = 409

    def __init__(self, conflicts: list[Conflict]) -> None:
        super().__init__(f"{len(conflicts)} event_id(s) reused with different content")
        self.conflicts = conflicts

    def body(self) -> dict[str, Any]:
        return {
            "error": (
                "event_id already used for an event with different content; an event_id names "
                "one event forever: send a new event_id for a new event"
            ),
            "conflicts": [{"index": c.index, "event_id": c.event_id} for c in self.conflicts],
        }


class Unauthorized(BillingError):
    """401: no token, or a token that is unknown or revoked."""

    status = 401

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(BillingError):
    """403: a valid token whose role may not call this endpoint."""

    status = 403


class NotFound(BillingError):
    """404 with a sentence naming what was not found."""

    status = 404


class PriceConflict(BillingError):
    """409: a price for the same model and effective_from exists with different amounts."""

    status = 409


class PlanConflict(BillingError):
    """409: a plan version or key assignment of the same identity exists with another body."""

    status = 409


class GrantConflict(BillingError):
    """409: a credit grant of the same ``grant_id`` exists with another body (v3)."""

    status = 409


class Unavailable(BillingError):
    """503: the database is unreachable; nothing was stored. Retry after ``retry_after`` s."""

    status = 503

    def __init__(
        self,
        retry_after: int,
        message: str = "the database is unavailable; nothing was stored, retry later",
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class CommitOutcomeUnknown(Exception):
    """Raised by the ingest writer when the connection broke during COMMIT and the database could
    not be asked since whether the transaction committed (``billing.ingest.outcome``). The API
    answers it as a 503 with ``OUTCOME_UNKNOWN`` instead of "nothing was stored"."""


#: The 503 sentence for ``CommitOutcomeUnknown``.
OUTCOME_UNKNOWN = (
    "the database connection broke while committing and the database could not be reached "
    "since: some or all of these events may be stored; retry the same batch (stored events are "
    "answered as duplicates)"
)
