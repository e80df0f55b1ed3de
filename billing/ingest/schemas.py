"""The lifecycle events of CONTRACT "Events", as pydantic models discriminated by ``type``."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    create_model,
)

from billing.dimensions import BUCKETS

PROTOCOLS = ("openai.chat_completions", "openai.responses", "anthropic.messages")
EVENT_TYPES = (
    "stream.started",
    "stream.tokens",
    "stream.client_disconnected",
    "stream.usage",
    "stream.failed",
)
#: The largest token count accepted in one field (a billion tokens; far past any context window).
MAX_TOKENS = 1_000_000_000
#: The highest attempt number accepted.
MAX_ATTEMPT = 1000


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


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable text (no control characters)")
    if value.isspace():
        raise ValueError("must not be blank (spaces only)")
    return value


Timestamp = Annotated[AwareDatetime, BeforeValidator(_require_text), AfterValidator(_to_utc)]
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)]
Id128 = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_printable)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(_printable)]
ModelName = Annotated[
    str, StringConstraints(min_length=1, max_length=256), AfterValidator(_printable)
]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=256)]
Protocol = Literal["openai.chat_completions", "openai.responses", "anthropic.messages"]


class _Event(BaseModel):
    """Envelope fields shared by every event (CONTRACT "Events")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Id128
    request_id: Id128
    occurred_at: Timestamp
    attempt: Annotated[int, Field(ge=1, le=MAX_ATTEMPT, strict=True)] = 1


def _not_a_secret(value: str) -> str:
    if _SECRET.match(value):
        raise ValueError(
            "looks like a provider secret key; never send secrets: send the key's public id "
            "(for example key_7f3a)"
        )
    return value


#: Prefixes of provider secret keys (OpenAI ``sk-…``/``sk-proj-…``, Anthropic ``sk-ant-…``).
_SECRET = re.compile(r"^(sk-|sk_live_|sk_test_|rk_live_)", re.IGNORECASE)


class StreamStarted(_Event):
    """The gateway opened the upstream stream for this attempt."""

    type: Literal["stream.started"]
    api_key_id: Annotated[Id128, AfterValidator(_not_a_secret)]
    model: ModelName
    protocol: Protocol
    input_tokens: Tokens | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=32)] | None = None


class StreamTokens(_Event):
    """Progress: cumulative output tokens generated upstream and delivered to the client."""

    type: Literal["stream.tokens"]
    output_tokens_generated: Tokens
    output_tokens_delivered: Tokens


class StreamClientDisconnected(_Event):
    """The client went away; cumulative counts at that moment."""

    type: Literal["stream.client_disconnected"]
    output_tokens_delivered: Tokens
    output_tokens_generated: Tokens | None = None


#: The ``stream.usage`` token fields, one per bucket of ``billing.dimensions`` with a ``usage``
#: field: the required ones first, then those that default to 0, each in declaration order.
_USAGE_TOKENS: dict[str, Any] = {
    bucket.usage: (Tokens, ...) if bucket.required else (Tokens, 0)
    for bucket in sorted(BUCKETS, key=lambda b: not b.required)
    if bucket.usage is not None
}
if TYPE_CHECKING:

    class _StreamUsageTokens(_Event):
        """What the type checker knows of the base built below: every token field is an int."""

        type: Literal["stream.usage"]

        def __getattr__(self, name: str) -> int: ...

else:
    _StreamUsageTokens = create_model(
        "_StreamUsageTokens",
        __base__=_Event,
        type=(Literal["stream.usage"], ...),
        **_USAGE_TOKENS,
    )


class StreamUsage(_StreamUsageTokens):
    """Usage of the attempt in the contract's token semantics.

    ``input_tokens`` excludes cache reads and writes; ``output_tokens`` includes reasoning;
    ``source`` is ``upstream`` (the provider's count) or ``estimate`` (the gateway's count).
    """

    # The token fields come from ``billing.dimensions`` (``_USAGE_TOKENS``, in the base).

    source: Literal["upstream", "estimate"]
    model: ModelName | None = None
    stop_reason: Label | None = None


class StreamFailed(_Event):
    """The attempt ended in an error (``error_type`` such as ``api_error`` or ``stalled``)."""

    type: Literal["stream.failed"]
    error_type: Label
    message: Annotated[str, StringConstraints(max_length=4096)] | None = None
    output_tokens_generated: Tokens | None = None


Event = Annotated[
    StreamStarted | StreamTokens | StreamClientDisconnected | StreamUsage | StreamFailed,
    Field(discriminator="type"),
]

#: Fields allowed per event type, for error messages.
FIELDS_BY_TYPE: dict[str, tuple[str, ...]] = {
    model.model_fields["type"].annotation.__args__[0]: tuple(model.model_fields)  # type: ignore[union-attr]
    for model in (StreamStarted, StreamTokens, StreamClientDisconnected, StreamUsage, StreamFailed)
}


#: Where the events' JSON Schema is served (``GET /v1/schema/events.json``).
EVENTS_SCHEMA_PATH = "/v1/schema/events.json"


@functools.cache
def events_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one event, built from the models above: a ``oneOf``
    the five event types (``$defs``: ``StreamStarted``, ``StreamTokens``,
    ``StreamClientDisconnected``, ``StreamUsage``, ``StreamFailed``) with ``type`` as the
    discriminator (CONTRACT "Events"). Rules the models check in code (an ``api_key_id`` that
    looks like a secret, a timestamp more than 5 minutes ahead, a 1-hour cache count above the
    cache count) are not expressible here; the service still answers 422 for them."""
    schema = TypeAdapter(Event).json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": EVENTS_SCHEMA_PATH,
        "title": "billing event",
        "description": (
            'One lifecycle event of a streaming call, as posted in {"events": [...]} to '
            "POST /v1/events (1 to 1000 per post, at most 1 MiB)."
        ),
        **schema,
    }
