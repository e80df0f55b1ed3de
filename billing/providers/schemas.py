"""The provider report pages the service accepts, verbatim, and what one bucket of them says in
the contract's token semantics (CONTRACT "Provider reports and drift").

Accepted pages (one page of the provider API's JSON answer, parsed with ``Decimal`` for every
number with a fraction, so that money never passes through binary floating point):

- OpenAI ``GET /v1/organization/usage/completions`` (``kind`` ``usage``): ``{"object": "page",
  "data": [bucket…], "has_more", "next_page"}``, each bucket ``{"object": "bucket",
  "start_time", "end_time" (Unix seconds), "results": [organization.usage.completions.result…]}``;
  a result's ``input_tokens`` **includes** ``input_cached_tokens``, so our input is their
  difference and our cache read their cached count.
- OpenAI ``GET /v1/organization/costs`` (``kind`` ``cost``): the same page of buckets, results
  ``organization.costs.result`` with ``amount.value`` in dollars (``currency`` ``usd``).
- Anthropic ``GET /v1/organizations/usage_report/messages`` (``usage``): ``{"data": [bucket…],
  "has_more", "next_page"}``, buckets ``{"starting_at", "ending_at" (RFC 3339), "results"}``,
  results with ``uncached_input_tokens``, ``cache_read_input_tokens``, ``cache_creation``
  (``ephemeral_5m_input_tokens`` + ``ephemeral_1h_input_tokens``), ``output_tokens``; it has no
  request count.
- Anthropic ``GET /v1/organizations/cost_report`` (``cost``): the same buckets, results with
  ``amount`` a decimal string in **cents** (``currency`` ``USD``).

Fields a page carries beyond these are kept (the result is stored as received) and not read.
A result's upstream account is its ``api_key_id`` when the page is grouped by key, else its
``project_id`` (OpenAI) or ``workspace_id`` (Anthropic); its model and service tier as given
(null when the page is not grouped by them). An OpenAI cost line names no model: its
``line_item`` (``"<model>, input"``) does, and its model is the text before the last comma.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Context, Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from billing.errors import FieldError, ValidationFailed
from billing.fields import Timestamp

#: A provider page is at most a few hundred buckets of results; 8 MiB is far past one (the
#: largest body of ``POST /v1/provider-reports`` and file of ``billing providers import``).
MAX_REPORT_BYTES = 8 << 20

ProviderName = Literal["openai", "anthropic"]
ReportKind = Literal["usage", "cost"]
PROVIDERS: tuple[str, ...] = ("openai", "anthropic")
KINDS: tuple[str, ...] = ("usage", "cost")

#: The provider API each (provider, kind) page comes from, for messages and ``pull``.
ENDPOINTS: dict[tuple[str, str], str] = {
    ("openai", "usage"): "/v1/organization/usage/completions",
    ("openai", "cost"): "/v1/organization/costs",
    ("anthropic", "usage"): "/v1/organizations/usage_report/messages",
    ("anthropic", "cost"): "/v1/organizations/cost_report",
}

Count = Annotated[int, Field(ge=0, strict=True)]
Text = Annotated[str, Field(min_length=1, max_length=256)]


class _Open(BaseModel):
    """A provider object: the fields read here are checked, any other is kept as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _OpenAIUsageResult(_Open):
    object: Literal["organization.usage.completions.result"]
    input_tokens: Count
    output_tokens: Count
    input_cached_tokens: Count = 0
    num_model_requests: Count
    model: Text | None = None
    project_id: Text | None = None
    api_key_id: Text | None = None
    service_tier: Text | None = None


class _OpenAIAmount(_Open):
    value: Decimal
    currency: Literal["usd", "USD"]


class _OpenAICostResult(_Open):
    object: Literal["organization.costs.result"]
    amount: _OpenAIAmount | None = None
    line_item: Text | None = None
    project_id: Text | None = None


class _OpenAIBucket(_Open):
    object: Literal["bucket"]
    start_time: Annotated[int, Field(ge=0, strict=True)]
    end_time: Annotated[int, Field(ge=0, strict=True)]


class _OpenAIUsageBucket(_OpenAIBucket):
    results: list[_OpenAIUsageResult]


class _OpenAICostBucket(_OpenAIBucket):
    results: list[_OpenAICostResult]


class _Page(_Open):
    has_more: bool
    next_page: str | None = None


class OpenAIUsagePage(_Page):
    object: Literal["page"]
    data: list[_OpenAIUsageBucket]


class OpenAICostPage(_Page):
    object: Literal["page"]
    data: list[_OpenAICostBucket]


class _CacheCreation(_Open):
    ephemeral_5m_input_tokens: Count = 0
    ephemeral_1h_input_tokens: Count = 0


class _AnthropicUsageResult(_Open):
    uncached_input_tokens: Count
    cache_read_input_tokens: Count = 0
    cache_creation: _CacheCreation | None = None
    output_tokens: Count
    model: Text | None = None
    api_key_id: Text | None = None
    workspace_id: Text | None = None
    service_tier: Text | None = None


class _AnthropicCostResult(_Open):
    amount: Annotated[str, Field(pattern=r"^-?\d+(\.\d+)?$", max_length=64)]
    currency: Literal["USD", "usd"]
    cost_type: Text | None = None
    token_type: Text | None = None
    model: Text | None = None
    workspace_id: Text | None = None
    service_tier: Text | None = None


class _AnthropicBucket(_Open):
    starting_at: Timestamp
    ending_at: Timestamp


