"""The rates of a price, one per priced bucket of ``billing.dimensions`` (CONTRACT "Cost").

Each priced bucket's ``price`` (``input_usd_per_mtok``) is the rate's API and CSV field, in USD per
million tokens; the database holds it in micro-USD per million tokens as ``input_uusd_per_mtok``
(the column named with ``uusd``), and ``PriceRow`` as the attribute ``input``. ``RATES`` lists them
in the order in which prices are posted, answered, booked and exported: first the buckets that
every ``stream.usage`` carries (input, output), then the others, each in declaration order.
Every rate declares its default (``billing.dimensions._bucket``'s ``price_default``): the v1
rates are required; a later rate may be left out of a price, and its tokens then cost the rate it
defaults to (one-hour cache writes cost the cache writes' rate, CONTRACT "Usage dimensions
(v2)).
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.dimensions import PRICED, REQUIRED, Bucket

_SUFFIX = "_usd_per_mtok"


@dataclass(frozen=True, slots=True)
class Rate:
    """One rate: the ``bucket`` it bills, its API ``field``, its ``column`` and its ``name`` on a
    ``PriceRow``; ``default``: the API field of the rate a price without this one bills its
    bucket at, as its bucket declares it (``Bucket.price_default``); None: every price states
    the rate (the v1 rates)."""

    bucket: Bucket
    field: str
    column: str
    name: str
    default: str | None = None


def _rate(bucket: Bucket) -> Rate:
    field = bucket.price
    if field is None or not field.endswith(_SUFFIX):
        raise ValueError(f"{bucket.name}: a price field is named <rate>{_SUFFIX}, not {field!r}")
    name = field.removesuffix(_SUFFIX)
    default = None if bucket.price_default == REQUIRED else bucket.price_default
    if default is not None and default not in {b.price for b in PRICED}:
        raise ValueError(f"{field}: its default {default!r} is not a rate")
    return Rate(bucket, field, f"{name}_uusd_per_mtok", name, default)


#: The rates, in the order of the API, the ledger and the CSV columns (see the module).
RATES: tuple[Rate, ...] = tuple(_rate(b) for b in sorted(PRICED, key=lambda b: not b.required))
#: The rates of the v1 exports' price columns (their buckets' ``since`` is 1).
V1_RATES: tuple[Rate, ...] = tuple(r for r in RATES if r.bucket.since == 1)
#: The rates the v2 exports add.
V2_RATES: tuple[Rate, ...] = tuple(r for r in RATES if r.bucket.since == 2)
#: ``(part, whole)`` positions in ``RATES`` of each rate whose bucket is a part of another's: the
#: part's tokens are counted in the whole's bucket too, so a cost takes them back at the whole's
#: rate (cost = Σ tokens × rate − Σ part tokens × whole rate).
PART_OF: tuple[tuple[int, int], ...] = tuple(
    (i, next(j for j, w in enumerate(RATES) if w.bucket.name == r.bucket.part_of))
    for i, r in enumerate(RATES)
    if r.bucket.part_of is not None
)
#: The rates' API fields (USD per million tokens as decimal strings), in ``RATES`` order.
RATE_FIELDS: tuple[str, ...] = tuple(r.field for r in RATES)
#: The rates' database columns (integer micro-USD per million tokens), in ``RATES`` order.
RATE_COLUMNS: tuple[str, ...] = tuple(r.column for r in RATES)
#: The rates' ``PriceRow`` attributes, in ``RATES`` order.
RATE_NAMES: tuple[str, ...] = tuple(r.name for r in RATES)
#: The token bucket each rate bills, in ``RATES`` order.
RATED_BUCKETS: tuple[str, ...] = tuple(r.bucket.name for r in RATES)
#: (v2) The ``ledger_entries`` columns of the plan price's rates a line was charged at (CONTRACT
#: "Keys, customers and plans (v2)"), in ``RATES`` order.
PLAN_RATE_COLUMNS: tuple[str, ...] = tuple(f"plan_{r.column}" for r in RATES)
