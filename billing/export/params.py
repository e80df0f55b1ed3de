"""The parameters of an export, checked once for both the HTTP API and the command line.

``since`` and ``until`` are required RFC 3339 timestamps with an offset (the period is half-open:
``since`` ≤ booked_at < ``until``), ``group_by`` a comma list of ``api_key_id``, ``model``,
``hour``, ``day``, ``month`` (usage exports only; default ``day,api_key_id,model``) and ``tz`` an
IANA zone (usage exports only; default ``UTC``). Problems raise
:class:`billing.errors.ValidationFailed` listing each one with a path such as ``query.since``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from zoneinfo import ZoneInfo

from billing.calllog.params import (
    UNTIL_AFTER_SINCE,
    length_problem,
    parse_timestamp,
    parse_zone,
    query_problems,
)
from billing.errors import FieldError, ValidationFailed
from billing.export.columns import DEFAULT_GROUP_BY, FORMATS, GROUP_KEYS, Format
from billing.timefmt import rfc3339

Kind = Literal["usage", "calls"]
KINDS: tuple[Kind, ...] = ("usage", "calls")

_EXAMPLE = "such as 2026-10-01T00:00:00Z or 2026-10-01T00:00:00%2B02:00"


@dataclass(frozen=True)
class ExportParams:
    """A checked export request: UTC bounds, the group keys, the zone of the buckets and the
    format."""

    kind: Kind
    since: datetime
    until: datetime
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    tz: str = "UTC"
    #: ``v1`` (the default, its columns fixed) or ``v2`` (CONTRACT "Keys, customers and plans
    #: (v2)": the v2 columns after the v1 ones).
    format: Format = "v1"
    #: (v2) Only the entries charged to this customer (usage exports only).
    customer_id: str | None = None

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
            # v1 manifests are as they were; a v2 one says its format.
            **({"format": self.format} if self.format != "v1" else {}),
            **({"customer_id": self.customer_id} if self.customer_id is not None else {}),
        }


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


#: The query parameters of each export.
PARAMETERS: dict[Kind, tuple[str, ...]] = {
    "usage": ("since", "until", "format", "group_by", "tz", "customer_id"),
    "calls": ("since", "until", "format"),
}


def parse_params(
    kind: Kind,
    since: str | None,
    until: str | None,
    group_by: str | None = None,
    tz: str | None = None,
    query: Iterable[tuple[str, str]] = (),
    format: str | None = None,
    customer_id: str | None = None,
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
        if problem := length_problem(raw):
            errors.append(FieldError(None, f"query.{name}", problem))
            continue
        try:
            bounds[name] = parse_timestamp(raw)
        except ValueError as error:
            errors.append(FieldError(None, f"query.{name}", str(error)))
    if len(bounds) == 2 and bounds["until"] <= bounds["since"]:
        errors.append(FieldError(None, "query.until", UNTIL_AFTER_SINCE))
    keys = DEFAULT_GROUP_BY
    zone = "UTC"
    if group_by is not None:
        try:
            keys = parse_group_by(group_by)
        except ValueError as error:
            errors.append(FieldError(None, "query.group_by", str(error)))
    if tz is not None and (problem := length_problem(tz)):
        errors.append(FieldError(None, "query.tz", problem))
    elif tz is not None:
        try:
            zone = parse_zone(tz).key
        except ValueError as error:
            errors.append(FieldError(None, "query.tz", str(error)))
    if customer_id is not None and (problem := length_problem(customer_id, 128)):
        errors.append(FieldError(None, "query.customer_id", problem))
    chosen: Format = "v1"
    if format is not None:
        if format in FORMATS:
            chosen = "v3" if format == "v3" else "v2" if format == "v2" else "v1"
        else:
            errors.append(FieldError(None, "query.format", "must be v1 (the default), v2 or v3"))
    if errors:
        raise ValidationFailed(errors)
    return ExportParams(kind, bounds["since"], bounds["until"], keys, zone, chosen, customer_id)
