"""The shapes of budgets, their status, the spend check and alerts (CONTRACT "Budgets and
alerts (v2)"). Money is exact decimal text in USD; thresholds are fractions of the limit."""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.json_schema import WithJsonSchema

from billing import destinations
from billing.budgets.periods import zone
from billing.fields import Id128, PublicId, no_control
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


class Scope(BaseModel):
    """Exactly one of ``api_key_id`` (a key) or ``customer_id`` (every key of a customer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key_id: PublicId | None = None
    customer_id: Id128 | None = None

    @model_validator(mode="after")
    def _one(self) -> Scope:
        if (self.api_key_id is None) == (self.customer_id is None):
            raise ValueError('must be {"api_key_id": "…"} or {"customer_id": "…"}')
        return self

    def as_json(self) -> dict[str, str]:
        if self.api_key_id is not None:
            return {"api_key_id": self.api_key_id}
        assert self.customer_id is not None
        return {"customer_id": self.customer_id}


class BudgetChange(BaseModel):
    """A budget's definition, as ``PUT /v1/budgets/{budget_id}`` takes it (the whole budget)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Scope
    limit_usd: LimitUsd = Field(description="USD, a positive decimal, at most 12 decimal places")
    measure: Literal["charge", "cost"] = "charge"  # measure.DEFAULT_MEASURE
    period: Literal["day", "week", "month", "total"]
    tz: TimeZone = Field(default="UTC", description="IANA zone of the calendar; weeks: Monday")
    thresholds: Thresholds = Field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS),
        description="fractions of the limit, ascending, each in (0, ∞)",
    )
    webhook_url: WebhookUrl = Field(default=None, description="http(s) URL for the alerts")


class BudgetIn(BudgetChange):
    """``POST /v1/budgets``: a new budget."""

    budget_id: Id128


class BudgetOut(BaseModel):
    """A budget's definition (the version in force, or the last one of an ended budget)."""

    budget_id: str
    version: int
    scope: dict[str, str]
    limit_usd: Usd
    measure: str
    period: str
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
    scope: dict[str, str]
    limit_usd: Usd
    measure: str
    period: str
    period_start: str
    period_end: str | None
    spent_usd: Usd
    settled_usd: Usd
    provisional_usd: Usd
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
