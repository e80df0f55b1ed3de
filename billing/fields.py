"""The field types every request shape shares, declared once: RFC 3339 instants, ids, names,
labels, token counts, served tiers and unit names (CONTRACT "Events" states their rules; the
other sections reuse them).

Each is a pydantic ``Annotated`` type whose validators raise ``ValueError`` with a sentence a
gateway developer can act on; the API's 422 shows it at the field's path.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BeforeValidator,
    Field,
    StringConstraints,
    WithJsonSchema,
)

from billing.money import MAX_USD_DECIMALS, parse_usd
from billing.secret_ids import looks_like_secret

#: The largest token count accepted in one field (a billion tokens; far past any context window).
MAX_TOKENS = 1_000_000_000
#: The most unit names a usage counts or a price prices (CONTRACT "Usage dimensions (v2)").
MAX_UNITS = 16
#: A unit's name (CONTRACT "Usage dimensions (v2)").
UNIT_NAME_PATTERN = r"^[a-z0-9_]{1,64}$"

#: What a tagged union's member tags start with (``union_tag``): pydantic puts the chosen
#: member's tag in an error's location, and the API's 422 leaves such parts out of its ``path``
#: (``billing.api.errors.request_invalid``), so that an error names the field as it was sent.
UNION_TAG_MARK = "\x1f"


def union_tag(name: str) -> str:
    """The ``pydantic.Tag`` of a union member named ``name`` (kept out of a 422's path)."""
    return UNION_TAG_MARK + name


#: RFC 3339 ``date-time``; the offset is optional here so that a missing one gets its own message.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?", re.ASCII
)


def _require_text(value: Any) -> Any:
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 timestamp string such as 2026-10-15T08:00:00Z")
    return value


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # such as 0001-01-01T00:30:00+01:00: before year 1 in UTC
        raise ValueError("is out of range: send an instant between years 1 and 9999 UTC") from None


#: The instants an event may have happened at and a query's period may start or end at: one
#: range (zones and calendars stay defined in it), ``[EARLIEST, LATEST]``.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def in_range(value: datetime) -> datetime:
    """``value`` (aware) if it lies in ``[EARLIEST, LATEST]``; else ``ValueError``."""
    if not EARLIEST <= value <= LATEST:
        raise ValueError(
            f"must be between {EARLIEST.year}-01-01T00:00:00Z and {LATEST.year}-01-01T00:00:00Z"
        )
    return value


#: What a text field is told when it holds a character it may not (``no_control``).
NOT_PRINTABLE = "must be printable text (no control characters)"


def no_control(value: str) -> str:
    """``value`` unless it holds a character that is not printable; else ``ValueError``.

    The one text rule of every field a client sends (ids, names, labels, metadata, messages,
    URLs): Python's ``str.isprintable`` refuses the control characters (NUL, which PostgreSQL's
    text and ``jsonb`` cannot hold, CR, LF, tab, ESC), the line and paragraph separators
    (U+2028, U+2029), the format characters (direction overrides such as U+202E, zero-width
    spaces and joiners, the BOM U+FEFF, the soft hyphen), surrogates and unassigned code points.
    Empty text passes (a field that may be empty says so by its length)."""
    if not value.isprintable():
        raise ValueError(NOT_PRINTABLE)
    return value


def printable_text(value: str) -> str:
    """``value`` with every character ``no_control`` refuses replaced by a space: what this
    package's senders put in a free-text field they did not write (an upstream's error message,
    an exception's text), so that the field is never refused."""
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else " " for ch in value)


def printable(value: str) -> str:
    """``value`` if it passes ``no_control`` and is not blank; else ``ValueError``."""
    # ``no_control``'s test written out: ingest runs this on every id of every event.
    if not value.isprintable():
        raise ValueError(NOT_PRINTABLE)
    if value.isspace():
        raise ValueError("must not be blank (spaces only)")
    return value


def not_a_secret(value: str) -> str:
    """``value`` unless it looks like a secret key (``billing.secret_ids``); else ``ValueError``
    asking for the key's public id."""
    if looks_like_secret(value):
        raise ValueError(
            "looks like a provider secret key; never send secrets: send the key's public id "
            "(for example key_7f3a)"
        )
    return value


