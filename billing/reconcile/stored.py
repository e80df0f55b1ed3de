"""Stored events read back cheaply for reconciliation.

Every stored event was validated by ingest against ``billing.ingest.schemas`` before it was
committed, so the reconciler does not need pydantic to read it again. ``decode`` parses the body
with orjson and wraps the dict in a light object of the event's type that the rule reads like
the pydantic model (same attribute names, same defaults: each class is made from its model's
``model_fields``). Bodies that no longer look like what ingest accepted (a manual repair, say)
still fail their call: a body that is not JSON, has an unknown type or a timestamp Python does
not read the way pydantic does goes through the full pydantic validation (which returns the
model or raises); a missing field raises in the rule; and
``billing.reconcile.rule.check_figures`` refuses figures built from a value of the wrong type (a
float token count: money is never float).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, get_args

import orjson
from pydantic import BaseModel, TypeAdapter

from billing.ingest.schemas import Event as EventModel
from billing.ingest.schemas import (
    StreamClientDisconnected,
    StreamFailed,
    StreamStarted,
    StreamTokens,
    StreamUsage,
)


class _Stored:
    """Envelope fields; each event type's class adds its fields' defaults (class attributes)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__!r})"


#: The event models of the discriminated union ``billing.ingest.schemas.Event``.
_MODELS: tuple[type[BaseModel], ...] = get_args(get_args(EventModel)[0])


def _light(model: type[BaseModel]) -> tuple[str, type[_Stored]]:
    """The event type name and the light class of one event model: the model's attribute names
    with the defaults of its optional fields (read from ``model_fields``)."""
    (kind,) = get_args(model.model_fields["type"].annotation)
    defaults = {
        name: info.default for name, info in model.model_fields.items() if not info.is_required()
    }
    name = "Stored" + model.__name__.removeprefix("Stream")
    doc = f"A stored ``{kind}`` read back (see ``{model.__name__}``)."
    return str(kind), type(name, (_Stored,), {"__doc__": doc, **defaults})


_CLASSES: dict[str, type[_Stored]] = dict(_light(model) for model in _MODELS)

if TYPE_CHECKING:
    # A stored event reads like its model: same attributes, same types.
    StoredStarted = StreamStarted
    StoredTokens = StreamTokens
    StoredClientDisconnected = StreamClientDisconnected
    StoredUsage = StreamUsage
    StoredFailed = StreamFailed
else:
    StoredStarted = _CLASSES["stream.started"]
    StoredTokens = _CLASSES["stream.tokens"]
    StoredClientDisconnected = _CLASSES["stream.client_disconnected"]
    StoredUsage = _CLASSES["stream.usage"]
    StoredFailed = _CLASSES["stream.failed"]

StoredEvent = StoredStarted | StoredTokens | StoredClientDisconnected | StoredUsage | StoredFailed
#: What the rule reads: an event as validated by ingest, or one read back from storage.
AnyEvent = EventModel | StoredEvent

_model_adapter: TypeAdapter[EventModel] = TypeAdapter(EventModel)


def _fast(fields: Any) -> StoredEvent:
    # A non-dict body, an unknown type or a timestamp Python reads otherwise raise KeyError,
    # TypeError or ValueError here: the caller then validates the body in full.
    cls = _CLASSES[fields["type"]]
    when = datetime.fromisoformat(fields["occurred_at"])
    if when.tzinfo is not UTC:
        if when.tzinfo is None:
            raise ValueError("no offset")
        when = when.astimezone(UTC)
    fields["occurred_at"] = when
    event: Any = cls.__new__(cls)
    event.__dict__ = fields
    return event  # type: ignore[no-any-return]


def decode(body: str | bytes) -> AnyEvent:
    """One stored event body as the rule reads it; raises (``ValueError``, pydantic's
    ``ValidationError``) when the body is not JSON or an unusual body is not a valid event.

    The fast path checks no field: ``billing.reconcile.rule.check_figures`` checks every value
    that reached the figures of a call computed from such events."""
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _model_adapter.validate_json(body)
    try:
        return _fast(fields)
    except (KeyError, TypeError, ValueError):
        return _model_adapter.validate_json(body)
