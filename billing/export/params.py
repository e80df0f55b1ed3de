"""The parameters of an export, checked once for both the HTTP API and the command line.

``since`` and ``until`` are required RFC 3339 timestamps with an offset (the period is half-open:
``since`` ≤ booked_at < ``until``), ``group_by`` a comma list of ``api_key_id``, ``model``,
``hour``, ``day``, ``month`` (usage exports only; default ``day,api_key_id,model``) and ``tz`` an
IANA zone (usage exports only; default ``UTC``). Problems raise
:class:`billing.errors.ValidationFailed` listing each one with a path such as ``query.since``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from billing.calllog.params import query_problems
from billing.errors import FieldError, ValidationFailed
from billing.export.columns import DEFAULT_GROUP_BY, GROUP_KEYS
from billing.timefmt import rfc3339

Kind = Literal["usage", "calls"]
KINDS: tuple[Kind, ...] = ("usage", "calls")

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})?", re.ASCII
)
_SPACE_OFFSET = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)? \d{2}:\d{2}", re.ASCII)
_EXAMPLE = "such as 2026-10-01T00:00:00Z or 2026-10-01T00:00:00%2B02:00"


@dataclass(frozen=True)
class ExportParams:
    """A checked export request: UTC bounds, the group keys and the zone of the buckets."""

    kind: Kind
    since: datetime
    until: datetime
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tz: str = "UTC"

    @property
    def zone(self) -> ZoneInfo:
        """The ``tz`` zone."""
        return ZoneInfo(self.tz)

    def as_json(self) -> dict[str, object]:
        """The parameters as written in a manifest (bounds in UTC)."""
        usage = self.kind == "usage"
        return {
            "kind": self.kind,
            "since": rfc3339(self.since),
            "until": rfc3339(self.until),
            "group_by": list(self.group_by) if usage else None,
            "tz": self.tz if usage else None,
        }


def parse_timestamp(value: str) -> datetime:
    """An RFC 3339 timestamp with offset → aware UTC datetime; ``ValueError`` with a sentence."""
    text = value.strip()
    if _SPACE_OFFSET.fullmatch(text):
        raise ValueError(
            f"{value!r} has a space before its offset: a '+' in a URL query means a space, so "
            f"write it as %2B ({_EXAMPLE})"
        )
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(f"must be an RFC 3339 timestamp {_EXAMPLE}, not {value!r}")
    if match.group(2) is None:
        raise ValueError(f"must include an offset (Z or ±HH:MM), {_EXAMPLE}")
    fraction = match.group(1) or ""
    # Python keeps microseconds: more digits than 6 are cut, never rounded up past the instant.
    text = text.replace(fraction, fraction[:7]) if fraction else text
    try:
        return datetime.fromisoformat(text.upper().replace(" ", "T")).astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(f"{value!r} is not a valid date and time") from None


def parse_group_by(value: str) -> tuple[str, ...]:
    """``day,api_key_id,model`` → its keys in order; ``ValueError`` for unknown or repeated keys."""
    keys = tuple(part.strip() for part in value.split(","))
    if keys == ("",):
        raise ValueError(f"name at least one of {', '.join(GROUP_KEYS)}")
    unknown = [k for k in keys if k not in GROUP_KEYS]
    if unknown:
        raise ValueError(
            f"unknown group key {unknown[0]!r}: use a comma list of {', '.join(GROUP_KEYS)}"
        )
    if len(set(keys)) != len(keys):
        raise ValueError("names a key twice")
    return keys


def parse_zone(value: str) -> str:
    """An IANA zone name (``Europe/Paris``, ``UTC``) → the same name; ``ValueError`` if unknown."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"unknown time zone {value!r}: use an IANA zone name such as UTC or Europe/Paris"
        ) from None
    return value


#: The query parameters of each export.
PARAMETERS: dict[Kind, tuple[str, ...]] = {
    "usage": ("since", "until", "group_by", "tz"),
    "calls": ("since", "until"),
}


def parse_params(
    kind: Kind,
    since: str | None,
    until: str | None,
    group_by: str | None = None,
    tz: str | None = None,
    query: Iterable[tuple[str, str]] = (),
) -> ExportParams:
    """Check every parameter; raise ``ValidationFailed`` listing all the problems (index null).

    ``query`` is the request's whole query string as (name, value) pairs: a parameter the export
    does not know, or one given twice, is a problem too (finance must get the period and grouping
    it asked for, not a silently different one).
    """
    errors = query_problems(query, PARAMETERS[kind])
    bounds: dict[str, datetime] = {}
    for name, raw in (("since", since), ("until", until)):
        if raw is None:
            errors.append(FieldError(None, f"query.{name}", f"is required, {_EXAMPLE}"))
            continue
        try:
            bounds[name] = parse_timestamp(raw)
        except ValueError as error:
            errors.append(FieldError(None, f"query.{name}", str(error)))
    if len(bounds) == 2 and bounds["until"] <= bounds["since"]:
        errors.append(
            FieldError(None, "query.until", "must be later than since: periods are [since, until)")
        )
    keys = DEFAULT_GROUP_BY
    zone = "UTC"
    if group_by is not None:
        try:
            keys = parse_group_by(group_by)
        except ValueError as error:
            errors.append(FieldError(None, "query.group_by", str(error)))
    if tz is not None:
        try:
            zone = parse_zone(tz)
        except ValueError as error:
            errors.append(FieldError(None, "query.tz", str(error)))
    if errors:
        raise ValidationFailed(errors)
    return ExportParams(kind, bounds["since"], bounds["until"], keys, zone)
