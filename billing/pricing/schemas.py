"""The shapes of prices (CONTRACT "Cost"): as posted (``PriceIn``) and as answered
(``PriceOut``, ``PriceList``), one rate field per rate of ``billing.rates``."""

from __future__ import annotations

from typing import Annotated, Any, cast

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

from billing.fields import (
    MAX_TOKENS,
    MAX_UNITS,
    InferenceGeo,
    ModelName,
    ServiceTier,
    Timestamp,
    UnitName,
)
from billing.money import MAX_PRICE_USD_PER_MTOK, parse_price
from billing.rates import RATES
from billing.rates import Rate as Rate_

#: A rate as posted: a decimal string (or an integer) of USD per million tokens with at most 6
#: decimal places, held as micro-USD per million tokens (``parse_price``).
PostedRate = Annotated[
    int,
    BeforeValidator(parse_price),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                {"type": "integer", "minimum": 0},
            ],
            "examples": ["0.30"],
        }
    ),
]
#: A rate as answered: a decimal string of USD per million tokens ("0.3", "15").
Rate = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?$")]
#: A cost as answered: an exact decimal string of USD, negative on an adjustment that takes cost
#: back ("0.0000075", "-0.5", "0").
Usd = Annotated[str, Field(pattern=r"^-?[0-9]+(\.[0-9]+)?$")]


def _describe(usd_per_mtok: str) -> str:
    return f"USD per million {usd_per_mtok}, at most 6 decimal places, ≤ {MAX_PRICE_USD_PER_MTOK}"


def _rate_field(rate: Rate_) -> tuple[Any, Any]:
    """A posted rate: required, or for a part of another bucket (``Rate.default``) optional,
    None meaning "at the other bucket's rate" (``PriceIn`` fills it in)."""
    info = _describe(rate.bucket.name)
    if rate.default is None:
        return (PostedRate, Field(description=info))
    info += f"; without it, at the {rate.default}"
    return (PostedRate | None, Field(default=None, description=info))


#: The posted rates, one per rate of ``billing.rates``.
_RATES_POSTED: dict[str, Any] = {r.field: _rate_field(r) for r in RATES}


def _with_defaults(model: Any) -> Any:
    """Each rate left out that may be (``Rate.default``) takes the rate it defaults to, once
    both are validated (an after-validator: a bad rate is reported once, under its own field,
    never again under a rate that defaults to it). ``RATES`` lists a default before the rates
    that default to it."""
    for rate in RATES:
        if rate.default is not None and getattr(model, rate.field) is None:
            object.__setattr__(model, rate.field, getattr(model, rate.default))
    return model


_LongContextFields: Any = cast(
    Any,
    create_model(
        "_LongContextFields",
        __config__=ConfigDict(extra="forbid", frozen=True),
        above_input_tokens=(
            Annotated[int, Field(ge=1, le=MAX_TOKENS, strict=True)],
            Field(description="the threshold: input + cache read + cache creation tokens above it"),
        ),
        **_RATES_POSTED,
    ),
)


class LongContextIn(_LongContextFields):  # type: ignore[misc]
    """The prices of a whole attempt whose input + cache read + cache creation tokens exceed
    ``above_input_tokens`` (CONTRACT "Usage dimensions (v2)"); micro-USD per million tokens."""

    _defaults = model_validator(mode="after")(_with_defaults)


#: A unit's price as posted: USD per unit, a decimal string with at most 6 decimal places (held
#: as micro-USD per unit).
UnitPrices = Annotated[dict[UnitName, PostedRate], Field(max_length=MAX_UNITS)]

_POSTED: dict[str, Any] = {
    "model": (ModelName, ...),
    "effective_from": (Timestamp, ...),
    "service_tier": (
        ServiceTier | None,
        Field(default=None, description="the served tier it applies to (none: every other tier)"),
    ),
    "inference_geo": (
        InferenceGeo | None,
        Field(
            default=None,
            description="(v3) the inference geo it applies to (none: every other geo)",
        ),
    ),
    **_RATES_POSTED,
    "unit_prices": (
        UnitPrices | None,
        Field(
            default=None, description='unit name → USD per unit ({"web_search_requests": "0.01"})'
        ),
    ),
    "long_context": (LongContextIn | None, Field(default=None)),
}
_PriceInFields: Any = cast(
    Any,
    create_model("_PriceInFields", __config__=ConfigDict(extra="forbid", frozen=True), **_POSTED),
)


class PriceIn(_PriceInFields):  # type: ignore[misc]
    """A price as posted (``POST /v1/prices``, ``billing prices load``): the model, the served
    tier it applies to (None: any tier without a price of its own), the instant from which it
    applies, and one rate per priced bucket (see ``billing.rates``), each held here as
    micro-USD per million tokens (a rate that may be left out takes the one it defaults to);
    v2: ``unit_prices`` (micro-USD per unit) and ``long_context``. Identified by (model,
    service_tier, effective_from) (CONTRACT "Cost", "Usage dimensions (v2)")."""

    _defaults = model_validator(mode="after")(_with_defaults)


def _answered_rates() -> dict[str, Any]:
    return {r.field: (Rate, Field(description=f"USD per million {r.bucket.name}")) for r in RATES}


_LongContextOut: Any = cast(
    Any,
    create_model(
        "LongContextOut",
        __config__=ConfigDict(extra="forbid"),
        above_input_tokens=(int, ...),
        **_answered_rates(),
    ),
)

_ANSWERED: dict[str, Any] = {
    "model": (str, ...),
    "effective_from": (AwareDatetime, ...),
    "service_tier": (str | None, None),
    "inference_geo": (str | None, None),
    **_answered_rates(),
    "unit_prices": (dict[str, Rate] | None, None),
    "long_context": (_LongContextOut | None, None),
}
_PriceOutFields: Any = cast(
    Any, create_model("_PriceOutFields", __config__=ConfigDict(extra="forbid"), **_ANSWERED)
)


class PriceOut(_PriceOutFields):  # type: ignore[misc]
    """A stored price; its rates as decimal strings of USD per million tokens (unit prices: USD
    per unit)."""


class PriceList(BaseModel):
    """``GET /v1/prices``: prices by model, then ``effective_from``."""

    model_config = ConfigDict(extra="forbid")

    data: list[PriceOut]
