"""What a tap reports, in the contract's token semantics (CONTRACT.md, "Token semantics" and
"Usage dimensions (v2)"), one for all protocols, every count in tokens:

* ``input_tokens`` is input billed at the full input rate: it EXCLUDES cache reads and cache
  writes;
* ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` are the cache reads / writes;
  ``cache_creation_1h_input_tokens`` is the part of the writes made with a one-hour lifetime;
* ``output_tokens`` is all billed output, INCLUDING reasoning;
* ``reasoning_tokens`` is the part of ``output_tokens`` spent on reasoning, for information;
* ``service_tier`` is the tier the upstream says it served, ``units`` the billable non-token
  units (``{"web_search_requests": 3}``), ``counters`` what the provider counts but bills no
  fee per use (``{"web_fetch_requests": 2}``), ``other_models`` the tokens billed at another model's
  rates inside the attempt, ``anomalies`` what was wrong with the upstream's figures.

The token field names are the ``stream.usage`` fields (``billing.dimensions.USAGE_FIELDS`` is a
subset of :data:`TOKEN_FIELDS`); each tap translates its provider's fields into them.

The provider's figures go through :func:`build_usage` / :func:`build_input`, which keep what is
valid of a figure that contradicts itself and flag it :data:`USAGE_INCONSISTENT` (CONTRACT
"Reading upstream usage (taps)"): a negative count is 0 (every other field kept); cached tokens
above an inclusive prompt count are the prompt count (input 0); one-hour writes above the writes
are the writes; reasoning above the output is the output. A usage is never dropped for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from billing.anomalies import USAGE_INCONSISTENT
from billing.dimensions import BUCKETS
from billing.fields import MAX_UNITS, UNIT_NAME_PATTERN
from billing.ingest.schemas import MAX_OTHER_MODELS

__all__ = [
    "MAX_OTHER_MODELS",
    "MAX_UNITS",
    "OTHER_MODEL_FIELDS",
    "TOKEN_FIELDS",
    "USAGE_INCONSISTENT",
    "InputUsage",
    "OtherModelUsage",
    "Usage",
    "build_input",
    "build_usage",
    "is_unit_name",
]

# MAX_UNITS / MAX_OTHER_MODELS (entries of one stream.usage) and the unit name pattern are the
# ingest schema's: a tap posts what it accepts.
_UNIT_NAME = re.compile(UNIT_NAME_PATTERN)


def is_unit_name(name: object) -> bool:
    """Whether ``name`` is a valid unit name of ``stream.usage.units`` (``[a-z0-9_]{1,64}``)."""
    return isinstance(name, str) and _UNIT_NAME.fullmatch(name) is not None


def _counts(obj: object, names: Iterable[str]) -> dict[str, int]:
    # A declared bucket that no tap reads (not a field of ``obj``) is reported as 0.
    return {name: getattr(obj, name, 0) for name in names}


@dataclass(frozen=True, slots=True)
class OtherModelUsage:
    """Tokens billed at another model's rates inside one attempt (Anthropic ``usage.iterations``
    of another ``model``, e.g. ``advisor_message``); same semantics as :class:`Usage`."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The ``stream.usage.other_models[]`` entry: ``{"model", "input_tokens",
        "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}``
        (:data:`OTHER_MODEL_FIELDS`)."""
        return {"model": self.model, **_counts(self, OTHER_MODEL_FIELDS)}


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage of one attempt in the contract's semantics (counts in tokens, >= 0).

    ``input_tokens`` excludes cache reads and writes; ``output_tokens`` includes reasoning;
    ``reasoning_tokens`` is a subset of ``output_tokens`` and ``cache_creation_1h_input_tokens``
    of ``cache_creation_input_tokens``. ``units`` maps a unit name to a count > 0 (not to be
    changed: the value is shared), ``counters`` likewise (counted, not billed per use);
    ``other_models`` is at most one entry per model; ``anomalies``
    holds :data:`USAGE_INCONSISTENT` when the provider's figures had to be corrected.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    service_tier: str | None = None
    units: Mapping[str, int] = field(default_factory=dict, hash=False)
    other_models: tuple[OtherModelUsage, ...] = ()
    anomalies: tuple[str, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, int]:
        """The token counts as a dict keyed by the ``stream.usage`` fields (:data:`TOKEN_FIELDS`
        order)."""
        return _counts(self, TOKEN_FIELDS)

    @property
    def input(self) -> InputUsage:
        """The input side of this usage."""
        return InputUsage(
            self.input_tokens,
            self.cache_read_input_tokens,
            self.cache_creation_input_tokens,
            self.cache_creation_1h_input_tokens,
            self.anomalies,
        )


@dataclass(frozen=True, slots=True)
class InputUsage:
    """The input side of a usage report (tokens), as far as the stream has reported it.

    Anthropic reports it in ``message_start`` before any output; OpenAI only with the final
    usage. Same semantics as :class:`Usage`: the three first counts are disjoint.
    """

    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    anomalies: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, int]:
        """The counts as a dict keyed by the ``stream.usage`` fields (:data:`INPUT_FIELDS`)."""
        return _counts(self, INPUT_FIELDS)


#: The buckets of ``billing.dimensions`` that ``stream.usage`` carries (those with a ``usage``
#: field), in the order a payload lists them: the v1 ones first (a payload without the later ones
#: is the v1 shape), within each format the required ones first, each in declaration order.
_REPORTED = sorted(
    (b for b in BUCKETS if b.usage is not None), key=lambda b: (b.since, not b.required)
)
#: The ``stream.usage`` token fields a tap reports, in the order its payload lists them.
TOKEN_FIELDS: tuple[str, ...] = tuple(b.usage for b in _REPORTED if b.usage is not None)
#: The input-side token fields (the ``prompt`` buckets' fields: :class:`InputUsage`).
INPUT_FIELDS: tuple[str, ...] = tuple(b.usage for b in _REPORTED if b.usage and b.prompt)
#: The token fields of a ``stream.usage.other_models`` entry (:class:`OtherModelUsage`).
OTHER_MODEL_FIELDS: tuple[str, ...] = tuple(
    b.usage for b in _REPORTED if b.usage and b.other_models
)


class _Check:
    """Collects whether any figure had to be corrected while building one usage."""

    def __init__(self, anomalies: Iterable[str] = ()) -> None:
        self.anomalies = list(dict.fromkeys(anomalies))

    def flag(self) -> None:
        if USAGE_INCONSISTENT not in self.anomalies:
            self.anomalies.append(USAGE_INCONSISTENT)

    def count(self, value: int | None) -> int:
        """``value`` as a count: ``None`` is 0; a negative count is 0, flagged."""
        if value is None:
            return 0
        if value < 0:
            self.flag()
            return 0
        return value

    def at_most(self, value: int, limit: int) -> int:
        """``value``, or ``limit`` (flagged) when it is above it."""
        if value > limit:
            self.flag()
            return limit
        return value


def _input_side(
    check: _Check,
    input_tokens: int | None,
    cache_read: int | None,
    cache_creation: int | None,
    cache_creation_1h: int | None,
    input_includes_cache: bool,
) -> tuple[int, int, int, int]:
    total = check.count(input_tokens)
    read = check.count(cache_read)
    write = check.count(cache_creation)
    if input_includes_cache:
        # OpenAI's prompt count includes the cache reads (and writes where reported): what is
        # above it was never reported as input, so it is cut to what the prompt holds
        read = check.at_most(read, total)
        write = check.at_most(write, total - read)
        total -= read + write
    write_1h = check.at_most(check.count(cache_creation_1h), write)
    return total, read, write, write_1h


def build_input(
    *,
    input_tokens: int | None,
    cache_read: int | None = None,
    cache_creation: int | None = None,
    cache_creation_1h: int | None = None,
    input_includes_cache: bool,
    anomalies: Iterable[str] = (),
) -> InputUsage:
    """An :class:`InputUsage` from a provider's raw counts (``None``: not reported, 0).

    ``input_includes_cache``: the provider's ``input_tokens`` includes the cache reads and
    writes (OpenAI's ``prompt_tokens``), else the three counts are disjoint (Anthropic).
    Contradictions are corrected and flagged as the module doc says.
    """
    check = _Check(anomalies)
    counts = _input_side(
        check, input_tokens, cache_read, cache_creation, cache_creation_1h, input_includes_cache
    )
    return InputUsage(*counts, anomalies=tuple(check.anomalies))


def build_usage(
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    cache_read: int | None = None,
    cache_creation: int | None = None,
    cache_creation_1h: int | None = None,
    reasoning: int | None = None,
    input_includes_cache: bool,
    service_tier: str | None = None,
    units: Mapping[str, int] | None = None,
    other_models: Iterable[OtherModelUsage] = (),
    anomalies: Iterable[str] = (),
    counters: Mapping[str, int] | None = None,
) -> Usage:
    """A :class:`Usage` from a provider's raw counts (``None``: not reported, 0); see
    :func:`build_input` for the input side. ``units`` and ``counters``: raw counts by name (a
    negative one is 0, flagged; 0 counts are left out); ``other_models``: entries whose counts
    may be negative (0, flagged), merged per model in order of first appearance, at most
    :data:`MAX_OTHER_MODELS` models."""
    check = _Check(anomalies)
    counts = _input_side(
        check, input_tokens, cache_read, cache_creation, cache_creation_1h, input_includes_cache
    )
    output = check.count(output_tokens)
    reasoning_tokens = check.at_most(check.count(reasoning), output)
    return Usage(
        input_tokens=counts[0],
        output_tokens=output,
        cache_read_input_tokens=counts[1],
        cache_creation_input_tokens=counts[2],
        reasoning_tokens=reasoning_tokens,
        cache_creation_1h_input_tokens=counts[3],
        service_tier=service_tier,
        units=_clean_counts(check, units),
        other_models=_merge_models(check, other_models),
        counters=_clean_counts(check, counters),
        anomalies=tuple(check.anomalies),
    )


def _clean_counts(check: _Check, raw: Mapping[str, int] | None) -> dict[str, int]:
    """Counts by name (units, counters): a negative one 0 (flagged), zeros left out, at most
    :data:`MAX_UNITS` names."""
    clean: dict[str, int] = {}
    for name, value in (raw or {}).items():
        count = check.count(value)
        if count and len(clean) < MAX_UNITS:
            clean[name] = count
    return clean


def _merge_models(check: _Check, entries: Iterable[OtherModelUsage]) -> tuple[OtherModelUsage, ...]:
    merged: dict[str, list[int]] = {}
    for entry in entries:
        values = [check.count(getattr(entry, name)) for name in _MODEL_COUNTS]
        if entry.model not in merged:
            if len(merged) == MAX_OTHER_MODELS:
                continue
            merged[entry.model] = [0] * len(_MODEL_COUNTS)
        merged[entry.model] = [a + b for a, b in zip(merged[entry.model], values, strict=True)]
    return tuple(OtherModelUsage(model, *values) for model, values in merged.items())


def _count_fields(cls: type) -> tuple[str, ...]:
    """The token counts of one of the dataclasses above, in field order."""
    return tuple(f.name for f in fields(cls) if f.type == "int")


_MODEL_COUNTS = _count_fields(OtherModelUsage)
# Each count a tap reads is a declared bucket's field (a misspelt one would never be reported);
# a declared bucket that none reads is reported as 0 (``_counts``).
assert set(_count_fields(Usage)) <= set(TOKEN_FIELDS)
assert set(_count_fields(InputUsage)) <= set(INPUT_FIELDS)
assert set(_MODEL_COUNTS) <= set(OTHER_MODEL_FIELDS)
