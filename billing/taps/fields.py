"""Reading the provider's JSON events: field readers that raise :class:`MalformedEventError`
on a shape they cannot read, and the normal form of an in-stream error."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from billing.fields import MAX_TOKENS, printable_text
from billing.money import MAX_USD_DECIMALS, parse_usd
from billing.taps.usage import is_unit_name

__all__ = [
    "MalformedEventError",
    "as_dict",
    "error_from_event",
    "normalize_error",
    "opt_str",
    "opt_tier",
    "opt_tokens",
    "opt_units",
    "split_counters",
    "usd_at",
]


class MalformedEventError(Exception):
    """Raised inside a tap when an event cannot be read; the tap counts and skips the event."""


def as_dict(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object, or :class:`MalformedEventError` naming ``what``."""
    if isinstance(value, dict):
        return value
    raise MalformedEventError(f"{what} is not an object")


def opt_tokens(obj: Mapping[str, Any], key: str) -> int | None:
    """A token count field: ``None`` when absent or null, else an integer.

    A NEGATIVE count is returned as it is: the usage builder (:func:`billing.taps.usage.
    build_usage`) makes it 0 and flags the usage ``usage_inconsistent``, keeping every other
    field (CONTRACT "Reading upstream usage (taps)"). A boolean, a non-integral number, a
    non-number or a count beyond ``MAX_TOKENS`` (which no event may carry, and which the
    client could not even serialize past 64 bits) is malformed.
    """
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise MalformedEventError(f"{key} is a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value > MAX_TOKENS:
            raise MalformedEventError(f"{key} is beyond {MAX_TOKENS:,}")
        return value
    raise MalformedEventError(f"{key} is not a token count")


def opt_units(
    obj: Mapping[str, Any], key: str, names: Iterable[str] | None = None
) -> dict[str, int]:
    """The counters object ``obj[key]`` (Anthropic ``server_tool_use``, OpenRouter
    ``server_tool_use_details``) as units: name → count (may be negative, see
    :func:`opt_tokens`), in the provider's order.

    ``names``: only these counters (``None``: every counter whose name is a valid unit name).
    Lenient on purpose: a counters object that is not an object, or a counter that is not a
    count (or one beyond ``MAX_TOKENS``), is left out rather than making the event (and the
    token usage it carries) unreadable.
    """
    counters = obj.get(key)
    if not isinstance(counters, dict):
        return {}
    wanted = None if names is None else set(names)
    units: dict[str, int] = {}
    for name, value in counters.items():
        if wanted is None and not is_unit_name(name):
            continue
        if wanted is not None and name not in wanted:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_TOKENS:
            units[name] = value
    return units


def split_counters(
    counters: Mapping[str, int], not_billed: Iterable[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """``counters`` (see :func:`opt_units`) as ``(units, counters)``: the counters named in
    ``not_billed`` (a provider counts them but bills no fee per use, CONTRACT "Non-streaming
    calls, hosted-tool fees, provider-reported cost") go to ``stream.usage.counters``, every
    other one is a unit."""
    names = frozenset(not_billed)
    units = {name: n for name, n in counters.items() if name not in names}
    return units, {name: n for name, n in counters.items() if name in names}


def usd_at(raw: bytes, path: Iterable[str]) -> str | None:
    """The amount in USD at ``path`` of the JSON text ``raw`` (OpenRouter's ``usage.cost``),
    read exactly from its digits (as a :class:`~decimal.Decimal`, never through a float), as
    the canonical decimal string of ``stream.usage.provider_cost_usd``
    (:func:`billing.money.parse_usd`), rounded half-even to the picodollar (a provider that
    computes its cost in floating point sends digits such as ``0.00016949999999999999``);
    ``None`` when it is absent, not a number, negative or too large (the usage is posted without
    it rather than refused)."""
    try:
        node: object = json.loads(raw, parse_float=Decimal, parse_int=Decimal)
    except ValueError:
        return None
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if not isinstance(node, Decimal) or not node.is_finite():
        return None
    if node.as_tuple().exponent < -MAX_USD_DECIMALS:  # type: ignore[operator]
        node = node.quantize(Decimal(1).scaleb(-MAX_USD_DECIMALS), rounding=ROUND_HALF_EVEN)
    try:
        return parse_usd(format(node, "f"))
    except ValueError:
        return None


def opt_tier(obj: Mapping[str, Any], key: str = "service_tier") -> str | None:
    """A served service tier (``default``, ``priority``, ``flex``, ``standard``, …; 1–32
    characters), or ``None``.

    ``auto`` is left out: it is a value a client asks for, which OpenAI echoes until the response
    says which tier served it (a Responses stream: ``auto`` in ``response.created``, ``default``
    in ``response.completed``), never a tier that served a call.
    """
    value = obj.get(key)
    if isinstance(value, str) and 1 <= len(value) <= 32 and value.isprintable() and value != "auto":
        return value
    return None


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
    err["message"] = printable_text("" if message is None else str(message))
    return err


def error_from_event(data: Mapping[str, Any]) -> object:
    """The error object of an error event: its ``error`` member when that is an object or a
    string, else the event itself without its ``type: "error"`` marker (OpenAI Responses'
    flat ``{"type": "error", "code", "message", "param"}``)."""
    inner = data.get("error")
    if isinstance(inner, dict | str) and inner:
        return inner
    return {k: v for k, v in data.items() if not (k == "type" and v == "error")}
