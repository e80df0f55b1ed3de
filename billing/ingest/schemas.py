"""The lifecycle events of CONTRACT "Events", as pydantic models discriminated by ``type``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from billing.anomalies import ReportedAnomaly
from billing.dimensions import BUCKETS
from billing.fields import (
    Counts,
    FreeText,
    Id128,
    InferenceGeo,
    Label,
    MetadataKey,
    MetadataValue,
    ModelName,
    OccurredAt,
    PublicId,
    ServiceTier,
    TokenCount,
    UsdAmount,
)

PROTOCOLS = ("openai.chat_completions", "openai.responses", "anthropic.messages")
EVENT_TYPES = (
    "stream.started",
    "stream.tokens",
    "stream.client_disconnected",
    "stream.usage",
    "stream.failed",
)
#: The highest attempt number accepted.
MAX_ATTEMPT = 1000
Protocol = Literal["openai.chat_completions", "openai.responses", "anthropic.messages"]


class _Event(BaseModel):
    """Envelope fields shared by every event (CONTRACT "Events")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: Id128
    request_id: Id128
    occurred_at: OccurredAt
    attempt: Annotated[int, Field(ge=1, le=MAX_ATTEMPT, strict=True)] = 1


class StreamStarted(_Event):
    """The gateway opened the upstream stream for this attempt."""

    type: Literal["stream.started"]
    api_key_id: PublicId
    model: ModelName
    protocol: Protocol
    input_tokens: TokenCount | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=32)] | None = None
    #: The provider that served the stream (CONTRACT "Provider reports and drift"); None:
    #: the protocol's own (``provider_name``).
    provider: Label | None = None
    #: The provider project, workspace or key **id** the gateway used upstream (never a
    #: secret: refused like ``api_key_id``).
    upstream_account: PublicId | None = None

    def provider_name(self) -> str:
        """``provider`` as sent, else ``anthropic`` for ``anthropic.messages`` and ``openai``
        for the ``openai.*`` protocols."""
        if self.provider is not None:
            return self.provider
        return "anthropic" if self.protocol == "anthropic.messages" else "openai"


class StreamTokens(_Event):
    """Progress: cumulative output tokens generated upstream and delivered to the client."""

    type: Literal["stream.tokens"]
    output_tokens_generated: TokenCount
    output_tokens_delivered: TokenCount


class StreamClientDisconnected(_Event):
    """The client went away; cumulative counts at that moment."""

    type: Literal["stream.client_disconnected"]
    output_tokens_delivered: TokenCount
    output_tokens_generated: TokenCount | None = None


#: The ``stream.usage`` token fields, one per bucket of ``billing.dimensions`` with a ``usage``
#: field: the required ones first, then those that default to 0, each in declaration order.
_USAGE_TOKENS: dict[str, Any] = {
    bucket.usage: (TokenCount, ...) if bucket.required else (TokenCount, 0)
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


#: Limits of the v2 usage fields (CONTRACT "Usage dimensions (v2)").
MAX_OTHER_MODELS = 8
MAX_ANOMALIES = 8


class OtherModelUsage(TypedDict):
    """Tokens of one attempt that the upstream billed at another model's rates (an Anthropic
    ``usage.iterations`` entry of type ``advisor_message`` with its own ``model``), in the token
    semantics of ``stream.usage`` (input excludes cache reads and writes). A plain dict once
    validated (the cache fields filled in with 0), as a stored event reads it back."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]

    model: ModelName
    input_tokens: TokenCount
    output_tokens: TokenCount
    cache_read_input_tokens: NotRequired[TokenCount]
    cache_creation_input_tokens: NotRequired[TokenCount]


def _other_model_defaults(value: OtherModelUsage) -> OtherModelUsage:
    # The same content whether a 0 is sent or left out (CONTRACT "Ingest": "same content").
    return {"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, **value}


class StreamUsage(_StreamUsageTokens):
    """Usage of the attempt in the contract's token semantics (CONTRACT "Events" and "Usage
    dimensions (v2)").

    ``input_tokens`` excludes cache reads and writes (``None``: not known, allowed only for
    ``source: estimate``, see ``_fields_agree``); ``output_tokens`` includes reasoning;
    ``source`` is ``upstream`` (the provider's count) or ``estimate`` (the gateway's count).
    v2: ``cache_creation_1h_input_tokens`` (the one-hour part of the cache writes, a bucket of
    ``billing.dimensions`` like the other token fields), ``service_tier`` (the tier served),
    ``units`` (unit name → count), ``other_models`` (tokens billed at another model's rates) and
    ``anomalies`` (codes of ``REPORTED_ANOMALIES``). v3 (CONTRACT "Non-streaming calls,
    hosted-tool fees, provider-reported cost (v3)"): ``provider_cost_usd`` (the cost in USD the
    provider itself reported for the attempt, OpenRouter ``usage.cost``: a decimal string exact
    to the picodollar, kept beside ours and never billed), ``counters`` (name → count, like
    ``units``, of what the provider counts but does not bill per use, such as Anthropic
    ``server_tool_use.web_fetch_requests``: stored and shown, never priced) and
    ``inference_geo`` (where the upstream says it ran the call, ``us``: selects a price like
    ``service_tier``).
    """

    # The other token fields come from ``billing.dimensions`` (``_USAGE_TOKENS``, in the base).

    input_tokens: TokenCount | None = None
    source: Literal["upstream", "estimate"]
    model: ModelName | None = None
    stop_reason: Label | None = None
    service_tier: ServiceTier | None = None
    units: Counts | None = None
    other_models: (
        Annotated[
            list[Annotated[OtherModelUsage, AfterValidator(_other_model_defaults)]],
            Field(max_length=MAX_OTHER_MODELS),
        ]
        | None
    ) = None
    anomalies: Annotated[list[ReportedAnomaly], Field(max_length=MAX_ANOMALIES)] | None = None
    provider_cost_usd: UsdAmount | None = None
    counters: Counts | None = None
    inference_geo: InferenceGeo | None = None

    @model_validator(mode="after")
    def _fields_agree(self) -> StreamUsage:
        """The rules that relate two fields (CONTRACT "Usage dimensions (v2)"): an ``upstream``
        usage carries ``input_tokens``; ``cache_creation_1h_input_tokens`` is a part of
        ``cache_creation_input_tokens``. Raised as ``usage_fields`` with the ``field`` it is
        about, so that ingest's 422 names that field's path."""
        if self.input_tokens is None and self.source == "upstream":
            raise _fields_error(
                "input_tokens",
                'is required for stream.usage events with source "upstream" (only an estimate '
                "may leave it out)",
            )
        if self.cache_creation_1h_input_tokens > self.cache_creation_input_tokens:
            raise _fields_error(
                "cache_creation_1h_input_tokens",
                f"is {self.cache_creation_1h_input_tokens}, more than cache_creation_input_tokens "
                f"({self.cache_creation_input_tokens}): the one-hour cache writes are a part of "
                "the cache writes",
            )
        return self


#: The pydantic error type of a rule across ``stream.usage`` fields; ``ctx["field"]`` names it.
USAGE_FIELDS_ERROR = "usage_fields"


def _fields_error(name: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(USAGE_FIELDS_ERROR, "{message}", {"field": name, "message": message})


class StreamFailed(_Event):
    """The attempt ended in an error (``error_type`` such as ``api_error`` or ``stalled``)."""

    type: Literal["stream.failed"]
    error_type: Label
    message: FreeText | None = None
    output_tokens_generated: TokenCount | None = None


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
