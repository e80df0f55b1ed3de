"""``GET /v1/drift``, ``GET /v1/exports/drift.csv`` and ``billing drift``: the query and the row
(CONTRACT "Provider reports and drift")."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, Field

from billing.calllog import cursor
from billing.calllog.cursor import Position
from billing.calllog.params import UNTIL_AFTER_SINCE, QueryReader, parse_timestamp
from billing.providers.schemas import PROVIDERS
from billing.timefmt import rfc3339

#: The compared figures, in the contract's token semantics, in the order of the rows and CSV.
FIELDS = (
    "requests",
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
    "cost_usd",
)
#: What ``group_by`` may list (``day`` and ``hour`` exclusive); ``provider`` is always a key.
GROUP_KEYS = ("day", "hour", "model", "upstream_account", "service_tier")
DEFAULT_GROUP_BY = ("day", "model")
#: The statuses, mismatches first (the rows' order).
STATUSES = ("drift", "missing_ours", "missing_theirs", "match")
QUERY_PARAMETERS = ("since", "until", "provider", "group_by", "tolerance_pct")
DEFAULT_TOLERANCE_PCT = Decimal(1)

#: A period edge inside a provider bucket would compare part of our calls with the whole bucket.
_OFF_GRAIN = (
    "must be on a whole UTC {grain} (the providers' buckets are whole UTC {grain}s, "
    "compared whole), such as {floor}"
)


def _floor(at: datetime, grain: str) -> datetime:
    """``at`` in UTC, down to its hour, or its day when ``grain`` is ``day``."""
    at = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return at.replace(hour=0) if grain == "day" else at


_PERCENT = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?", re.ASCII)


@dataclass(frozen=True)
class DriftQuery:
    """A drift question: calls started and provider buckets starting in ``[since, until)``
    (UTC), of one provider or all, grouped by ``group_by`` (and always by provider);
    ``tolerance_pct``: the largest ``|delta|`` that still matches, in percent of ours."""

    since: datetime
    until: datetime
    provider: str | None = None
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tolerance_pct: Decimal = DEFAULT_TOLERANCE_PCT

    @property
    def grain(self) -> Literal["day", "hour"]:
        """The time slot the figures are summed in (a day without a time key)."""
        return "hour" if "hour" in self.group_by else "day"

    @property
    def keys(self) -> tuple[str, ...]:
        """A row's group keys in order: ``provider``, then ``group_by``."""
        return ("provider", *self.group_by)