#: An instant: an RFC 3339 string with an offset, held as an aware UTC ``datetime``.
Timestamp = Annotated[AwareDatetime, BeforeValidator(_require_text), AfterValidator(_to_utc)]


def _to_utc_in_range(value: datetime) -> datetime:
    """``_to_utc`` then ``in_range``: one validator, one call out of pydantic-core per event."""
    return in_range(_to_utc(value))


#: When an event happened: a ``Timestamp`` within ``[EARLIEST, LATEST]``.
OccurredAt = Annotated[
    AwareDatetime, BeforeValidator(_require_text), AfterValidator(_to_utc_in_range)
]
#: A token count: an integer from 0 to ``MAX_TOKENS`` (a JSON number, never a string).
TokenCount = Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)]
#: An id: printable text of 1–128 characters.
Id128 = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(printable)]
#: An id that is shown and exported (a key's, a customer's, an upstream account's): an ``Id128``
#: that is never a secret.
PublicId = Annotated[Id128, AfterValidator(not_a_secret)]
#: A short label (an error type, a stop reason, a provider): printable text of 1–64 characters.
Label = Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(printable)]


def one_tag(value: str) -> str:
    """``value`` if it can be one of the tags of a ``stream.started`` metadata value
    (``billing.budgets.scopes.tags_of``: comma-separated, each trimmed); else ``ValueError``."""
    if "," in value:
        raise ValueError("must not contain a comma (metadata tags are a comma-separated list)")
    if value != value.strip():
        raise ValueError("must not start or end with a space (metadata tags are trimmed)")
    return value


#: A budget's or an authorization's tag (CONTRACT "Authorizations and holds (v3)"): a label
#: that a call's metadata tags can hold.
CallTag = Annotated[Label, AfterValidator(one_tag)]
#: A model name: printable text of 1–256 characters.
ModelName = Annotated[
    str, StringConstraints(min_length=1, max_length=256), AfterValidator(printable)
]
#: A metadata key (1–64 characters) and value (at most 256, no control characters).
MetadataKey = Annotated[
    str, StringConstraints(min_length=1, max_length=64), AfterValidator(printable)
]
MetadataValue = Annotated[str, StringConstraints(max_length=256), AfterValidator(no_control)]
#: A served tier: printable text of 1–32 characters.
ServiceTier = Annotated[
    str, StringConstraints(min_length=1, max_length=32), AfterValidator(printable)
]
#: The place that served a call (``inference_geo``: ``us``, ``global``, …): printable text of
#: 1–32 characters, like a served tier (CONTRACT "Non-streaming calls, hosted-tool fees,
#: provider-reported cost (v3)").
InferenceGeo = Annotated[
    str, StringConstraints(min_length=1, max_length=32), AfterValidator(printable)
]
#: A unit's name (``UNIT_NAME_PATTERN``); a counter's name follows the same rule.
UnitName = Annotated[str, StringConstraints(pattern=UNIT_NAME_PATTERN)]
#: Counts by name (``units``, ``counters``): at most ``MAX_UNITS`` names of
#: ``UNIT_NAME_PATTERN``, each an integer count like a token count.
Counts = Annotated[
    dict[UnitName, TokenCount],
    Field(max_length=MAX_UNITS, json_schema_extra={"additionalProperties": False}),
]
#: Free text up to 4096 characters (a failure's message): ``no_control``, may be empty.
FreeText = Annotated[str, StringConstraints(max_length=4096), AfterValidator(no_control)]
#: A name shown beside an id (a token's, a key's): printable text of 1–256 characters.
Name = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(printable)]
#: An amount in USD sent as a decimal string, exact to the picodollar (``billing.money.parse_usd``),
#: held as its canonical text ("0.1" for "0.10": the same content either way).
UsdAmount = Annotated[
    str,
    BeforeValidator(parse_usd),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": rf"^[0-9]+(\.[0-9]{{1,{MAX_USD_DECIMALS}}})?$",
            "description": "USD as a decimal string, at most 12 decimal places (0.0042)",
        }
    ),
]
