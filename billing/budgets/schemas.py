"""The shapes of budgets, their status, the spend check and alerts (CONTRACT "Budgets and
alerts (v2)"). Money is exact decimal text in USD; thresholds are fractions of the limit."""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema

from billing import destinations
from billing.budgets.periods import zone
from billing.fields import (
    CallTag,
    Id128,
    ModelName,
    PublicId,
    ServiceTier,
    TokenCount,
    UsdAmount,
    no_control,
    union_tag,
)
from billing.money import format_usd

#: The largest limit accepted, USD.
MAX_LIMIT_USD = Decimal(10) ** 9
#: A limit has at most this many decimal places (picodollars).
MAX_LIMIT_DECIMALS = 12
#: A threshold has at most this many decimal places; a budget has at most ``MAX_THRESHOLDS``.
MAX_THRESHOLD_DECIMALS = 6
MAX_THRESHOLDS = 10
MAX_URL_LENGTH = 2048
DEFAULT_THRESHOLDS = ("0.8", "1")
#: A rolling period's window, seconds (CONTRACT "Authorizations and holds (v3)").
MIN_WINDOW_S = 60
MAX_WINDOW_S = 2_592_000

_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _decimal(value: object, places: int) -> Decimal:
    if isinstance(value, (bool, float)):
        raise ValueError('must be a decimal string such as "100" (binary floats are not exact)')
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str) or not _DECIMAL.fullmatch(value):
        raise ValueError(f'{value!r} is not a positive decimal number such as "100" or "0.8"')
    if len(value.partition(".")[2]) > places:
        raise ValueError(f"has more than {places} decimal places")
    return Decimal(value)


def parse_limit(value: object) -> str:
    """A limit in USD: a positive decimal (string or integer), at most 12 decimal places and
    ``MAX_LIMIT_USD``; returned as plain decimal text. ``ValueError`` otherwise."""
    amount = _decimal(value, MAX_LIMIT_DECIMALS)
    if amount <= 0:
        raise ValueError("must be more than 0")
    if amount > MAX_LIMIT_USD:
        raise ValueError(f"must be at most {MAX_LIMIT_USD} USD")
    return format_usd(amount)


def parse_thresholds(value: object) -> list[str]:
    """Fractions of the limit: 1 to 10 decimals in (0, ∞), strictly ascending (each at most 6
    decimal places); returned as plain decimal texts. ``ValueError`` otherwise."""
    if not isinstance(value, list) or not value:
        raise ValueError('must be a non-empty list of fractions of the limit such as ["0.8", "1"]')
    if len(value) > MAX_THRESHOLDS:
        raise ValueError(f"must hold at most {MAX_THRESHOLDS} thresholds")
    amounts = []
    for i, item in enumerate(value):
        try:
            amount = _decimal(item, MAX_THRESHOLD_DECIMALS)
        except ValueError as error:
            raise ValueError(f"item {i}: {error}") from None
        if amount <= 0:
            raise ValueError(f"item {i}: must be more than 0 (a fraction of the limit)")
        amounts.append(amount)
    if any(b <= a for a, b in itertools.pairwise(amounts)):
        raise ValueError("must be in ascending order, each once")
    return [format_usd(a) for a in amounts]


