"""Model prices versioned by ``effective_from`` (CONTRACT "Cost"), per served tier, with unit and
long-context prices (CONTRACT "Usage dimensions (v2)"): their rows, their versions as posted and
answered, and the price in force at a time (``PriceBook``). Storing and loading them:
``billing.pricing.service``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter, mul
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Row

from billing.dimensions import Tokens
from billing.money import uusd_per_mtok_to_str
from billing.pricing.schemas import PriceIn
from billing.rates import PART_OF, RATE_COLUMNS, RATE_FIELDS, RATE_NAMES, RATED_BUCKETS
from billing.storage.models import Price
from billing.timefmt import rfc3339


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``attrgetter(*names)`` that answers a tuple for a single name too."""
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return attrgetter(*names)


#: A ``Tokens``'s billed buckets, in ``RATES`` order.
_rated_tokens = _getter(RATED_BUCKETS)
#: A stored ``Price``'s rates (its columns), in ``RATES`` order.
_stored_rates = _getter(RATE_COLUMNS)
#: A ``PriceIn``'s rates, in ``RATES`` order.
_posted_rates = _getter(RATE_FIELDS)


class PriceRow:
    """A stored price: ``id``, ``model``, ``effective_from`` and its ``rates`` in micro-USD per
    million tokens in ``billing.rates.RATES`` order, each also an attribute named after
    its rate (``input``, ``output``, ``cache_read``, ``cache_creation``, ``cache_creation_1h``).
    v2: ``service_tier`` (None: any tier without a price of its own), ``above_input_tokens``
    (0: the price; more: the long-context prices of the same price, for an attempt whose input,
    cache read and cache creation tokens exceed it) and ``unit_prices`` (unit name → micro-USD per
    unit). v3: ``inference_geo`` (None: any geo without a price of its own). A value: never
    changed once built. ``PriceRow(id, model, effective_from, *rates)``.
    """

    __slots__ = (
        "above_input_tokens",
        "effective_from",
        "id",
        "inference_geo",
        "model",
        "rates",
        "service_tier",
        "unit_prices",
        *RATE_NAMES,
    )

    def __init__(
        self,
        id: int,
        model: str,
        effective_from: datetime,
        *rates: int,
        service_tier: str | None = None,
        above_input_tokens: int = 0,
        unit_prices: Mapping[str, int] | None = None,
        inference_geo: str | None = None,
    ) -> None:
        if len(rates) != len(RATE_NAMES):
            raise TypeError(f"a price has {len(RATE_NAMES)} rates ({', '.join(RATE_NAMES)})")
        self.id = id
        self.model = model
        self.effective_from = effective_from
        self.rates: tuple[int, ...] = rates
        self.service_tier = service_tier
        self.inference_geo = inference_geo
        self.above_input_tokens = above_input_tokens
        self.unit_prices: dict[str, int] = dict(sorted((unit_prices or {}).items()))
        for name, rate in zip(RATE_NAMES, rates, strict=True):
            setattr(self, name, rate)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> int:
            """A rate by its name (``price.input``): micro-USD per million tokens."""

    def _key(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.model,
            self.effective_from,
            self.rates,
            self.service_tier,
            self.above_input_tokens,
            tuple(self.unit_prices.items()),
            self.inference_geo,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PriceRow) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        rates = ", ".join(f"{n}={r}" for n, r in zip(RATE_NAMES, self.rates, strict=True))
        return (
            f"PriceRow(id={self.id}, model={self.model!r}, {self.effective_from}, {rates}, "
            f"tier={self.service_tier!r}, above={self.above_input_tokens}, "
            f"units={self.unit_prices!r}, geo={self.inference_geo!r})"
        )

    def cost_pusd(self, tokens: Tokens) -> int:
        """The exact cost of ``tokens`` at these rates, in picodollars (a rate in micro-USD per
        million tokens is the price of one token in picodollars). A bucket that is a part of
        another (``PART_OF``: one-hour cache writes) is billed at its own rate and taken back at
        the other's, in which it is counted too."""
        rated = _rated_tokens(tokens)
        cost: int = sum(map(mul, rated, self.rates))
        for part, whole in PART_OF:
            cost -= rated[part] * self.rates[whole]
        return cost

    def units_cost_pusd(self, units: Mapping[str, int]) -> int | None:
        """The exact cost of ``units`` (unit name → count) at ``unit_prices``, in picodollars;
        None when a unit with a non-zero count has no price (the line is then unpriced: never
        silently free, CONTRACT "Usage dimensions (v2)")."""
        cost = 0
        for name, count in units.items():
            if not count:
                continue
            rate = self.unit_prices.get(name)
            if rate is None:
                return None
            cost += count * rate * PICO_PER_MICRO
        return cost

    def rates_json(self) -> dict[str, Any]:
        """The rates as decimal strings in USD per million tokens, by API field."""
        return {f: uusd_per_mtok_to_str(r) for f, r in zip(RATE_FIELDS, self.rates, strict=True)}

    def as_json(self, long_context: PriceRow | None = None) -> dict[str, Any]:
        """The API form: rates as decimal strings in USD per million tokens, unit prices in USD
        per unit, and ``long_context`` (its row, if the price has one)."""
        return {
            "model": self.model,
            "effective_from": rfc3339(self.effective_from),
            "service_tier": self.service_tier,
            "inference_geo": self.inference_geo,
            **self.rates_json(),
            "unit_prices": (
                {n: uusd_per_mtok_to_str(r) for n, r in self.unit_prices.items()}
                if self.unit_prices
                else None
            ),
            "long_context": (
                {"above_input_tokens": long_context.above_input_tokens, **long_context.rates_json()}
                if long_context is not None
                else None
            ),
        }


