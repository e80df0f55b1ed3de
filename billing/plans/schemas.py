"""The shapes of keys and plans (CONTRACT "Keys, customers and plans (v2)"): as put or posted
(``KeyIn``, ``PlanIn``, ``PlanPriceIn``) and as answered (``KeyOut``, ``PlanOut``)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema

from billing.errors import FieldError, ValidationFailed
from billing.fields import Name, PublicId, Timestamp, not_a_secret, printable
from billing.money import format_usd
from billing.pricing.schemas import _POSTED, PriceOut, _with_defaults

#: The most decimal places of a markup: with at most 4, a markup times a cost in picodollars is
#: a whole number of picodollars whenever the price's rates are whole cents per million tokens
#: (see ``billing.plans.charges.apply_markup`` for the rare sub-picodollar remainder).
MARKUP_DECIMALS = 4
#: The markup's bounds, in percent: -100 (charge nothing) to 100,000 (a thousandfold).
MIN_MARKUP = Decimal(-100)
MAX_MARKUP = Decimal(100_000)

_MARKUP = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def parse_markup(value: object) -> str:
    """A markup in percent (a decimal string or an integer) → its canonical text (``"20"``,
    ``"12.5"``, ``"-10"``); ``ValueError`` in words for floats, non-numbers, more than
    ``MARKUP_DECIMALS`` places, or outside [-100, 100000]."""
    if isinstance(value, bool | float):
        raise ValueError('must be a decimal string such as "20" (binary floats are not exact)')
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str) or not _MARKUP.fullmatch(value):
        raise ValueError(f'{value!r} is not a plain decimal number; send one such as "20"')
    if len(value.partition(".")[2]) > MARKUP_DECIMALS:
        raise ValueError(
            f"has more than {MARKUP_DECIMALS} decimal places (a markup is exact to 0.0001 %)"
        )
    amount = Decimal(value)
    if not MIN_MARKUP <= amount <= MAX_MARKUP:
        raise ValueError(f"must be between {MIN_MARKUP} and {MAX_MARKUP} percent")
    return format_usd(amount)


#: A markup as posted and answered: canonical decimal text in percent.
Markup = Annotated[
    str,
    BeforeValidator(parse_markup),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]{1,4})?$"},
                {"type": "integer"},
            ],
            "examples": ["20"],
        }
    ),
]


_PLAN_PRICE: dict[str, Any] = {k: v for k, v in _POSTED.items() if k != "effective_from"}
_PlanPriceFields: Any = cast(
    Any,
    create_model(
        "_PlanPriceFields", __config__=ConfigDict(extra="forbid", frozen=True), **_PLAN_PRICE
    ),
)


class PlanPriceIn(_PlanPriceFields):  # type: ignore[misc]
    """A plan's own price for a model (and served tier): ``PriceIn`` without its
    ``effective_from`` (the plan version's applies); rates held as micro-USD per million tokens,
    unit prices as micro-USD per unit."""

    _defaults = model_validator(mode="after")(_with_defaults)


#: (v3) What a plan charges for a failed call of one category (CONTRACT "Charge policy for
#: failed calls (v3)"): ``bill`` (as any call), ``bill_delivered`` (output charged only as far
#: as delivered) or ``void`` (nothing).
FailureCharge = Literal["bill", "bill_delivered", "void"]


class FailureCharges(BaseModel):
    """(v3) A plan's charge policy per category of failed call; a category left out is
    ``bill``. ``estimated``: a call whose usage is only estimated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_disconnected: FailureCharge = "bill"
    upstream_error: FailureCharge = "bill"
    stalled: FailureCharge = "bill"
    estimated: FailureCharge = "bill"


class PlanIn(BaseModel):
    """``POST /v1/plans``, ``billing plans load``: one version of a plan. Identified by
    (``plan_id``, ``effective_from``): the same body again is a no-op, another a 409."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan_id: PublicId
    effective_from: Timestamp
    markup_pct: Markup = Field(
        default="0", description="percent over cost for a model without a plan price"
    )
    prices: list[PlanPriceIn] = Field(default_factory=list, max_length=1000)
    failure_charges: FailureCharges = Field(
        default_factory=FailureCharges,
        description="(v3) the charge policy for failed calls (every category: bill by default)",
    )

    @model_validator(mode="after")
    def _distinct(self) -> PlanIn:
        seen: set[tuple[str, str, str]] = set()
        for i, price in enumerate(self.prices):
            identity = (price.model, price.service_tier or "", price.inference_geo or "")
            if identity in seen:
                raise ValueError(
                    f"prices[{i}]: a second price for model {price.model!r}"
                    + (f" at tier {price.service_tier!r}" if price.service_tier else "")
                    + (f" in geo {price.inference_geo!r}" if price.inference_geo else "")
                    + "; a plan has one price per model, tier and geo"
                )
            seen.add(identity)
        return self


class PlanPriceOut(PriceOut):
    """A plan's price as answered: ``PriceOut`` (its ``effective_from`` is its version's)."""


class PlanOut(BaseModel):
    """A stored plan version."""

    model_config = ConfigDict(extra="forbid")

    plan_id: str
    effective_from: AwareDatetime
    markup_pct: str
    prices: list[PlanPriceOut]
    failure_charges: FailureCharges


class PlanList(BaseModel):
    """``GET /v1/plans``: by plan, then ``effective_from``."""

    model_config = ConfigDict(extra="forbid")

    data: list[PlanOut]


class KeyIn(BaseModel):
    """``PUT /v1/keys/{api_key_id}``: the key's customer, plan and name from ``effective_from``
    (default: now) on. A ``plan_id`` must name a plan posted before."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    customer_id: PublicId | None = None
    plan_id: PublicId | None = None
    effective_from: Timestamp | None = Field(default=None, description="default: now")
    name: Name | None = None