class _AnthropicUsageBucket(_AnthropicBucket):
    results: list[_AnthropicUsageResult]


class _AnthropicCostBucket(_AnthropicBucket):
    results: list[_AnthropicCostResult]


class AnthropicUsagePage(_Page):
    data: list[_AnthropicUsageBucket]


class AnthropicCostPage(_Page):
    data: list[_AnthropicCostBucket]


_PAGES: dict[tuple[str, str], type[_Page]] = {
    ("openai", "usage"): OpenAIUsagePage,
    ("openai", "cost"): OpenAICostPage,
    ("anthropic", "usage"): AnthropicUsagePage,
    ("anthropic", "cost"): AnthropicCostPage,
}


@dataclass(frozen=True)
class ReportLine:
    """One result of a bucket in the contract's token semantics: ``input_tokens`` excludes
    cache reads and writes; a figure the report does not give is None (a cost line's tokens,
    Anthropic's request count, a usage line's cost). ``cost_usd`` is exact USD. ``result`` is
    the provider's object as received (numbers with a fraction as ``Decimal``)."""

    model: str | None
    upstream_account: str | None
    service_tier: str | None
    requests: int | None
    input_tokens: int | None
    cache_read_input_tokens: int | None
    cache_creation_input_tokens: int | None
    output_tokens: int | None
    cost_usd: Decimal | None
    result: dict[str, Any]


@dataclass(frozen=True)
class ReportBucket:
    """One time bucket of a page: ``[start, end)`` in UTC and its lines."""

    start: datetime
    end: datetime
    lines: tuple[ReportLine, ...]


@dataclass(frozen=True)
class ReportPage:
    """A parsed page: its buckets and the cursor to the next page (None: the last)."""

    buckets: tuple[ReportBucket, ...]
    next_page: str | None


class ReportIn(BaseModel):
    """``POST /v1/provider-reports``: which provider API's page ``report`` is."""

    model_config = ConfigDict(extra="forbid")

    provider: ProviderName
    kind: ReportKind
    report: dict[str, Any]


class ImportResult(BaseModel):
    """What an import did, bucket by bucket: ``new`` buckets stored for the first time,
    ``changed`` ones superseded by new figures, ``unchanged`` ones already stored as sent."""

    buckets: int
    new: int
    changed: int
    unchanged: int


def _utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


#: Enough digits that moving a report's decimal point never rounds (amounts are ≤ 64 chars).
_EXACT = Context(prec=100)


def _lines(provider: str, kind: str, bucket: Any) -> tuple[ReportLine, ...]:
    lines = []
    for result in bucket.results:
        raw = result.model_dump(mode="python", by_alias=True)
        if (provider, kind) == ("openai", "usage"):
            cached = min(result.input_cached_tokens, result.input_tokens)
            line = ReportLine(
                result.model,
                result.api_key_id or result.project_id,
                result.service_tier,
                result.num_model_requests,
                result.input_tokens - cached,
                cached,
                0,
                result.output_tokens,
                None,
                raw,
            )
        elif (provider, kind) == ("openai", "cost"):
            model = result.line_item.rpartition(",")[0].strip() if result.line_item else None
            line = ReportLine(
                model or None,
                result.project_id,
                None,
                None,
                None,
                None,
                None,
                None,
                None if result.amount is None else result.amount.value,
                raw,
            )
        elif kind == "usage":
            creation = result.cache_creation or _CacheCreation()
            line = ReportLine(
                result.model,
                result.api_key_id or result.workspace_id,
                result.service_tier,
                None,
                result.uncached_input_tokens,
                result.cache_read_input_tokens,
                creation.ephemeral_5m_input_tokens + creation.ephemeral_1h_input_tokens,
                result.output_tokens,
                None,
                raw,
            )
        else:
            line = ReportLine(
                result.model,
                result.workspace_id,
                result.service_tier,
                None,
                None,
                None,
                None,
                None,
                Decimal(result.amount).scaleb(-2, _EXACT),
                raw,
            )
        lines.append(line)
    return tuple(lines)


def _path(loc: tuple[int | str, ...]) -> str:
    path = "report"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_page(provider: str, kind: str, report: Any) -> ReportPage:
    """``report`` (a provider page as parsed JSON) as buckets in the contract's semantics.

    Raises ``ValidationFailed`` (422) naming the page expected and every problem, with paths
    such as ``report.data[0].results[2].input_tokens``, for a page that is not of this
    provider's ``kind`` (or a bucket that ends before it starts)."""
    expected = f"a page of {provider} GET {ENDPOINTS[(provider, kind)]}"
    try:
        page = _PAGES[(provider, kind)].model_validate(report)
    except ValidationError as error:
        raise ValidationFailed(
            [
                FieldError(None, _path(e["loc"]), f"expected {expected}: {e['msg']}")
                for e in error.errors(include_url=False)[:50]
            ]
        ) from None
    buckets = []
    problems = []
    for i, bucket in enumerate(page.data):  # type: ignore[attr-defined]
        if isinstance(bucket, _OpenAIBucket):
            start, end = _utc(bucket.start_time), _utc(bucket.end_time)
        else:
            start, end = bucket.starting_at, bucket.ending_at
        if end <= start:
            problems.append(
                FieldError(None, f"report.data[{i}]", "a bucket must end after it starts")
            )
        buckets.append(ReportBucket(start, end, _lines(provider, kind, bucket)))
    if problems:
        raise ValidationFailed(problems)
    return ReportPage(tuple(buckets), page.next_page if page.has_more else None)