#: Picodollars per micro-USD: a unit price is held in micro-USD per unit.
PICO_PER_MICRO = 1_000_000


def unit_prices_text(unit_prices: Mapping[str, int] | None) -> str | None:
    """Unit prices (micro-USD per unit) as the canonical JSON text stored on a price and a
    ledger entry: sorted, compact; None when there are none."""
    if not unit_prices:
        return None
    return json.dumps(dict(sorted(unit_prices.items())), separators=(",", ":"))


def _unit_prices(text: str | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in json.loads(text).items()} if text else {}


def price_row(price: Price | Row[Any]) -> PriceRow:
    """A stored ``Price`` (or a Core row of ``prices``) as a ``PriceRow``."""
    return PriceRow(
        price.id,
        price.model,
        price.effective_from,
        *_stored_rates(price),
        service_tier=price.service_tier or None,
        above_input_tokens=price.above_input_tokens,
        unit_prices=_unit_prices(price.unit_prices),
        inference_geo=price.inference_geo or None,
    )


class PriceVersion(NamedTuple):
    """One price as posted and answered: its row and, if it has long-context prices, theirs."""

    price: PriceRow
    long_context: PriceRow | None

    def as_json(self) -> dict[str, Any]:
        """The API form (``PriceOut``)."""
        return self.price.as_json(self.long_context)


def versions_of(rows: Sequence[PriceRow]) -> list[PriceVersion]:
    """Rows of one or more prices grouped by identity (model, tier, effective_from), in order."""
    base: dict[tuple[Any, ...], PriceRow] = {}
    long: dict[tuple[Any, ...], PriceRow] = {}
    for row in rows:
        identity = (row.model, row.service_tier or "", row.inference_geo or "", row.effective_from)
        (long if row.above_input_tokens else base)[identity] = row
    return [PriceVersion(row, long.get(identity)) for identity, row in base.items()]


def posted_rows(price: PriceIn) -> tuple[PriceRow, PriceRow | None]:
    """The rows of a posted price (ids 0: not stored yet)."""
    units = dict(price.unit_prices or {})
    base = PriceRow(
        0,
        price.model,
        price.effective_from,
        *_posted_rates(price),
        service_tier=price.service_tier,
        unit_prices=units,
        inference_geo=price.inference_geo,
    )
    long = None
    if price.long_context is not None:
        long = PriceRow(
            0,
            price.model,
            price.effective_from,
            *_posted_rates(price.long_context),
            service_tier=price.service_tier,
            above_input_tokens=price.long_context.above_input_tokens,
            unit_prices=units,
            inference_geo=price.inference_geo,
        )
    return base, long


def shape(version: PriceVersion) -> tuple[Any, ...]:
    """What decides whether a posted price equals a stored one (everything but the ids)."""
    return tuple(
        None if row is None else row._key()[1:] for row in (version.price, version.long_context)
    )


class PriceBook:
    """Prices loaded for a set of models, answering "the price in force at time t" in memory."""

    def __init__(self, rows: Sequence[PriceRow]) -> None:
        # By (model, tier or '', geo or ''): the prices by effective_from, each with its
        # long-context rows (highest threshold first).
        self._by_key: dict[tuple[str, str, str], list[tuple[PriceRow, list[PriceRow]]]] = {}
        longs: dict[tuple[str, str, str, datetime], list[PriceRow]] = {}
        for row in sorted(rows, key=lambda r: (r.effective_from, -r.above_input_tokens)):
            key = (row.model, row.service_tier or "", row.inference_geo or "")
            if row.above_input_tokens:
                longs.setdefault((*key, row.effective_from), []).append(row)
            else:
                self._by_key.setdefault(key, []).append((row, []))
        for key, versions in self._by_key.items():
            for row, long in versions:
                long.extend(longs.get((*key, row.effective_from), ()))

    def at(
        self,
        model: str | None,
        when: datetime | None,
        service_tier: str | None = None,
        context_tokens: int = 0,
        inference_geo: str | None = None,
    ) -> PriceRow | None:
        """The price of ``model`` in force at ``when`` (latest ``effective_from`` ≤ when) for
        usage served at ``service_tier`` and (v3) ``inference_geo``: the price of both, else of
        fewer (the tier's without a geo, then the geo's without a tier, then the price of
        neither), CONTRACT "Usage dimensions (v2)" and "Non-streaming calls, hosted-tool fees,
        provider-reported cost (v3)"; its long-context prices when ``context_tokens`` (input +
        cache read + cache creation of the attempt) exceed their threshold."""
        if model is None or when is None:
            return None
        found = None
        tier = service_tier or ""
        geo = inference_geo or ""
        for key in dict.fromkeys(((tier, geo), (tier, ""), ("", geo), ("", ""))):
            versions = self._by_key.get((model, *key))
            if versions is not None:
                found = self._in_force(versions, when)
                if found is not None:
                    break
        if found is None:
            return None
        row, long = found
        for candidate in long:
            if context_tokens > candidate.above_input_tokens:
                return candidate
        return row

    @staticmethod
    def _in_force(
        versions: Sequence[tuple[PriceRow, list[PriceRow]]], when: datetime
    ) -> tuple[PriceRow, list[PriceRow]] | None:
        found = None
        for version in versions:
            if version[0].effective_from <= when:
                found = version
            else:
                break
        return found
