"""The shapes of prices (CONTRACT "Cost"): as posted (``PriceIn``) and as answered
(``PriceOut``, ``PriceList``), one rate field per rate of ``billing.pricing.rates``."""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, create_model
from pydantic.json_schema import WithJsonSchema

from billing.ingest.schemas import ModelName, Timestamp
from billing.pricing.money import MAX_PRICE_USD_PER_MTOK, parse_price
from billing.pricing.rates import RATES

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


_POSTED: dict[str, Any] = {
    "model": (ModelName, ...),
    "effective_from": (Timestamp, ...),
    **{r.field: (PostedRate, Field(description=_describe(r.bucket.name))) for r in RATES},
}
_PriceInFields: Any = cast(
    Any,
    create_model("_PriceInFields", __config__=ConfigDict(extra="forbid", frozen=True), **_POSTED),
)


class PriceIn(_PriceInFields):  # type: ignore[misc]
    """A price as posted (``POST /v1/prices``, ``billing prices load``): the model, the instant
    from which it applies, and one rate per priced bucket (see ``billing.pricing.rates``), each
    held here as micro-USD per million tokens."""


_ANSWERED: dict[str, Any] = {
    "model": (str, ...),
    "effective_from": (AwareDatetime, ...),
    **{r.field: (Rate, Field(description=f"USD per million {r.bucket.name}")) for r in RATES},
}
_PriceOutFields: Any = cast(
    Any, create_model("_PriceOutFields", __config__=ConfigDict(extra="forbid"), **_ANSWERED)
)


class PriceOut(_PriceOutFields):  # type: ignore[misc]
    """A stored price; its rates as decimal strings of USD per million tokens."""


class PriceList(BaseModel):
    """``GET /v1/prices``: prices by model, then ``effective_from``."""

    model_config = ConfigDict(extra="forbid")

    data: list[PriceOut]
