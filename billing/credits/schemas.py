"""The shapes of prepaid credits (CONTRACT "Prepaid credits (v3)"): a customer as put
(``CustomerIn``), a grant as posted (``GrantIn``), and their 422s."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from billing.fields import PublicId, Timestamp, printable
from billing.money import PICO, parse_usd

#: The most decimal places of a credit amount (a grant, a low-balance threshold): a micro-dollar.
CREDIT_DECIMALS = 6
#: The default priority of a grant (lower is drawn first).
DEFAULT_PRIORITY = 100


def _credit_amount(value: object, *, positive: bool) -> str:
    """An amount of credit in USD (a decimal string) → its canonical text; ``ValueError`` in
    words for a number, a negative (or, ``positive``, zero) amount or more than
    ``CREDIT_DECIMALS`` decimal places (counted in the text as sent, trailing zeros too)."""
    text = parse_usd(value)
    if isinstance(value, str) and len(value.partition(".")[2]) > CREDIT_DECIMALS:
        raise ValueError(
            f"has more than {CREDIT_DECIMALS} decimal places (credit is exact to 0.000001 USD)"
        )
    if positive and Decimal(text) == 0:
        raise ValueError("must be more than 0")
    return text


def _positive_amount(value: object) -> str:
    return _credit_amount(value, positive=True)


def _threshold_amount(value: object) -> str:
    return _credit_amount(value, positive=False)


_AMOUNT_SCHEMA = {
    "type": "string",
    "pattern": rf"^[0-9]+(\.[0-9]{{1,{CREDIT_DECIMALS}}})?$",
    "examples": ["50"],
}
#: A grant's amount: a positive decimal string of at most 6 decimal places, held as its
#: canonical text.
CreditAmount = Annotated[str, BeforeValidator(_positive_amount), WithJsonSchema(_AMOUNT_SCHEMA)]
#: A low-balance threshold: as ``CreditAmount``, 0 allowed.
ThresholdAmount = Annotated[str, BeforeValidator(_threshold_amount), WithJsonSchema(_AMOUNT_SCHEMA)]


#: Free text for people (a customer's name, a grant's note): printable, not blank.
Text256 = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(printable)]
Text1000 = Annotated[
    str, StringConstraints(min_length=1, max_length=1000), AfterValidator(printable)
]


def to_pusd(text: str) -> int:
    """A canonical amount text → picodollars (exact: at most 6 decimal places)."""
    return int(Decimal(text) * PICO)


class CustomerIn(BaseModel):
    """``PUT /v1/customers/{customer_id}``: the customer's settings (every field optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Text256 | None = None
    credit_required: StrictBool = False  # a JSON true or false, never "yes" or 1
    low_balance_usd: ThresholdAmount | None = None


class GrantIn(BaseModel):
    """``POST /v1/credits/grants``: prepaid credit for a customer or a key without a customer
    (exactly one of ``customer_id`` and ``api_key_id``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grant_id: PublicId
    customer_id: PublicId | None = None
    api_key_id: PublicId | None = None
    amount_usd: CreditAmount
    effective_at: Timestamp | None = Field(default=None, description="default: now")
    expires_at: Timestamp | None = None
    priority: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = DEFAULT_PRIORITY
    kind: Literal["purchased", "promotional"]
    note: Text1000 | None = None

    @model_validator(mode="after")
    def _one_owner(self) -> GrantIn:
        if (self.customer_id is None) == (self.api_key_id is None):
            raise ValueError(
                "name exactly one owner: customer_id or api_key_id (a key's calls draw its "
                "customer's grants once it has a customer)"
            )
        if (
            self.expires_at is not None
            and self.effective_at is not None
            and self.expires_at <= self.effective_at
        ):
            raise ValueError("expires_at must be after effective_at")
        return self


class GrantOut(BaseModel):
    """A grant as answered: what is left of it now and its state."""

    model_config = ConfigDict(extra="forbid")

    grant_id: str
    customer_id: str | None
    api_key_id: str | None
    kind: Literal["purchased", "promotional"]
    amount_usd: str
    remaining_usd: str
    effective_at: AwareDatetime
    expires_at: AwareDatetime | None
    priority: int
    note: str | None
    state: Literal["scheduled", "active", "expired", "voided"]


class BalanceOut(BaseModel):
    """An owner's credit now: ``available_usd`` = balance − held − pending."""

    model_config = ConfigDict(extra="forbid")

    customer_id: str | None
    api_key_id: str | None
    balance_usd: str
    held_usd: str
    pending_usd: str
    available_usd: str
    overdraft_usd: str
    grants: list[GrantOut]
    as_of: AwareDatetime


class CustomerOut(BaseModel):
    """A customer as answered: its settings (the defaults when never put) and its balance."""

    model_config = ConfigDict(extra="forbid")

    customer_id: str
    name: str | None
    credit_required: bool
    low_balance_usd: str | None
    balance: BalanceOut


class CustomerList(BaseModel):
    """A page of ``GET /v1/customers``."""

    model_config = ConfigDict(extra="forbid")

    data: list[CustomerOut]
    next_cursor: str | None


class CreditsManifest(BaseModel):
    """The manifest of ``credits.csv`` for a month: its rows and SHA-256, the totals to date and
    in the period, the opening and closing balance, and whether the identity holds."""

    model_config = ConfigDict(extra="forbid")

    export: Literal["credits"]
    period: str
    since: AwareDatetime
    until: AwareDatetime
    status: Literal["closed", "provisional"]
    rows: int
    sha256: str
    to_date: dict[str, str]
    in_period: dict[str, str]
    opening_balance_usd: str
    closing_balance_usd: str
    identity: str
    identity_holds: bool
