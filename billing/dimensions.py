"""The billable dimensions, declared once: the token buckets that every call, attempt, ledger
entry, rollup, usage row and CSV row carries (CONTRACT "Reconciliation", "Call log and usage
queries", "Export").

``Tokens`` below is the declaration: one field per bucket, in the order in which the API, the
usage rows and the CSV columns list them. Each field's metadata says where the rule reads the
bucket from (``usage``: the ``stream.usage`` field, or ``None`` for a bucket the rule derives
from counters) and which price bills it (``price``: the column of a price, in micro-USD per
million tokens, or ``None`` for a bucket that is information only). Everything else is derived
from it: ``TOKEN_FIELDS``, ``BUCKETS``, ``PRICED``, the ORM columns (``billing.storage.models``),
the ingest schema's usage fields, the rule's and the taps' lists of buckets, the rollups, the
usage rows, the CSV columns and the OpenAPI schemas. ``docs/ARCHITECTURE.md`` ("Adding a token
bucket") lists the one edit and the migration.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

#: The ``price_default`` of a rate that every price states (``_bucket``).
REQUIRED = "required"


def _bucket(
    doc: str,
    *,
    usage: str | None = None,
    required: bool = False,
    price: str | None = None,
    price_default: str | None = None,
    part_of: str | None = None,
    since: int = 1,
    derived: bool = False,
    prompt: bool = False,
    other_models: bool = False,
) -> Any:
    """A token bucket: an integer field (tokens, ≥ 0 on a call; a ledger adjustment may hold a
    negative difference), 0 by default. ``required``: ``stream.usage`` must carry ``usage``
    (otherwise it defaults to 0). ``part_of``: the bucket it is a part of (its tokens are
    counted there too, and billed at this bucket's ``price`` instead of that one's; a price
    without it bills them at that one's, see ``billing.rates``). ``since``: the export
    format that first has its column (v1 exports keep their columns, CONTRACT "Export").
    ``price_default``: what a price that leaves the rate out bills the bucket at, declared for
    every priced bucket: ``REQUIRED`` (a v1 rate: every price states it), or the API field of
    another rate (a price posted before this rate existed keeps working: its tokens cost that
    rate). A bucket of a later format cannot be ``REQUIRED``: the prices posted before it would
    be refused (checked here, at import).
    ``derived``: the rule works it out from the usage and the stream's counters (CONTRACT
    "Reconciliation") instead of taking ``usage``'s count as it is. ``prompt``: it counts
    tokens of the prompt (the input side, which a provider may report before any output).
    ``other_models``: an entry of ``stream.usage.other_models`` carries it too."""
    if price is not None and price_default is None:
        raise ValueError(f"{doc!r}: declare the default of {price}: REQUIRED or another rate")
    if price_default == REQUIRED and since > 1:
        raise ValueError(f"{price}: a rate added after v1 needs a default, not REQUIRED")
    meta = {
        "doc": doc,
        "usage": usage,
        "required": required,
        "price": price,
        "price_default": price_default,
        "part_of": part_of,
        "since": since,
        "derived": derived,
        "prompt": prompt,
        "other_models": other_models,
    }
    return field(default=0, metadata=meta)


@dataclass(slots=True)
class Tokens:
    """The billable token buckets (integers, tokens). Adds and subtracts field by field.

    A value: never changed once built (not frozen only because a frozen dataclass costs more to
    build, and the reconciler builds several per call).
    """

    input_tokens: int = _bucket(
        "input tokens billed at the full input rate (excludes cache reads and writes)",
        usage="input_tokens",
        required=True,
        price="input_usd_per_mtok",
        price_default=REQUIRED,
        prompt=True,
        other_models=True,
    )
    cache_read_input_tokens: int = _bucket(
        "input tokens read from the provider's prompt cache",
        usage="cache_read_input_tokens",
        price="cache_read_usd_per_mtok",
        price_default=REQUIRED,
        prompt=True,
        other_models=True,
    )
    cache_creation_input_tokens: int = _bucket(
        "input tokens written to the provider's prompt cache",
        usage="cache_creation_input_tokens",
        price="cache_creation_usd_per_mtok",
        price_default=REQUIRED,
        prompt=True,
        other_models=True,
    )
    cache_creation_1h_input_tokens: int = _bucket(
        'the part of the cache writes written with a one-hour lifetime (CONTRACT "Usage '
        'dimensions (v2)")',
        usage="cache_creation_1h_input_tokens",
        price="cache_creation_1h_usd_per_mtok",
        price_default="cache_creation_usd_per_mtok",
        part_of="cache_creation_input_tokens",
        since=2,
        prompt=True,
    )
    output_tokens_billed: int = _bucket(
        "output tokens the provider bills, including reasoning and those generated after the "
        "client left",
        usage="output_tokens",
        required=True,
        price="output_usd_per_mtok",
        price_default=REQUIRED,
        derived=True,
        other_models=True,
    )
    output_tokens_delivered: int = _bucket("output tokens written to the client", derived=True)
    output_tokens_undelivered: int = _bucket(
        "billed output tokens the client never received: max(0, billed − delivered)",
        derived=True,
    )
    reasoning_tokens: int = _bucket(
        "the part of the billed output spent on reasoning (information)", usage="reasoning_tokens"
    )

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(*[a + b for a, b in zip(_values(self), _values(other), strict=True)])

    def __sub__(self, other: Tokens) -> Tokens:
        return Tokens(*[a - b for a, b in zip(_values(self), _values(other), strict=True)])

    def __neg__(self) -> Tokens:
        return Tokens(*[-a for a in _values(self)])

    def values(self) -> tuple[int, ...]:
        """The buckets in ``TOKEN_FIELDS`` order."""
        return _values(self)

    def is_zero(self) -> bool:
        """True when every bucket is 0."""
        return not any(_values(self))

    def as_dict(self) -> dict[str, int]:
        """``{field: tokens}`` in ``TOKEN_FIELDS`` order."""
        return dict(zip(TOKEN_FIELDS, _values(self), strict=True))


@dataclass(frozen=True, slots=True)
class Bucket:
    """One token bucket's facts, read off the ``Tokens`` declaration.

    ``name``: the column and API field; ``doc``: what it counts; ``usage``: the ``stream.usage``
    field the rule reads it from, or ``None`` when the rule derives it; ``price``: the price field
    (USD per million tokens) that bills it, or ``None`` when it is not billed by itself;
    ``required``: whether ``stream.usage`` must carry the ``usage`` field (else it is 0);
    ``price_default``: ``REQUIRED`` or the API field of the rate a price without this one bills
    it at (None when ``price`` is); ``part_of``: the bucket that counts its tokens too (see
    ``_bucket``); ``since``: the first export format with its column.
    ``part_of``: the bucket that counts its tokens too (see ``_bucket``); ``since``: the first
    export format with its column; ``derived``: the rule works it out from the usage and the
    counters; ``prompt``: an input-side bucket; ``other_models``: a ``stream.usage.other_models``
    entry carries it.
    """

    name: str
    doc: str
    usage: str | None
    required: bool
    price: str | None
    price_default: str | None = None
    part_of: str | None = None
    since: int = 1
    derived: bool = False
    prompt: bool = False
    other_models: bool = False


#: Every bucket, in declaration order.
BUCKETS: tuple[Bucket, ...] = tuple(
    Bucket(
        f.name,
        f.metadata["doc"],
        f.metadata["usage"],
        f.metadata["required"],
        f.metadata["price"],
        f.metadata["price_default"],
        f.metadata["part_of"],
        f.metadata["since"],
        f.metadata["derived"],
        f.metadata["prompt"],
        f.metadata["other_models"],
    )
    for f in fields(Tokens)
)
#: The bucket names (columns, API fields, CSV columns), in declaration order.
TOKEN_FIELDS: tuple[str, ...] = tuple(b.name for b in BUCKETS)
#: The buckets that a price bills, in declaration order.
PRICED: tuple[Bucket, ...] = tuple(b for b in BUCKETS if b.price is not None)
#: The price fields (USD per million tokens), in the order of ``PRICED``.
PRICE_FIELDS: tuple[str, ...] = tuple(b.price for b in PRICED if b.price is not None)
#: The v1 ``stream.usage`` token fields, in declaration order (``required`` ones and those that
#: default to 0).
USAGE_FIELDS: tuple[str, ...] = tuple(
    b.usage for b in BUCKETS if b.usage is not None and b.since == 1
)
#: The ``stream.usage`` token fields of v2 (CONTRACT "Usage dimensions (v2)"), in declaration
#: order: ``USAGE_FIELDS`` holds the v1 ones, which every tap reports (``billing.taps.usage``);
#: the ingest schema and the rule read every bucket's.
V2_USAGE_FIELDS: tuple[str, ...] = tuple(
    b.usage for b in BUCKETS if b.usage is not None and b.since == 2
)

#: The buckets of the v1 exports' columns (``since`` 1), in declaration order; the v2 formats add
#: the others (CONTRACT "Export", "Usage dimensions (v2)").
V1_TOKEN_FIELDS: tuple[str, ...] = tuple(b.name for b in BUCKETS if b.since == 1)
#: The buckets the v2 exports add after the v1 columns, in declaration order.
V2_TOKEN_FIELDS: tuple[str, ...] = tuple(b.name for b in BUCKETS if b.since == 2)

_values = attrgetter(*TOKEN_FIELDS)


def tokens_of(row: Any) -> Tokens:
    """The ``Tokens`` of any object with one attribute per bucket (an ORM row, a result row)."""
    return Tokens(*[int(v) for v in _values(row)])


def set_tokens(row: Any, tokens: Tokens) -> None:
    """Write ``tokens`` onto an object with one attribute per bucket (an ORM row)."""
    for name in TOKEN_FIELDS:
        setattr(row, name, getattr(tokens, name))
