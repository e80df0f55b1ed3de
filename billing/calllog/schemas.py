"""The shapes of the call log and usage queries (CONTRACT "Call log and usage queries"): their
query parameters and their answers, token fields from ``billing.dimensions``.

The answers are built as dicts (``billing.calllog.views``, ``UsageRow.as_json``); these models
declare them in OpenAPI, and the tests validate real answers against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, cast, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, create_model

from billing.calllog.queries import DEFAULT_LIMIT, MAX_LIMIT, STATUSES
from billing.calllog.usage import GROUP_BY
from billing.dimensions import BUCKETS
from billing.fields import Timestamp
from billing.ingest.schemas import Event, Protocol, StreamUsage
from billing.pricing.schemas import Rate, Usd
from billing.rates import RATES
from billing.rollups.rows import BASES, CALL_START

_OUT = ConfigDict(extra="forbid")
_STATUS: Any = Literal[STATUSES]
_SOURCE: Any = StreamUsage.model_fields["source"].annotation
_COST = "exact decimal string of USD; null while unpriced"


def _tokens(minimum: int | None) -> dict[str, Any]:
    """One integer field per token bucket, described by the bucket's ``doc``."""
    return {b.name: (int, Field(ge=minimum, description=b.doc)) for b in BUCKETS}


class CallsParams(BaseModel):
    """The query of ``GET /v1/calls`` (read by ``billing.calllog.queries.parse_calls_query``)."""

    api_key_id: str | None = Field(None, max_length=128, description="only calls of this key")
    customer_id: str | None = Field(
        None, max_length=128, description="only calls charged to this customer (v2)"
    )
    model: str | None = Field(None, max_length=256, description="only calls of this model")
    status: str | None = Field(
        None, description="only calls in this status", json_schema_extra={"enum": list(STATUSES)}
    )
    since: AwareDatetime | None = Field(
        None, description="calls started at or after this instant (RFC 3339 with an offset)"
    )
    until: AwareDatetime | None = Field(
        None, description="calls started before this instant (RFC 3339 with an offset)"
    )
    limit: int | None = Field(
        None,
        ge=1,
        le=MAX_LIMIT,
        description=f"calls per page, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})",
    )
    cursor: str | None = Field(None, description="``next_cursor`` of the previous page")


class UsageParams(BaseModel):
    """The query of ``GET /v1/usage`` (read by ``billing.calllog.usage.parse_usage_query``)."""

    since: AwareDatetime = Field(
        description="start of the period, RFC 3339 with an offset (inclusive)"
    )
    until: AwareDatetime = Field(
        description="end of the period, RFC 3339 with an offset (exclusive)"
    )
    api_key_id: str | None = Field(None, max_length=128, description="only this api key")
    model: str | None = Field(None, max_length=256, description="only this model")
    customer_id: str | None = Field(
        None, max_length=128, description="only what is charged to this customer (v2)"
    )
    group_by: str | None = Field(None, description=f"comma list of {', '.join(GROUP_BY)}")
    tz: str | None = Field(
        None, description="IANA time zone where hours, days and months begin (default UTC)"
    )
    basis: str | None = Field(
        None,
        description=(
            f"{CALL_START} (default): settled calls by their start; booked: the ledger entries by "
            "booking time"
        ),
        json_schema_extra={"enum": list(BASES)},
    )


_CHARGE = (
    "what the customer is charged, exact USD (v2): at the plan's own prices, else the cost × "
    "(1 + markup_pct / 100), else the cost; null when there is no cost and no plan price"
)

_PROVIDER_COST = (
    "the cost the provider itself reported, exact USD, beside cost_usd and never billed; null: "
    "not reported (v3)"
)
_LEAKAGE = (
    "the cost that the plan's charge policy for failed calls left uncharged, exact USD; null "
    "when the cost is not known (v3)"
)
_FAILURE_CHARGE = (
    "the plan's charge policy for a failed call the entry was charged under (bill_delivered, "
    "void); null: bill (v3)"
)

_CALL: dict[str, Any] = {
    "request_id": (str, ...),
    "api_key_id": (str | None, ...),
    "model": (str | None, ...),
    "protocol": (Protocol | None, ...),
    "status": (_STATUS, ...),
    "settled": (bool, ...),
    "usage_source": (_SOURCE | None, ...),
    "started_at": (AwareDatetime | None, ...),
    "ended_at": (AwareDatetime | None, ...),
    "attempts": (int, Field(ge=0)),
    **_tokens(0),
    "cost_usd": (Usd | None, Field(description=_COST)),
    "error_type": (str | None, ...),
    "stop_reason": (str | None, ...),
    "metadata": (dict[str, str], ...),
    "anomalies": (list[str], Field(description="anomaly codes")),
    "service_tier": (str | None, Field(description="the tier the upstream served (v2)")),
    "units": (dict[str, int], Field(description="unit name → count (v2)")),
    "other_models": (
        list[dict[str, Any]],
        Field(description="tokens billed at other models' rates, per model (v2)"),
    ),
    "customer_id": (str | None, Field(description="the key's customer at the call's start (v2)")),
    "plan_id": (str | None, Field(description="the key's plan at the call's start (v2)")),
    "charge_usd": (Usd | None, Field(description=_CHARGE)),
    "leakage_usd": (Usd | None, Field(description=_LEAKAGE)),
    "provider_cost_usd": (Usd | None, Field(description=_PROVIDER_COST)),
    "cost_drift_usd": (
        Usd | None,
        Field(
            description="provider_cost_usd − cost_usd where both are known and differ; else "
            "null (v3)"
        ),
    ),
    "counters": (
        dict[str, int],
        Field(description="what the provider counts but does not bill per use (v3)"),
    ),
    "inference_geo": (str | None, Field(description="where the upstream served the call (v3)")),
}
_CallFields: Any = cast(Any, create_model("_CallFields", __config__=_OUT, **_CALL))


