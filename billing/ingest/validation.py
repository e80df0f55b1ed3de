"""Parsing a batch body into events, collecting every error in words a gateway developer can use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import orjson
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from billing.anomalies import REPORTED_ANOMALIES
from billing.errors import FieldError, TooLarge, ValidationFailed
from billing.fields import MAX_UNITS
from billing.ingest.schemas import (
    EVENT_TYPES,
    FIELDS_BY_TYPE,
    MAX_ANOMALIES,
    MAX_OTHER_MODELS,
    PROTOCOLS,
    USAGE_FIELDS_ERROR,
    Event,
    OtherModelUsage,
)

MAX_BATCH = 1000
MAX_BODY_BYTES = 1024 * 1024
#: Events more than this far ahead of the server's clock are refused (CONTRACT "Events").
MAX_FUTURE = timedelta(minutes=5)

_event_adapter: TypeAdapter[Event] = TypeAdapter(Event)
_batch_adapter: TypeAdapter[list[Event]] = TypeAdapter(list[Event])


class ParsedEvent(NamedTuple):
    """A validated event with the JSON object the gateway sent (``raw``, key order kept)."""

    event: Event
    raw: dict[str, Any]


def parse_batch(body: bytes, now: datetime) -> list[ParsedEvent]:
    """Parse and validate a ``POST /v1/events`` body (CONTRACT "Ingest").

    Returns the events in batch order. Raises ``TooLarge`` past 1 MiB or 1000 events and
    ``ValidationFailed`` listing every problem (by event index and field path) otherwise.
    """
    if len(body) > MAX_BODY_BYTES:
        raise TooLarge(f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES} (1 MiB)")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ValidationFailed(
            [FieldError(None, "body", f'is not valid JSON ({error}); send {{"events": [...]}}')]
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("events"), list):
        raise ValidationFailed(
            [FieldError(None, "body", 'must be a JSON object {"events": [event, ...]}')]
        )
    extra = sorted(set(document) - {"events"})
    raws: list[Any] = document["events"]
    if len(raws) > MAX_BATCH:
        raise TooLarge(f"batch holds {len(raws)} events; send at most {MAX_BATCH} per request")
    errors = [
        FieldError(None, f"body.{k}", 'is not a known field; send only "events"') for k in extra
    ]
    if not raws:
        errors.append(FieldError(None, "events", f"must hold 1 to {MAX_BATCH} events, not 0"))
    if errors:
        raise ValidationFailed(errors)
    # One validation call for the whole batch; only a batch with errors is validated again event
    # by event, so that one 422 lists every problem of the batch by index.
    valid: list[Event | None]
    try:
        valid = _batch_adapter.validate_python(raws)  # type: ignore[assignment]
    except ValidationError:
        valid = [_validate_one(raw, i, raws, errors) for i, raw in enumerate(raws)]
    # The refused future timestamps of otherwise valid events are listed too.
    latest = now + MAX_FUTURE
    for i, event in enumerate(valid):
        if event is not None and event.occurred_at > latest:
            errors.append(
                FieldError(
                    i,
                    f"events[{i}].occurred_at",
                    f"is more than 5 minutes ahead of the service's clock ({now.isoformat()}); "
                    "check the gateway's clock",
                )
            )
    if errors:
        errors.sort(key=_by_index)
        raise ValidationFailed(errors)
    return [
        ParsedEvent(event, raw) for event, raw in zip(valid, raws, strict=True) if event is not None
    ]


def _validate_one(raw: Any, index: int, raws: list[Any], errors: list[FieldError]) -> Event | None:
    """Event ``index`` on its own: the event, or None with its problems added to ``errors``."""
    try:
        return _event_adapter.validate_python(raw)
    except ValidationError as error:
        errors.extend(_describe(item, raws, index) for item in error.errors(include_url=False))
        return None


def _by_index(error: FieldError) -> int:
    return error.index if error.index is not None else -1


_NO_OFFSET = (
    "has no UTC offset; send an RFC 3339 timestamp with an offset, "
    "such as 2026-10-15T08:00:00Z or 2026-10-15T10:00:00+02:00"
)
_NOT_A_TIMESTAMP_KINDS = frozenset(
    {"datetime_parsing", "datetime_from_date_parsing", "datetime_type"}
)


def plain_message(item: Mapping[str, Any]) -> str:
    """A sentence for one pydantic error, in the service's words rather than pydantic's, for any
    request body: the ingest's own ``_message`` adds what is particular to events and falls back
    on this; the API uses it for the other bodies (``POST /v1/prices``). Pydantic's message for
    a kind not listed here."""
    kind = item.get("type")
    ctx = item.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of this request; remove it"
    if kind == "timezone_aware":
        return _NO_OFFSET
    if kind in _NOT_A_TIMESTAMP_KINDS:
        return "is not an RFC 3339 timestamp; send one such as 2026-10-15T08:00:00Z"
    if kind == "value_error":
        return str(ctx.get("error") or item.get("msg", "is invalid"))
    if kind == "string_type":
        return "must be a string"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"is too long: at most {ctx.get('max_length')} characters"
    if kind in ("model_attributes_type", "dict_type", "model_type"):
        if isinstance(item.get("input"), (str, bytes)):  # a body FastAPI did not read as JSON
            return "must be a JSON object sent with Content-Type: application/json"
        return "must be a JSON object"
    if kind == "json_invalid":
        error = ctx.get("error")
        return f"is not valid JSON ({error})" if error else "is not valid JSON"
    return str(item.get("msg", "is invalid"))


def _describe(item: ErrorDetails, raws: Sequence[Any], index: int) -> FieldError:
    """One pydantic error of event ``index`` as a FieldError with a sentence a developer can use."""
    loc = list(item["loc"])
    event_type: str | None = None
    if loc and isinstance(loc[0], str) and loc[0] in EVENT_TYPES:
        event_type = str(loc.pop(0))
    key_error = bool(loc) and loc[-1] == "[key]"
    if key_error:
        loc.pop()  # a metadata key or unit name itself is wrong: name the entry
    if item["type"] == USAGE_FIELDS_ERROR:
        loc.append(str((item.get("ctx") or {}).get("field", "")))
    if item["type"] in {"union_tag_invalid", "union_tag_not_found"} and isinstance(
        raws[index], dict
    ):
        loc = ["type"]
    path = f"events[{index}]"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    field = str(loc[-1]) if loc else ""
    message = _message(item, event_type, field, raws, index)
    if key_error:
        parent = str(loc[-2]) if len(loc) >= 2 else "metadata"
        message = f"{_KEY_NAMES.get(parent, f'{parent} key')} {message}"
    return FieldError(index, path, message)


#: How the 422 names a bad key of an object field (an unknown one: "<field> key").
_KEY_NAMES = {"units": "unit name", "counters": "counter name"}
#: The object fields of name → count (``units``, ``counters``).
_COUNTS = ("units", "counters")


def _message(
    item: ErrorDetails, event_type: str | None, field: str, raws: Sequence[Any], index: int | None
) -> str:
    kind = item["type"]
    ctx = item.get("ctx") or {}
    of_type = f"{event_type} events" if event_type else "events"
    if kind == "model_attributes_type" or (
        kind == "union_tag_not_found" and index is not None and not isinstance(raws[index], dict)
    ):
        return "must be a JSON object (an event)"
    if kind == "union_tag_not_found":
        return "is required: one of " + ", ".join(EVENT_TYPES)
    if kind == "union_tag_invalid":
        return f"unknown event type {ctx.get('tag')!r}; use one of " + ", ".join(EVENT_TYPES)
    if kind == USAGE_FIELDS_ERROR:
        return str(ctx.get("message", "is invalid"))
    if kind == "missing":
        return f"is required for {of_type}"
    if kind == "extra_forbidden" and "other_models" in item["loc"]:
        allowed = ", ".join(OtherModelUsage.__annotations__)
        return f"is not a field of an other_models entry; remove it (allowed: {allowed})"
    if kind == "extra_forbidden":
        allowed = ", ".join(FIELDS_BY_TYPE.get(event_type or "", ()))
        return f"is not a field of {of_type}; remove it (allowed: {allowed})"
    if field == "protocol" and kind == "literal_error":
        return "unknown protocol; use one of " + ", ".join(PROTOCOLS)
    if field == "source" and kind == "literal_error":
        return (
            'must be "upstream" (reported by the provider) or "estimate" (counted by the gateway)'
        )
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        if field in {"attempt"}:
            return "must be an integer ≥ 1 (the upstream attempt number)"
        if "units" in item["loc"]:
            return "must be a whole number of units (a JSON integer ≥ 0)"
        if "counters" in item["loc"]:
            return "must be a whole number (a JSON integer ≥ 0)"
        return "must be a whole number of tokens (a JSON integer ≥ 0)"
    if kind == "greater_than_equal":
        if field == "attempt":
            return "must be an integer ≥ 1 (attempts are numbered from 1)"
        if any(name in item["loc"] for name in _COUNTS):
            return f"must be ≥ {ctx.get('ge')}: counts are never negative"
        return f"must be ≥ {ctx.get('ge')}: token counts are never negative"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}"
    if kind == "string_too_long" and field == "api_key_id":
        return (
            "is longer than 128 characters, which looks like a secret key; never send secrets: "
            "send the key's public id (for example key_7f3a)"
        )
    if kind == "too_long" and field == "metadata":
        return "has too many entries: at most 32 string keys to string values"
    if kind == "too_long" and field in _COUNTS:
        return f"has too many entries: at most {MAX_UNITS} {_KEY_NAMES[field]}s to counts"
    if kind == "too_long" and field == "other_models":
        return f"has too many entries: at most {MAX_OTHER_MODELS} models"
    if kind == "too_long" and field == "anomalies":
        return f"has too many entries: at most {MAX_ANOMALIES} anomaly codes"
    if kind == "string_pattern_mismatch":
        return "must be 1 to 64 characters of a-z, 0-9 and _ (such as web_search_requests)"
    if kind == "literal_error" and len(item["loc"]) >= 2 and "anomalies" in item["loc"]:
        return "unknown anomaly code; use one of " + ", ".join(REPORTED_ANOMALIES)
    if kind == "dict_type" and field == "units":
        return 'must be a JSON object of unit names to counts, such as {"web_search_requests": 3}'
    if kind == "dict_type" and field == "counters":
        return 'must be a JSON object of counter names to counts, such as {"web_fetch_requests": 2}'
    if kind == "list_type" and field in {"other_models", "anomalies"}:
        return "must be a JSON array"
    if kind == "string_type" and len(item["loc"]) >= 4 and item["loc"][-2] == "metadata":
        return "metadata values must be strings (at most 256 characters)"
    if kind == "dict_type" and field == "metadata":
        return "must be a JSON object of string keys to string values"
    return plain_message(item)
