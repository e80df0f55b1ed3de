"""Turn a tap's state into the payloads of the CONTRACT's closing lifecycle events.

The payloads carry no envelope fields: the caller adds ``event_id``, ``request_id``,
``occurred_at`` and ``attempt`` (CONTRACT.md, "Events"). :func:`attempt_final_events` also
sets ``type``; the two ``*_payload`` functions do not.
"""

from __future__ import annotations

from typing import Any

from billing.dimensions import BUCKETS
from billing.taps.state import TapState
from billing.taps.usage import TOKEN_FIELDS

__all__ = ["attempt_final_events", "stream_failed_payload", "stream_usage_payload"]

#: Token fields that a payload carries only when they are not 0: those of the buckets after v1
#: (``since`` > 1, the v2 dimensions), so that a payload without them is the v1 shape.
_WHEN_NOT_ZERO = frozenset(b.usage for b in BUCKETS if b.usage is not None and b.since > 1)


def stream_usage_payload(
    tap: TapState, *, fallback_input_tokens: int | None = None
) -> dict[str, Any]:
    """The ``stream.usage`` payload of the attempt the tap has read (token counts in tokens).

    Shape::

        {"input_tokens": int (see below), "output_tokens": int,
         "cache_read_input_tokens": int, "cache_creation_input_tokens": int,
         "reasoning_tokens": int, "cache_creation_1h_input_tokens": int (when > 0),
         "source": "upstream" | "estimate",
         "service_tier": str (when the upstream said which tier served it),
         "inference_geo": str (when the upstream said where it ran the call),
         "units": {name: int > 0} (when any), "counters": {name: int > 0} (when any),
         "provider_cost_usd": decimal str (when the provider reported it),
         "other_models": [{"model", "input_tokens", "output_tokens",
         "cache_read_input_tokens", "cache_creation_input_tokens"}] (when any),
         "anomalies": ["usage_inconsistent"] (when the upstream's figures contradicted
         themselves), "model": str (when reported), "stop_reason": str (when known)}

    ``source`` is ``upstream`` when the provider reported a usage and no content was generated
    after it (:attr:`TapState.usage_is_final`); its counts are then the provider's. Otherwise it is
    ``estimate``: ``output_tokens`` is :attr:`TapState.output_tokens` (the last reported running
    count plus the deltas after it, or one token per content delta; never Anthropic's
    ``message_start`` placeholder), and the input side is whatever the stream reported
    (:attr:`TapState.input_reported`, e.g. Anthropic's ``message_start``), else
    ``fallback_input_tokens`` (the gateway's own count) as ``input_tokens``, else the input
    side is LEFT OUT: not known, so the service takes ``stream.started.input_tokens`` (CONTRACT
    "Usage dimensions (v2)": an estimate never replaces a known input with 0).
    """
    payload: dict[str, Any] = {}
    usage = tap.usage
    anomalies: list[str] = []
    other_models: list[dict[str, Any]] = []
    if usage is not None and tap.usage_is_final:
        payload.update(usage.as_dict())
        source = "upstream"
    else:
        reported = tap.input_reported
        if reported is not None:
            payload.update(reported.as_dict())
            anomalies.extend(reported.anomalies)
        elif fallback_input_tokens is not None:
            payload["input_tokens"] = fallback_input_tokens
        payload["output_tokens"] = tap.output_tokens
        payload["reasoning_tokens"] = min(
            usage.reasoning_tokens if usage is not None else 0, tap.output_tokens
        )
        source = "estimate"
    if usage is not None:
        other_models = [entry.as_dict() for entry in usage.other_models]
        anomalies.extend(usage.anomalies)
    ordered: dict[str, Any] = {
        key: payload[key]
        for key in TOKEN_FIELDS
        if key in payload and (payload[key] or key not in _WHEN_NOT_ZERO)
    }
    ordered["source"] = source
    if tap.service_tier:
        ordered["service_tier"] = tap.service_tier
    if tap.inference_geo:
        ordered["inference_geo"] = tap.inference_geo
    units = tap.units
    if units:
        ordered["units"] = units
    counters = tap.counters
    if counters:
        ordered["counters"] = counters
    if tap.provider_cost_usd is not None:
        ordered["provider_cost_usd"] = tap.provider_cost_usd
    if other_models:
        ordered["other_models"] = other_models
    if anomalies:
        ordered["anomalies"] = list(dict.fromkeys(anomalies))
    if tap.model:
        ordered["model"] = tap.model
    if tap.stop_reason:
        ordered["stop_reason"] = tap.stop_reason
    return ordered


def stream_failed_payload(tap: TapState) -> dict[str, Any] | None:
    """The ``stream.failed`` payload when the stream carried an error, else ``None``.

    Shape: ``{"error_type": str, "message": str (when non-empty),
    "output_tokens_generated": int (tokens)}``; ``error_type`` is the provider's error
    ``type`` (e.g. ``overloaded_error``, ``api_error``), or its ``code`` when it has no type.
    """
    error = tap.error
    if error is None:
        return None
    payload: dict[str, Any] = {"error_type": str(error["type"])}
    message = error.get("message")
    if isinstance(message, str) and message:
        payload["message"] = message
    payload["output_tokens_generated"] = tap.output_tokens
    return payload


def attempt_final_events(
    tap: TapState, *, fallback_input_tokens: int | None = None
) -> list[dict[str, Any]]:
    """The closing events of an attempt, each a payload plus its ``type``.

    Always a ``stream.usage`` (see :func:`stream_usage_payload`), followed by a
    ``stream.failed`` when the stream carried an error (see :func:`stream_failed_payload`).
    """
    events: list[dict[str, Any]] = [
        {
            "type": "stream.usage",
            **stream_usage_payload(tap, fallback_input_tokens=fallback_input_tokens),
        }
    ]
    failed = stream_failed_payload(tap)
    if failed is not None:
        events.append({"type": "stream.failed", **failed})
    return events
