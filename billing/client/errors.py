"""What the client reports: the error passed to ``on_error``, the closed-client error, and the
snapshot of its counters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal


class ClientClosedError(RuntimeError):
    """``send()`` was called after ``close()``."""


class DeliveryError(Exception):
    """A delivery problem, passed to the ``on_error`` callback (and logged).

    Attributes:
        kind: ``"rejected"`` - the service refused the events with a ``4xx`` (they are dropped);
            ``"refused"`` - ``401``/``403``/``404``/redirect: the client is misconfigured (events
            kept in the spool when there is one, else dropped);
            ``"unreachable"`` - no answer past the retries (events spooled or kept in memory);
            ``"dropped"`` - events lost on the client side (buffer full without a spool, closed
            before delivery without a spool);
            ``"spool_corrupt"`` - unreadable lines skipped in the spool file.
        status: the HTTP status, or ``None`` when there was no answer.
        event_ids: the events concerned (may be empty for ``spool_corrupt``).
        detail: the service's JSON answer (``{"errors": [...]}``, ``{"conflicts": [...]}``, ...)
            when there was one, else ``None``.
    """

    def __init__(
        self,
        kind: Literal["rejected", "refused", "unreachable", "dropped", "spool_corrupt"],
        message: str,
        *,
        status: int | None = None,
        event_ids: Sequence[str] = (),
        detail: Any = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.event_ids = list(event_ids)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of a client's counters (all counts are events, except ``requests`` and
    ``retries``, which count HTTP posts).

    ``acknowledged`` = ``accepted`` + ``duplicates`` as answered by the service; an event posted
    again after its answer was lost is acknowledged again (as a duplicate). ``pending`` is the
    number of events held in memory, not yet acknowledged, spooled or given up.
    """

    sent: int
    acknowledged: int
    accepted: int
    duplicates: int
    spooled: int
    replayed: int
    rejected: int
    dropped: int
    requests: int
    retries: int
    pending: int


OnError = Callable[[DeliveryError], None]


class ServiceError(Exception):
    """An authorization or a release the service did not answer with 200 (CONTRACT
    "Authorizations and holds (v3)"); one of its two kinds is raised.

    Attributes:
        status: the HTTP status (``409``: the request_id was authorized with another body;
            ``422``: a bad field; ``404``: no such authorization; ``503``: the service cannot
            decide now), or ``None`` when there was no answer (a network error or timeout).
        detail: the service's JSON answer, when there was one (its first 500 characters, as
            text, when it was not JSON).
        retry_after_s: the service's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        detail: Any = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


class AuthorizationUnavailable(ServiceError):
    """The service could not decide: ``503`` (or another ``5xx``, ``408``, ``429``), no answer
    at all (a connection error, a timeout) or an unreadable ``200``; what the gateway does then
    is its ``fail_open`` setting. The one definition of "unavailable" (``authorizations.py``)."""


class AuthorizationRejected(ServiceError):
    """The service refused the request itself (``401``, ``403``, ``404``: no such authorization
    to release, ``409``: the ``request_id`` was authorized with another body, ``422``: a bad
    estimate or TTL; any other answer that is not ``200`` and not unavailable): a gateway's
    mistake, which ``fail_open`` does not cover (the gateway refuses the call)."""
