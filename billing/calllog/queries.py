"""``GET /v1/calls``: the call log, filtered, newest first, in keyset-paginated pages.

Order: newest first by ``started_at``, then ``request_id`` (both descending). A call whose start is
not known yet (its events arrived but neither a ``stream.started`` nor a reconciliation pass has
given it one; the next pass sets it to its earliest event time, within seconds) comes first, as the
newest of all, ordered by ``request_id``; ``since``/``until`` leave such calls out (their start is
unknown). A page ends at its last call's (start, request_id) and the next page resumes strictly
after it, so a walk over the pages never repeats or skips a call whose start stays put, however
many calls arrive meanwhile (new calls newer than the position appear on a new first page).
The list shows each call's stored figures; ``GET /v1/calls/{id}`` also previews unreconciled ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from billing.calllog import cursor
from billing.calllog.cursor import Position
from billing.calllog.params import QueryReader, parse_timestamp
from billing.calllog.views import call_json
from billing.storage.models import Call

STATUSES = ("open", "completed", "client_disconnected", "failed")
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
PARAMETERS = (
    "api_key_id",
    "customer_id",
    "model",
    "status",
    "since",
    "until",
    "limit",
    "cursor",
)


@dataclass(frozen=True)
class CallsQuery:
    """Filters (all optional, combined with AND), page size and position."""

    api_key_id: str | None = None
    model: str | None = None
    status: str | None = None
    #: (v2) Only the calls charged to this customer (its key's customer at the call's start).
    customer_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT
    after: Position | None = None


@dataclass(frozen=True)
class CallsPage:
    """One page: the calls and the cursor of the next page (None: no call after these now)."""

    calls: list[Call]
    next_cursor: str | None

    def as_json(self) -> dict[str, Any]:
        return {"data": [call_json(c) for c in self.calls], "next_cursor": self.next_cursor}


def parse_calls_query(items: Iterable[tuple[str, str]]) -> CallsQuery:
    """The query string's (name, value) pairs → ``CallsQuery``; ``ValidationFailed`` (422) lists
    every unknown, repeated or malformed parameter."""
    reader = QueryReader(items, PARAMETERS)
    query = CallsQuery(
        api_key_id=reader.text("api_key_id", 128),
        model=reader.text("model"),
        status=reader.choice("status", STATUSES),
        customer_id=reader.text("customer_id", 128),
        since=reader.parsed("since", parse_timestamp),
        until=reader.parsed("until", parse_timestamp),
        limit=reader.integer("limit", 1, MAX_LIMIT) or DEFAULT_LIMIT,
        after=reader.parsed("cursor", cursor.decode),
    )
    if query.since and query.until and query.until < query.since:
        reader.fail("until", "must not be before since")
    reader.done()
    return query


def list_calls(session: Session, query: CallsQuery) -> CallsPage:
    """One page of the log for ``query`` (see the module's notes on order and positions)."""
    want = query.limit + 1  # one more than the page, to know whether another page follows
    rows: list[Call] = []
    after = query.after
    # A call gets its key and model with its start (stream.started), and is open until the
    # reconciler dates it: filters on those leave the undated calls out without asking.
    dated_only = (
        query.since is not None
        or query.until is not None
        or query.api_key_id is not None
        or query.model is not None
        or query.status not in (None, "open")
    )
    if not dated_only and (after is None or after.started_at is None):
        undated = _filtered(query).where(Call.started_at.is_(None))
        if after is not None:
            undated = undated.where(Call.request_id < after.request_id)
        rows += session.scalars(undated.order_by(Call.request_id.desc()).limit(want))
        after = None
    if len(rows) < want:
        dated = _filtered(query).where(Call.started_at.is_not(None))
        if query.since is not None:
            dated = dated.where(Call.started_at >= query.since)
        if query.until is not None:
            dated = dated.where(Call.started_at < query.until)
        if after is not None and after.started_at is not None:
            at = after.started_at
            dated = dated.where(
                Call.started_at <= at,
                or_(
                    Call.started_at < at,
                    and_(Call.started_at == at, Call.request_id < after.request_id),
                ),
            )
        order = (Call.started_at.desc(), Call.request_id.desc())
        rows += session.scalars(dated.order_by(*order).limit(want - len(rows)))
    page = rows[: query.limit]
    if len(rows) <= query.limit:
        return CallsPage(page, None)
    return CallsPage(page, cursor.encode(Position(page[-1].started_at, page[-1].request_id)))


def _filtered(query: CallsQuery) -> Select[Call]:
    statement = select(Call)
    if query.api_key_id is not None:
        statement = statement.where(Call.api_key_id == query.api_key_id)
    if query.model is not None:
        statement = statement.where(Call.model == query.model)
    if query.status is not None:
        statement = statement.where(Call.status == query.status)
    if query.customer_id is not None:
        statement = statement.where(Call.customer_id == query.customer_id)
    return statement
