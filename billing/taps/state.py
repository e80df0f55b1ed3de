"""A tap's running account of one attempt: what it has counted and what the provider reported.

:class:`TapState` holds it: the protocol's tap (:class:`billing.taps.base.Tap`, which feeds it)
updates it through the ``_set_*`` / ``_count_deltas`` methods, and the gateway and the closing
events (:mod:`billing.taps.events`) read it through properties, every count in tokens, in the
contract's semantics (:mod:`billing.taps.usage`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Generic, TypeVar

from billing.taps.fields import normalize_error, usd_at
from billing.taps.usage import InputUsage, OtherModelUsage, Usage, build_input, build_usage

__all__ = ["Reads", "TapState"]

T = TypeVar("T")


class Reads(Generic[T]):
    """A read-only attribute of a tap that returns one of its private attributes."""

    def __init__(self, attr: str, doc: str) -> None:
        self._attr = attr
        self.__doc__ = doc

    def __get__(self, tap: object, owner: type | None = None) -> T:
        value: T = getattr(tap, self._attr)
        return value


class TapState:
    """The running account of one streaming attempt (see :class:`billing.taps.base.Tap` for
    what each property tells); not changed by its readers."""

    def __init__(self) -> None:
        # output accounting
        self._exact_output: int | None = None
        self._deltas_total = 0
        self._deltas_since_exact = 0
        # reported state
        self._usage: Usage | None = None
        self._input: InputUsage | None = None
        self._stop_reason: str | None = None
        self._model: str | None = None
        self._error: dict[str, Any] | None = None
        self._service_tier: str | None = None
        self._inference_geo: str | None = None
        # units counted from the stream's own items (not from a usage report), e.g. the
        # Responses API's web_search_call output items
        self._stream_units: dict[str, int] = {}
        # the provider's usage counts seen so far, by the protocol's own names (a later report
        # of a count replaces it)
        self._raw: dict[str, int] = {}
        # the cost the provider reported for the attempt (OpenRouter ``usage.cost``), exact
        self._provider_cost: str | None = None
        # the JSON text of the event (or body) being read: an amount is read from its digits
        self._raw_event: bytes = b""

    # -- state updates for subclasses ------------------------------------------------------

    def _count_deltas(self, n: int = 1) -> None:
        """Count ``n`` content deltas (one estimated output token each)."""
        if n > 0:
            self._deltas_total += n
            self._deltas_since_exact += n

    def _set_openai_usage(
        self,
        input_total: int | None,
        cached: int | None,
        cache_write: int | None,
        output: int | None,
        reasoning: int | None,
        units: dict[str, int] | None = None,
        cost_path: tuple[str, ...] | None = None,
    ) -> None:
        """Record an OpenAI-style usage, whose input total includes cache reads and writes.

        Converts to the contract's semantics (CONTRACT "Token semantics"): ``input_tokens =
        total − cached − cache_write``, with contradictions corrected and flagged by
        :func:`billing.taps.usage.build_usage` (cached above the total: cache read = the total,
        input 0). A usage without input only updates the output count; one without output only
        records the input. ``units``: units the usage reports (name → count). ``cost_path``:
        where the provider's cost of the attempt is in the event's JSON text, when it is there
        (:meth:`_set_provider_cost`).
        """
        if cost_path is not None:
            self._set_provider_cost(cost_path)
        if input_total is None:
            if output is not None:
                self._set_exact_output(max(0, output))
            return
        if output is None:
            self._set_input(
                build_input(
                    input_tokens=input_total,
                    cache_read=cached,
                    cache_creation=cache_write,
                    input_includes_cache=True,
                )
            )
            return
        self._set_usage(
            self._build_usage(
                input_tokens=input_total,
                output_tokens=output,
                cache_read=cached,
                cache_creation=cache_write,
                reasoning=reasoning,
                input_includes_cache=True,
                units=units,
            )
        )

    def _build_usage(
        self,
        *,
        input_tokens: int | None,
        output_tokens: int | None,
        input_includes_cache: bool,
        cache_read: int | None = None,
        cache_creation: int | None = None,
        cache_creation_1h: int | None = None,
        reasoning: int | None = None,
        units: dict[str, int] | None = None,
        other_models: tuple[OtherModelUsage, ...] = (),
        anomalies: tuple[str, ...] = (),
        counters: dict[str, int] | None = None,
    ) -> Usage:
        """A :class:`Usage` from the provider's raw counts (see
        :func:`billing.taps.usage.build_usage`), with the served tier seen so far and the units
        counted from the stream (a unit the usage itself reports wins)."""
        return build_usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read=cache_read,
            cache_creation=cache_creation,
            cache_creation_1h=cache_creation_1h,
            reasoning=reasoning,
            input_includes_cache=input_includes_cache,
            service_tier=self._service_tier,
            units={**self._stream_units, **(units or {})},
            other_models=other_models,
            anomalies=anomalies,
            counters=counters,
        )

    def _set_provider_cost(self, path: tuple[str, ...]) -> None:
        """Record the provider's cost of the attempt, read exactly from the current event's
        JSON text at ``path`` (:func:`billing.taps.fields.usd_at`); a later report replaces
        it, an unreadable one is left out."""
        cost = usd_at(self._raw_event, path)
        if cost is not None:
            self._provider_cost = cost

    def _set_service_tier(self, tier: str | None) -> None:
        """Record the tier the upstream says it served (a later report replaces it)."""
        if tier:
            self._service_tier = tier
            if self._usage is not None and self._usage.service_tier != tier:
                self._usage = replace(self._usage, service_tier=tier)

    def _set_inference_geo(self, geo: str | None) -> None:
        """Record where the upstream says it ran the call (a later report replaces it)."""
        if geo:
            self._inference_geo = geo

    def _set_stream_unit(self, name: str, count: int) -> None:
        """Record a unit counted from the stream's own items (a running count)."""
        self._stream_units[name] = count

    def _set_exact_output(self, output_tokens: int) -> None:
        """Record a running or final output count reported by the stream (a snapshot)."""
        self._exact_output = output_tokens
        self._deltas_since_exact = 0

    def _set_usage(self, usage: Usage) -> None:
        """Record a usage reported by the provider; it replaces any earlier report."""
        self._usage = usage
        self._set_exact_output(usage.output_tokens)
        self._input = usage.input

    def _set_input(self, input_usage: InputUsage) -> None:
        self._input = input_usage

    def _set_stop_reason(self, reason: str | None) -> None:
        if reason:
            self._stop_reason = reason

    def _set_model(self, model: str | None) -> None:
        if model:
            self._model = model

    def _set_error(self, raw: object, default_type: str = "api_error") -> None:
        """Record an in-stream error; the first one wins, a later one only adds fields."""
        err = normalize_error(raw, default_type)
        if self._error is None:
            self._error = err
        else:
            for key, value in err.items():
                self._error.setdefault(key, value)

    # -- readable state --------------------------------------------------------------------

    @property
    def output_tokens(self) -> int:
        """Output tokens generated so far (tokens).

        The last count the stream reported plus one per content delta seen after it; without
        any reported count, one per content delta.
        """
        if self._exact_output is None:
            return self._deltas_total
        return self._exact_output + self._deltas_since_exact

    @property
    def output_tokens_is_estimate(self) -> bool:
        """True when :attr:`output_tokens` is (partly) counted from deltas, not reported."""
        return self._exact_output is None or self._deltas_since_exact > 0

    content_deltas = Reads[int](
        "_deltas_total", "Number of non-empty content deltas seen (all choices, all kinds)."
    )
    usage = Reads[Usage | None](
        "_usage", "The latest usage the provider reported (contract semantics), or ``None``."
    )

    @property
    def usage_is_final(self) -> bool:
        """True when a reported usage exists and no content was generated after it."""
        return self._usage is not None and self._deltas_since_exact == 0

    input_reported = Reads[InputUsage | None](
        "_input", "Input, cache-read and cache-write tokens reported so far, or ``None``."
    )
    stop_reason = Reads[str | None](
        "_stop_reason",
        "Why generation stopped, in the protocol's own words, or ``None`` if not known.",
    )
    model = Reads[str | None]("_model", "The model name the upstream reported, or ``None``.")
    service_tier = Reads[str | None](
        "_service_tier",
        "The service tier the upstream says it SERVED (never the one asked for), or ``None``.",
    )

    inference_geo = Reads[str | None](
        "_inference_geo",
        "Where the upstream says it ran the call (Anthropic ``usage.inference_geo``), or ``None``.",
    )

    @property
    def units(self) -> dict[str, int]:
        """Billable non-token units seen so far (name → count > 0): those the latest usage
        reports, else those counted from the stream's items."""
        units = {name: count for name, count in self._stream_units.items() if count > 0}
        if self._usage is not None:
            units.update(self._usage.units)
        return units

    @property
    def counters(self) -> dict[str, int]:
        """What the provider counts but bills no fee per use (name → count > 0, Anthropic
        ``server_tool_use.web_fetch_requests``), from the latest usage."""
        return {} if self._usage is None else dict(self._usage.counters)

    provider_cost_usd = Reads[str | None](
        "_provider_cost",
        "The cost in USD the provider reported for the attempt (a decimal string), or ``None``.",
    )

    @property
    def error(self) -> dict[str, Any] | None:
        """The first in-stream error: the provider's error fields plus ``type`` and ``message``
        (strings, always present), or ``None``."""
        return None if self._error is None else dict(self._error)