def parse_tz(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be an IANA time zone name such as 'UTC' or 'America/New_York'")
    zone(value)
    return value


def parse_webhook_url(value: object) -> str | None:
    """An ``https`` or ``http`` URL with a host and no credentials, at most 2048 characters of
    printable text, whose host is no refused address (``billing.destinations.check_url``), or
    None."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be an http or https URL of at most {MAX_URL_LENGTH} characters")
    no_control(value)
    if " " in value:
        raise ValueError("must not contain spaces")
    destinations.check_url(value)
    return value


LimitUsd = Annotated[
    str,
    BeforeValidator(parse_limit),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$", "examples": ["100"]}),
]
Thresholds = Annotated[
    list[str],
    BeforeValidator(parse_thresholds),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
            "minItems": 1,
            "maxItems": MAX_THRESHOLDS,
            "examples": [list(DEFAULT_THRESHOLDS)],
        }
    ),
]
TimeZone = Annotated[
    str, BeforeValidator(parse_tz), WithJsonSchema({"type": "string", "examples": ["UTC"]})
]
WebhookUrl = Annotated[
    str | None,
    BeforeValidator(parse_webhook_url),
    WithJsonSchema({"anyOf": [{"type": "string", "format": "uri"}, {"type": "null"}]}),
]
Usd = Annotated[str, Field(pattern=r"^-?[0-9]+(\.[0-9]+)?$")]


def parse_model_filter(value: object) -> object:
    """A model name, or a prefix ending in ``*`` (``"claude-*"``); ``*`` nowhere else."""
    if isinstance(value, str) and "*" in value[:-1]:
        raise ValueError('may hold "*" only at its end (a prefix such as "claude-*")')
    if value == "*":
        raise ValueError('"*" alone names every model: leave "model" out instead')
    return value


class Scope(BaseModel):
    """Exactly one of ``api_key_id`` (a key), ``customer_id`` (every key of a customer), ``tag``
    (v3: the calls tagged with it) or ``all`` (v3: ``true``, every call)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key_id: PublicId | None = None
    customer_id: Id128 | None = None
    tag: CallTag | None = None
    all: Literal[True] | None = None

    @model_validator(mode="after")
    def _one(self) -> Scope:
        given = [v for v in (self.api_key_id, self.customer_id, self.tag, self.all) if v]
        if len(given) != 1:
            raise ValueError(
                'must be one of {"api_key_id": "…"}, {"customer_id": "…"}, {"tag": "…"} '
                'or {"all": true}'
            )
        return self


class BudgetChange(BaseModel):
    """A budget's definition, as ``PUT /v1/budgets/{budget_id}`` takes it (the whole budget)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Scope
    limit_usd: LimitUsd = Field(description="USD, a positive decimal, at most 12 decimal places")
    measure: Literal["charge", "cost"] = "charge"  # measure.DEFAULT_MEASURE
    period: Literal["day", "week", "month", "total", "rolling"]
    window_s: int | None = Field(
        default=None,
        ge=MIN_WINDOW_S,
        le=MAX_WINDOW_S,
        strict=True,
        description='seconds of a "rolling" period (and only of one)',
    )
    model: Annotated[ModelName, BeforeValidator(parse_model_filter)] | None = Field(
        default=None, description='count only this model\'s calls, or a prefix: "claude-*"'
    )
    unpriced: Literal["allow", "deny"] = Field(
        default="allow", description="what an authorization of an unpriced model gets"
    )
    tz: TimeZone = Field(default="UTC", description="IANA zone of the calendar; weeks: Monday")
    thresholds: Thresholds = Field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS),
        description="fractions of the limit, ascending, each in (0, ∞)",
    )
    webhook_url: WebhookUrl = Field(default=None, description="http(s) URL for the alerts")

    @model_validator(mode="after")
    def _window(self) -> BudgetChange:
        if (self.period == "rolling") != (self.window_s is not None):
            raise ValueError('"window_s" is required with period "rolling" and only with it')
        return self


class BudgetIn(BudgetChange):
    """``POST /v1/budgets``: a new budget."""

    budget_id: Id128


class BudgetOut(BaseModel):
    """A budget's definition (the version in force, or the last one of an ended budget)."""

    budget_id: str
    version: int
    scope: dict[str, str | bool]
    limit_usd: Usd
    measure: str
    period: str
    window_s: int | None
    model: str | None
    unpriced: Literal["allow", "deny"]
    tz: str
    thresholds: list[str]
    webhook_url: str | None
    created_at: str
    ended_at: str | None
    webhook_secret: str | None = Field(
        default=None, description="whsec_…: only in the answer of POST /v1/budgets"
    )


class BudgetList(BaseModel):
    data: list[BudgetOut]


class BudgetStatus(BaseModel):
    """``GET /v1/budgets/{budget_id}``: the spend of the current period."""

    budget_id: str
    scope: dict[str, str | bool]
    limit_usd: Usd
    measure: str
    period: str
    period_start: str
    period_end: str | None
    spent_usd: Usd = Field(description="settled_usd + provisional_usd + held_usd")
    settled_usd: Usd
    provisional_usd: Usd
    held_usd: Usd = Field(description="the live holds of authorizations whose call has no event")
    remaining_usd: Usd
    fraction_used: str
    state: Literal["ok", "warning", "exceeded"]
    thresholds_crossed: list[str]
    as_of: str


class SpendCheck(BaseModel):
    """``GET /v1/spend?api_key_id=``: the gateway's pre-call check."""

    api_key_id: str
    allowed: bool
    budgets: list[BudgetStatus]
    as_of: str


class Delivery(BaseModel):
    state: Literal["none", "pending", "delivered", "failed"]
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: str | None
    delivered_at: str | None


class AlertOut(BaseModel):
    alert_id: str
    type: Literal["budget.threshold_crossed", "budget.threshold_resolved"]
    budget_id: str
    threshold: str
    period_start: str
    created_at: str
    payload: dict[str, Any]
    delivery: Delivery


class AlertList(BaseModel):
    data: list[AlertOut]


# -- authorizations (v3) --------------------------------------------------------------------

#: An authorization's hold lasts ``ttl_s`` seconds (CONTRACT "Authorizations and holds (v3)").
MIN_TTL_S, DEFAULT_TTL_S, MAX_TTL_S = 10, 600, 3600
MAX_TAGS = 8


class TokenEstimate(BaseModel):
    """A call's estimate in tokens: priced at the model's price in force now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_tokens: TokenCount
    max_output_tokens: TokenCount


class AmountEstimate(BaseModel):
    """A call's estimate in USD."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    amount_usd: UsdAmount


def _estimate_form(value: Any) -> str | None:
    """Which form an estimate was sent in, by its fields: ``amount_usd`` names the amount form,
    any other object the token form; None (not an object) makes the union's own 422."""
    if isinstance(value, AmountEstimate) or (isinstance(value, dict) and "amount_usd" in value):
        return _AMOUNT
    if isinstance(value, TokenEstimate | dict):
        return _TOKENS
    return None


_TOKENS, _AMOUNT = union_tag("tokens"), union_tag("amount")

#: An authorization's estimate, read in the one form its fields name, so that a 422 lists that
#: form's errors only (a plain union listed both forms', each telling the sender to remove the
#: fields it meant, under the classes' names).
Estimate = Annotated[
    Annotated[TokenEstimate, Tag(_TOKENS)] | Annotated[AmountEstimate, Tag(_AMOUNT)],
    Discriminator(
        _estimate_form,
        custom_error_type="estimate_form",
        custom_error_message=(
            'must be an object: {"input_tokens", "max_output_tokens"} or {"amount_usd"}'
        ),
    ),
]


class AuthorizationIn(BaseModel):
    """``POST /v1/authorizations``: reserve before calling the upstream."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: Id128
    api_key_id: PublicId
    model: ModelName
    service_tier: ServiceTier | None = None
    tags: list[CallTag] = Field(default_factory=list, max_length=MAX_TAGS)
    estimate: Estimate
    ttl_s: int = Field(default=DEFAULT_TTL_S, ge=MIN_TTL_S, le=MAX_TTL_S, strict=True)


class AuthorizationOut(BaseModel):
    """The decision (the first one again for a repeated ``request_id``)."""

    request_id: str
    decision: Literal["allow", "deny"]
    reason: (
        Literal[
            "budget_exceeded",
            "insufficient_headroom",
            "estimate_exceeds_limit",
            "insufficient_credit",
            "unpriced",
        ]
        | None
    )
    retryable: bool
    retry_after_s: int | None
    hold_usd: Usd
    expires_at: str | None
    binding_budget_id: str | None
    budgets: list[BudgetStatus]
    as_of: str


class HoldOut(BaseModel):
    """``DELETE /v1/authorizations/{request_id}``: the hold after the release."""

    request_id: str
    state: Literal["released", "expired", "converted"]
    hold_usd: Usd
    expires_at: str
    released_at: str | None
