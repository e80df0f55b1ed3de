"""(v3) The ledger of a month in the FOCUS format (CONTRACT "Observability and standard exports
(v3)"): ``GET /v1/exports/focus.csv?period=YYYY-MM`` and ``billing export focus``.

One row per ledger line and token class (input, cache read, cache writes, one-hour cache writes,
output; then one per unit of a hosted tool), each with its own quantity, unit price and cost, so
that the cost columns of a line's rows add up to the line's ``cost_usd`` exactly (a line whose
cost is not its tokens and units at its rates, a provider-reported cost say, gets one more row,
``remainder``, for the difference): the ``BilledCost`` of the export sums to the ledger of the
period. Decimals are exact (``pusd_cell``). An unpriced line's rows cost ``0`` with an empty unit
price and ``x_Unpriced`` = ``true``.

The rows are the lines booked in the month (UTC), as every export reads the ledger by booking
time: what is exported for a closed month never changes. A line of a call that has a line booked
before the month (a late event, a new price, a changed plan reaching a closed month) is a
correction: ``ChargeClass`` = ``Correction``. The cost is what the provider bills (the ledger's
``cost_usd``); ``ListCost``, ``ContractedCost`` and ``EffectiveCost`` equal ``BilledCost``
(no discounts or commitments are known here).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from billing.calllog.params import query_problems
from billing.errors import FieldError, ValidationFailed
from billing.export.csvwriter import ChunkWriter, neutralise, pusd_cell
from billing.export.repository import repository
from billing.export.sql.common import FOCUS_TOKENS
from billing.pricing.prices import PICO_PER_MICRO
from billing.rates import PART_OF
from billing.rollups.buckets import HOUR, floor
from billing.storage.db import read_transaction
from billing.timefmt import month_bounds, rfc3339

#: The FOCUS columns written, in order (FOCUS 1.2), then this service's own (``x_``).
FOCUS_COLUMNS = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
    "x_EntryId",
    "x_TokenClass",
    "x_Unpriced",
)
#: ``x_TokenClass`` of each ``FOCUS_TOKENS`` bucket (one-hour cache writes are billed at their
#: own rate, and taken out of the cache writes' row: ``PART_OF``).
TOKEN_CLASSES = ("input", "output", "cache_read", "cache_creation", "cache_creation_1h")
#: The columns whose cells are numbers (never prefixed by ``neutralise``: a negative cost
#: stays a number).
_NUMERIC = frozenset(
    (
        "BilledCost",
        "ConsumedQuantity",
        "ContractedCost",
        "ContractedUnitPrice",
        "EffectiveCost",
        "ListCost",
        "ListUnitPrice",
        "PricingQuantity",
    )
)
#: Lines fetched per chunk.
CHUNK_LINES = 2000


@dataclass(frozen=True)
class FocusPeriod:
    """A month in UTC: ``[since, until)``."""

    since: datetime
    until: datetime

    @property
    def label(self) -> str:
        return self.since.strftime("%Y-%m")


def parse_period(value: str | None, query: Iterable[tuple[str, str]] = ()) -> FocusPeriod:
    """``YYYY-MM`` → the month in UTC; ``ValidationFailed`` (422) naming ``query.period`` (and
    each unknown or repeated parameter of ``query``, the whole query string)."""
    errors = query_problems(query, ("period",))
    bounds = None
    try:
        if value is None:
            raise ValueError("is required, a month YYYY-MM such as 2026-11")
        bounds = month_bounds(value)
    except ValueError as error:
        errors.append(FieldError(None, "query.period", str(error)))
    if errors or bounds is None:
        raise ValidationFailed(errors)
    return FocusPeriod(*bounds)


#: A row's ``PricingUnit`` by its ``ConsumedUnit``: tokens are priced per million (as the
#: prices are stated), units one by one.
_PRICING_UNITS = {"Tokens": "1000000 Tokens", "Units": "Units", "Charges": "Charges"}


def _pricing_quantity(quantity: int, unit: str) -> str:
    """``PricingQuantity``, exact, always with six decimals (FOCUS types it Decimal, and a
    column of whole numbers would read as integers): tokens in millions, else the count."""
    whole = abs(quantity) * (1 if unit == "Tokens" else 10**6)
    sign = "-" if quantity < 0 else ""
    return f"{sign}{whole // 10**6}.{whole % 10**6:06d}"


def _usd_per(rate: int | None, scale: int) -> str | None:
    """A rate in picodollars per ``scale`` tokens or units → exact USD per one."""
    return None if rate is None else pusd_cell(rate * scale)


class _Lines:
    """Turns ledger lines into FOCUS rows (one object per export)."""

    def __init__(self, period: FocusPeriod) -> None:
        self.billing = (rfc3339(period.until), rfc3339(period.since))
        self.n = len(FOCUS_TOKENS)

    def rows(self, line: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
        entry_id, kind, booked, request_id, key, model, provider, customer, price_id = line[:9]
        tokens = list(line[9 : 9 + self.n])
        rates = list(line[9 + self.n : 9 + 2 * self.n])
        cost, units, unit_prices, correction = line[9 + 2 * self.n :]
        for part, whole in PART_OF:
            tokens[whole] -= tokens[part]  # the cache writes' row bills the rest at its rate
        start = floor(HOUR, booked)
        common = {
            "provider": provider or "unknown",
            "model": model or "",
            "key": key or "",
            "customer": customer or "",
            "request_id": request_id,
            "price_id": "" if price_id is None else str(price_id),
            "start": rfc3339(start),
            "end": rfc3339(start + timedelta(hours=1)),
            "class": "Correction" if correction else None,
            "entry_id": str(entry_id),
            "kind": kind,
            "unpriced": "false" if cost is not None else "true",
        }
        billed = 0
        for name, count, rate in zip(TOKEN_CLASSES, tokens, rates, strict=True):
            if count == 0:
                continue
            amount = None if cost is None or rate is None else count * rate
            billed += amount or 0
            price = _usd_per(rate, 10**6)  # USD per million tokens
            yield self._row(common, name, count, "Tokens", amount, price)
        for name, count in sorted(json.loads(units).items()) if units else ():
            if count == 0:
                continue
            prices = json.loads(unit_prices) if unit_prices else {}
            rate = prices.get(name)
            amount = None if cost is None or rate is None else count * rate * PICO_PER_MICRO
            billed += amount or 0
            price = _usd_per(rate, PICO_PER_MICRO)
            yield self._row(common, f"unit:{name}", count, "Units", amount, price)
        if cost is not None and cost != billed:
            yield self._row(common, "remainder", 1, "Charges", cost - billed, None)

    def _row(
        self,
        c: dict[str, Any],
        token_class: str,
        quantity: int,
        unit: str,
        amount: int | None,
        price: str | None,
    ) -> tuple[Any, ...]:
        money = pusd_cell(amount or 0)
        account = c["customer"] or c["key"] or "unassigned"
        provider, model, key = c["provider"], c["model"] or "unknown", c["key"] or None
        cells = {
            "BilledCost": money,
            "BillingAccountId": account,
            "BillingAccountName": account,
            "BillingAccountType": "Customer" if c["customer"] else "API key",
            "BillingCurrency": "USD",
            "BillingPeriodEnd": self.billing[0],
            "BillingPeriodStart": self.billing[1],
            "ChargeCategory": "Usage",
            "ChargeClass": c["class"],
            "ChargeDescription": f"{model} {token_class} ({c['kind']})",
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodEnd": c["end"],
            "ChargePeriodStart": c["start"],
            "ConsumedQuantity": quantity,
            "ConsumedUnit": unit,
            "ContractedCost": money,
            "ContractedUnitPrice": price,
            "EffectiveCost": money,
            # No invoice is issued here: FOCUS wants it null then (InvoiceId-C-004-C).
            "InvoiceId": None,
            "InvoiceIssuerName": provider,
            "ListCost": money,
            "ListUnitPrice": price,
            "PricingCategory": "Standard",
            "PricingCurrency": "USD",
            "PricingQuantity": _pricing_quantity(quantity, unit),
            "PricingUnit": _PRICING_UNITS[unit],
            "ProviderName": provider,
            "PublisherName": provider,
            "ResourceId": c["request_id"],
            "ResourceName": c["request_id"],
            "ResourceType": "LLM call",
            "ServiceCategory": "AI and Machine Learning",
            "ServiceName": model,
            "ServiceSubcategory": "Generative AI",
            "SkuId": model,
            "SkuMeter": token_class,
            "SkuPriceId": c["price_id"] or None,
            "SubAccountId": key,
            "SubAccountName": key,
            "SubAccountType": "API key" if key else None,
            "Tags": "{}",
            "x_EntryId": c["entry_id"],
            "x_TokenClass": token_class,
            "x_Unpriced": c["unpriced"],
        }
        return tuple(
            neutralise(v) if isinstance(v, str) and k not in _NUMERIC else v
            for k, v in ((k, cells[k]) for k in FOCUS_COLUMNS)
        )


def focus_chunks(sessions: sessionmaker[Session], period: FocusPeriod) -> Iterator[bytes]:
    """The FOCUS CSV of ``period`` as UTF-8 byte chunks, the header with the first rows (the
    query runs at the first chunk: an outage fails before any byte is sent)."""
    writer = ChunkWriter()
    pending = writer.header(FOCUS_COLUMNS)
    lines = _Lines(period)
    with read_transaction(sessions) as session:
        chunks = repository(session).focus_chunks(session, period.since, period.until, CHUNK_LINES)
        for part in chunks:
            yield pending + writer.encode([row for line in part for row in lines.rows(line)])
            pending = b""
    if pending:
        yield pending
