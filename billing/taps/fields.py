"""Reading the provider's JSON events: field readers that raise :class:`MalformedEventError`
on a shape they cannot read, and the normal form of an in-stream error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MalformedEventError",
    "as_dict",
    "error_from_event",
    "normalize_error",
    "opt_str",
    "opt_tokens",
]


class MalformedEventError(Exception):
    """Raised inside a tap when an event cannot be read; the tap counts and skips the event."""


def as_dict(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object, or :class:`MalformedEventError` naming ``what``."""
    if isinstance(value, dict):
        return value
    raise MalformedEventError(f"{what} is not an object")


def opt_tokens(obj: Mapping[str, Any], key: str) -> int | None:
    """A token count field: ``None`` when absent or null, else a non-negative integer.

    A boolean, a negative number, a non-integral number or a non-number is malformed.
    """
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise MalformedEventError(f"{key} is a boolean")
    if isinstance(value, int):
        if value < 0:
            raise MalformedEventError(f"{key} is negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    raise MalformedEventError(f"{key} is not a token count")


def opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    """A string field: ``None`` when absent, null, empty or not a string."""
    value = obj.get(key)
    if isinstance(value, str) and value:
        return value
    return None


def normalize_error(raw: object, default_type: str = "api_error") -> dict[str, Any]:
    """An in-stream error as a dict with at least ``type`` and ``message`` (both strings).

    ``raw`` is the provider's error object (every field it has is kept) or a bare message
    string. When it has no string ``type``, its ``code`` (as a string) stands in, else
    ``default_type``.
    """
    err: dict[str, Any]
    if isinstance(raw, dict):
        err = dict(raw)
    elif isinstance(raw, str):
        err = {"message": raw}
    else:
        err = {}
    etype = err.get("type")
    if not isinstance(etype, str) or not etype:
        code = err.get("code")
        if isinstance(code, str) and code:
            err["type"] = code
        elif isinstance(code, int) and not isinstance(code, bool):
            err["type"] = str(code)
        else:
            err["type"] = default_type
    message = err.get("message")
    if not isinstance(message, str):
        err["message"] = "" if message is None else str(message)
    return err


def error_from_event(data: Mapping[str, Any]) -> object:
    """The error object of an error event: its ``error`` member when that is an object or a
    string, else the event itself without its ``type: "error"`` marker (OpenAI Responses'
    flat ``{"type": "error", "code", "message", "param"}``)."""
    inner = data.get("error")
    if isinstance(inner, dict | str) and inner:
        return inner
    return {k: v for k, v in data.items() if not (k == "type" and v == "error")}
