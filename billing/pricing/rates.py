"""The rates of a price, one per priced bucket of ``billing.dimensions`` (CONTRACT "Cost").

Each priced bucket's ``price`` (``input_usd_per_mtok``) is the rate's API and CSV field, in USD per
million tokens; the database holds it in micro-USD per million tokens as ``input_uusd_per_mtok``
(the column named with ``uusd``), and ``PriceRow`` as the attribute ``input``. ``RATES`` lists them
in the order in which prices are posted, answered, booked and exported: first the buckets that
every ``stream.usage`` carries (input, output), then the others, each in declaration order.
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.dimensions import PRICED, Bucket

_SUFFIX = "_usd_per_mtok"


@dataclass(frozen=True, slots=True)
class Rate:
    """One rate: the ``bucket`` it bills, its API ``field``, its ``column`` and its ``name`` on a
    ``PriceRow``."""

    bucket: Bucket
    field: str
    column: str
    name: str


def _rate(bucket: Bucket) -> Rate:
    field = bucket.price
    if field is None or not field.endswith(_SUFFIX):
        raise ValueError(f"{bucket.name}: a price field is named <rate>{_SUFFIX}, not {field!r}")
    name = field.removesuffix(_SUFFIX)
    return Rate(bucket, field, f"{name}_uusd_per_mtok", name)


#: The rates, in the order of the API, the ledger and the CSV columns (see the module).
RATES: tuple[Rate, ...] = tuple(_rate(b) for b in sorted(PRICED, key=lambda b: not b.required))
#: The rates' API fields (USD per million tokens as decimal strings), in ``RATES`` order.
RATE_FIELDS: tuple[str, ...] = tuple(r.field for r in RATES)
#: The rates' database columns (integer micro-USD per million tokens), in ``RATES`` order.
RATE_COLUMNS: tuple[str, ...] = tuple(r.column for r in RATES)
#: The rates' ``PriceRow`` attributes, in ``RATES`` order.
RATE_NAMES: tuple[str, ...] = tuple(r.name for r in RATES)
#: The token bucket each rate bills, in ``RATES`` order.
RATED_BUCKETS: tuple[str, ...] = tuple(r.bucket.name for r in RATES)