class KeyOut(BaseModel):
    """A key as answered: the assignment in force now (none: ``customer_id``, ``plan_id`` and
    ``name`` null, ``effective_from`` null), and every version of it, oldest first."""

    model_config = ConfigDict(extra="forbid")

    api_key_id: str
    customer_id: str | None
    plan_id: str | None
    name: str | None
    effective_from: AwareDatetime | None
    history: list[KeyVersionOut]


class KeyVersionOut(BaseModel):
    """One version of a key's assignment."""

    model_config = ConfigDict(extra="forbid")

    customer_id: str | None
    plan_id: str | None
    name: str | None
    effective_from: AwareDatetime


class KeyList(BaseModel):
    """``GET /v1/keys``: the keys with an assignment, by ``api_key_id``; ``next_cursor`` for
    the next page (null: the last)."""

    model_config = ConfigDict(extra="forbid")

    data: list[KeyOut]
    next_cursor: str | None


KeyOut.model_rebuild()


class KeysParams(BaseModel):
    """The query of ``GET /v1/keys``."""

    limit: int | None = Field(None, ge=1, le=1000, description="keys per page (default 100)")
    cursor: str | None = Field(None, description="``next_cursor`` of the previous page")


def check_public_id(value: str, path: str) -> str:
    """An id (a key's, a customer's, a grant's) as a path or argument gives it, checked as an
    event's is (printable, 1–128 characters, never a secret); ``ValidationFailed`` (422) at
    ``path``."""
    try:
        if not 1 <= len(value) <= 128:
            raise ValueError("must be printable text of 1 to 128 characters")
        return not_a_secret(printable(value))
    except ValueError as error:
        raise ValidationFailed([FieldError(None, path, str(error))]) from None


def check_key_id(api_key_id: str) -> str:
    """An ``api_key_id`` as a path or argument gives it (``check_public_id`` at
    ``path.api_key_id``)."""
    return check_public_id(api_key_id, "path.api_key_id")