class Call(_CallFields):  # type: ignore[misc]
    """A call: its ids, status, times, token totals (integers) and cost."""


def _stored(model: type[BaseModel]) -> type[BaseModel]:
    """An event type as stored: as sent, ``occurred_at`` in UTC, with its ``received_at``."""
    return create_model(
        f"Stored{model.__name__}",
        __base__=model,
        __doc__=model.__doc__,
        received_at=(Timestamp, Field(description="when the service accepted it")),
    )


_STORED: Any = Annotated[
    Union[tuple(_stored(m) for m in get_args(get_args(Event)[0]))],  # noqa: UP007
    Field(discriminator="type"),
]

_ENTRY: dict[str, Any] = {
    "entry_id": (int, ...),
    "request_id": (str, ...),
    "kind": (Literal["settlement", "adjustment"], ...),
    "reason": (str, ...),
    "booked_at": (AwareDatetime, ...),
    "api_key_id": (str | None, ...),
    "model": (str | None, ...),
    "protocol": (Protocol | None, ...),
    "status": (_STATUS, ...),
    **_tokens(None),
    **{
        r.field: (
            Rate | None,
            Field(description=f"the price used: USD per million {r.bucket.name}; null: unpriced"),
        )
        for r in RATES
    },
    "cost_usd": (Usd | None, Field(description=_COST)),
    "units": (dict[str, int], Field(description="unit name → signed count (v2)")),
    "unit_prices": (dict[str, Rate], Field(description="the unit prices used: USD per unit (v2)")),
    "customer_id": (str | None, Field(description="the customer charged (v2)")),
    "plan_id": (str | None, Field(description="the plan charged under (v2)")),
    "plan_prices": (
        dict[str, Any] | None,
        Field(
            description="the plan's own prices charged (USD per million tokens, unit_prices in "
            "USD per unit); null: charged at the markup or at cost (v2)"
        ),
    ),
    "markup_pct": (
        str | None,
        Field(description="the plan's markup charged over cost, percent; null: none (v2)"),
    ),
    "charge_usd": (Usd | None, Field(description=_CHARGE)),
    "failure_charge": (str | None, Field(description=_FAILURE_CHARGE)),
    "leakage_usd": (Usd | None, Field(description=_LEAKAGE)),
    "provider_cost_usd": (Usd | None, Field(description=_PROVIDER_COST)),
}
_LedgerEntryFields: Any = cast(Any, create_model("_LedgerEntryFields", __config__=_OUT, **_ENTRY))


class LedgerEntry(_LedgerEntryFields):  # type: ignore[misc]
    """A ledger entry: signed token deltas (an adjustment may be negative), prices and cost."""


class CallDetail(Call):
    """A call with its events (by ``occurred_at``, then arrival) and its ledger entries."""

    events: list[_STORED]
    ledger_entries: list[LedgerEntry]


class CallsPage(BaseModel):
    """A page of the call log; pass ``next_cursor`` as ``cursor`` for the next page (null: no
    more calls now)."""

    model_config = _OUT

    data: list[Call]
    next_cursor: str | None


_GROUP_KEYS = {
    "api_key_id": "the group's api key (null: calls without a stream.started)",
    "model": "the group's model",
    "customer_id": "the group's customer (null: keys without one) (v2)",
    "hour": "the local hour, RFC 3339 with the zone's offset",
    "day": "the local day, YYYY-MM-DD",
    "month": "the local month, YYYY-MM",
}
_ROW: dict[str, Any] = {
    **{name: (str | None, Field(None, description=_GROUP_KEYS[name])) for name in GROUP_BY},
    "calls": (int, Field(ge=0)),
    **_tokens(None),
    "cost_usd": (Usd | None, Field(description=_COST)),
    "charge_usd": (Usd | None, Field(description=_CHARGE)),
    "leakage_usd": (Usd | None, Field(description=_LEAKAGE)),
    "units": (dict[str, int], Field(description="unit name → count (v2)")),
}
_UsageRowFields: Any = cast(Any, create_model("_UsageRowFields", __config__=_OUT, **_ROW))


class UsageRow(_UsageRowFields):  # type: ignore[misc]
    """One group: its group-by keys (only those grouped by), the call count and the totals."""


class UsagePage(BaseModel):
    """``GET /v1/usage``: one row per non-empty group, ordered by the group-by keys."""

    model_config = _OUT

    data: list[UsageRow]