def _group_by(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    unknown = [name for name in names if name not in GROUP_KEYS]
    if unknown or not names:
        raise ValueError(
            f"must be a comma list of {', '.join(GROUP_KEYS)}; unknown: {', '.join(unknown)}"
        )
    if len(set(names)) != len(names):
        raise ValueError("names a key twice")
    if "day" in names and "hour" in names:
        raise ValueError("may hold day or hour, not both")
    return names


def _tolerance(text: str) -> Decimal:
    if not _PERCENT.fullmatch(text) or Decimal(text) > 100:
        raise ValueError(
            "must be a percentage from 0 to 100 with at most 6 decimal places, such as 1 or 0.5, "
            f"not {text!r}"
        )
    return Decimal(text)


def parse_query(items: Iterable[tuple[str, str]]) -> DriftQuery:
    """The query string (as (name, value) pairs) → ``DriftQuery``; ``ValidationFailed`` (422,
    ``query.<name>`` paths) listing every problem."""
    reader = QueryReader(items, QUERY_PARAMETERS)
    since = reader.parsed("since", parse_timestamp, "an RFC 3339 timestamp")
    until = reader.parsed("until", parse_timestamp, "an RFC 3339 timestamp")
    provider = reader.choice("provider", PROVIDERS)
    group_by = reader.parsed("group_by", _group_by)
    tolerance = reader.parsed("tolerance_pct", _tolerance)
    if since is not None and until is not None and until <= since:
        reader.fail("until", UNTIL_AFTER_SINCE)
    grain = "hour" if "hour" in (group_by or DEFAULT_GROUP_BY) else "day"
    for name, at in (("since", since), ("until", until)):
        if at is not None and at != _floor(at, grain):
            reader.fail(name, _OFF_GRAIN.format(grain=grain, floor=rfc3339(_floor(at, grain))))
    reader.done()
    assert since is not None and until is not None
    return DriftQuery(
        since,
        until,
        provider,
        group_by or DEFAULT_GROUP_BY,
        DEFAULT_TOLERANCE_PCT if tolerance is None else tolerance,
    )


class Figures(BaseModel):
    """One side's figures (``ours`` or ``theirs``), or their ``delta`` / ``delta_pct``: counts as
    integers, ``cost_usd`` (and every ``delta_pct``) as an exact decimal string; null where
    the side has no such figure (Anthropic's usage report counts no requests; a cost without a
    cost report)."""

    requests: int | str | None
    input_tokens: int | str | None
    cache_read_input_tokens: int | str | None
    cache_creation_input_tokens: int | str | None
    output_tokens: int | str | None
    cost_usd: str | None


class DriftRow(BaseModel):
    """A row of ``/v1/drift``: the group keys (``provider``, and ``day`` as ``YYYY-MM-DD`` or
    ``hour`` as RFC 3339 UTC, ``model``, ``upstream_account``, ``service_tier`` as grouped),
    ``ours``, ``theirs``, ``delta`` (theirs − ours), ``delta_pct`` (delta / ours × 100) and
    ``status``."""

    provider: str | None
    day: str | None = None
    hour: str | None = None
    model: str | None = None
    upstream_account: str | None = None
    service_tier: str | None = None
    ours: Figures
    theirs: Figures
    delta: Figures
    delta_pct: Figures
    status: Literal["match", "drift", "missing_ours", "missing_theirs"]


class DriftList(BaseModel):
    """``{"data": [row, …]}``: mismatches first (``drift``, ``missing_ours``,
    ``missing_theirs``, then ``match``), then by the group keys."""

    data: list[DriftRow] = Field(default_factory=list)


class DriftParams(BaseModel):
    """The query of ``GET /v1/drift`` and ``GET /v1/exports/drift.csv`` (read by
    ``parse_query``; declared here for OpenAPI)."""

    since: datetime = Field(description="calls started and buckets starting from (RFC 3339)")
    until: datetime = Field(description="up to (exclusive), RFC 3339")
    provider: Literal["openai", "anthropic"] | None = Field(None, description="one provider")
    group_by: str | None = Field(
        None,
        description=(
            f"comma list of {', '.join(GROUP_KEYS)} (default {','.join(DEFAULT_GROUP_BY)}); "
            "provider is always a key"
        ),
    )
    tolerance_pct: str | None = Field(
        None, description="percent of ours within which a figure matches (default 1)"
    )


# -- per call (``GET /v1/drift/calls``) ----------------------------------------------------------

#: The parameters of ``GET /v1/drift/calls``.
CALL_QUERY_PARAMETERS = ("since", "until", "provider", "tolerance_pct", "limit", "cursor")
#: A call's statuses: ours unknown (unpriced), beyond the tolerance, within it.
CALL_STATUSES = ("missing_ours", "drift", "match")
MAX_CALLS_LIMIT = 1000
DEFAULT_CALLS_LIMIT = 100


@dataclass(frozen=True)
class CallDriftQuery:
    """The calls started in ``[since, until)`` (UTC; any instants: calls are not bucketed), of
    one provider or all, ``limit`` a page after ``after`` (newest first)."""

    since: datetime
    until: datetime
    provider: str | None = None
    tolerance_pct: Decimal = DEFAULT_TOLERANCE_PCT
    limit: int = DEFAULT_CALLS_LIMIT
    after: Position | None = None

    @property
    def scope(self) -> str:
        """The stamp its cursors carry (:func:`call_scope`)."""
        return call_scope(self.since, self.until, self.provider)


def call_scope(since: datetime, until: datetime, provider: str | None) -> str:
    """The stamp of a per-call drift query that its cursors carry: a cursor of one range or
    provider is refused (422, ``query.cursor``) with another, whose list it is not a page of
    (``tolerance_pct`` only grades the rows: a cursor keeps across it)."""
    text = f"{rfc3339(since)}|{rfc3339(until)}|{provider or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_call_query(items: Iterable[tuple[str, str]]) -> CallDriftQuery:
    """The query string of ``GET /v1/drift/calls`` → ``CallDriftQuery``; ``ValidationFailed``
    (422, ``query.<name>`` paths) listing every problem."""
    reader = QueryReader(items, CALL_QUERY_PARAMETERS)
    since = reader.parsed("since", parse_timestamp, "an RFC 3339 timestamp")
    until = reader.parsed("until", parse_timestamp, "an RFC 3339 timestamp")
    provider = reader.choice("provider", PROVIDERS)
    tolerance = reader.parsed("tolerance_pct", _tolerance)
    limit = reader.integer("limit", 1, MAX_CALLS_LIMIT) or DEFAULT_CALLS_LIMIT
    scope = None if since is None or until is None else call_scope(since, until, provider)
    after = reader.parsed("cursor", lambda text: cursor.decode(text, scope))
    if since is not None and until is not None and until <= since:
        reader.fail("until", UNTIL_AFTER_SINCE)
    reader.done()
    assert since is not None and until is not None
    return CallDriftQuery(
        since,
        until,
        provider,
        DEFAULT_TOLERANCE_PCT if tolerance is None else tolerance,
        limit,
        after,
    )


class CallDriftRow(BaseModel):
    """A call whose provider's own cost (``stream.usage.provider_cost_usd``) is not ours:
    ``ours`` (``cost_usd``; null when unpriced), ``theirs`` (``provider_cost_usd``), ``delta``
    (theirs − ours), ``delta_pct`` (delta / ours × 100, 4 decimal places; null when ours is
    null, or 0 with theirs not), exact decimal strings, and ``status``: ``missing_ours``,
    ``drift`` (|delta| beyond ``tolerance_pct`` of ours) or ``match``."""

    request_id: str
    started_at: str
    provider: str | None
    model: str | None
    api_key_id: str | None
    upstream_account: str | None
    settled: bool
    ours: str | None
    theirs: str
    delta: str | None
    delta_pct: str | None
    status: Literal["missing_ours", "drift", "match"]


class CallDriftList(BaseModel):
    """``{"data": [row, …], "next_cursor": …}``: newest first (``started_at``, then
    ``request_id``); ``next_cursor`` null when no call follows."""

    data: list[CallDriftRow] = Field(default_factory=list)
    next_cursor: str | None = None


class CallDriftParams(BaseModel):
    """The query of ``GET /v1/drift/calls`` (read by ``parse_call_query``; for OpenAPI)."""

    since: datetime = Field(description="calls started from (RFC 3339)")
    until: datetime = Field(description="up to (exclusive), RFC 3339")
    provider: Literal["openai", "anthropic"] | None = Field(None, description="one provider")
    tolerance_pct: str | None = Field(
        None, description="percent of ours within which a call matches (default 1)"
    )
    limit: int | None = Field(
        None, description=f"calls a page, 1 to {MAX_CALLS_LIMIT} (default {DEFAULT_CALLS_LIMIT})"
    )
    cursor: str | None = Field(None, description="the next_cursor of the previous page")
