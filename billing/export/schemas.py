"""The shapes of the finance exports (CONTRACT "Export"): their query parameters.

``billing.export.params.parse_params`` reads the query string; these models declare it in
OpenAPI. The answers are CSV (``billing.export.columns`` lists the columns).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field

from billing.export.columns import DEFAULT_GROUP_BY, GROUP_KEYS


class CallsCsvParams(BaseModel):
    """The query of ``GET /v1/exports/calls.csv``: the period ``[since, until)`` of booking."""

    since: AwareDatetime = Field(description="start (inclusive), RFC 3339 with an offset")
    until: AwareDatetime = Field(description="end (exclusive), RFC 3339 with an offset")
    format: Literal["v1", "v2", "v3"] | None = Field(
        None,
        description="v1 (default: the v1 columns), v2 (the v2 columns after them) or v3 (v2's, "
        "then the failure policy, leakage_usd and provider_cost_usd)",
    )


class UsageCsvParams(CallsCsvParams):
    """The query of ``GET /v1/exports/usage.csv``: the period, the groups and their zone."""

    group_by: str | None = Field(
        None,
        description=(
            f"comma list of {', '.join(GROUP_KEYS)} (default {','.join(DEFAULT_GROUP_BY)})"
        ),
    )
    tz: str | None = Field(None, description="IANA zone where hours, days and months begin")
    customer_id: str | None = Field(
        None, max_length=128, description="only the entries charged to this customer (v2)"
    )


class FocusCsvParams(BaseModel):
    """(v3) The query of ``GET /v1/exports/focus.csv``: the month of booking, in UTC."""

    period: str = Field(pattern=r"^\d{4}-(0[1-9]|1[0-2])$", description="a month, YYYY-MM")
