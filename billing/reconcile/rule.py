"""The billing rule: one call's events in, billed figures out. Pure: no database, no clock.

Source: CONTRACT "Reconciliation" and "Usage dimensions (v2)". Upstream usage is authoritative;
usage and counters are snapshots (the largest or latest wins, never summed within an attempt);
attempts are summed. v2: an attempt takes its winning usage's served tier, units and other
models' tokens (counted in the call's buckets, and listed per model); an estimate without input
takes ``stream.started.input_tokens``; an attempt without a disconnect and without any delivered
count delivered its billed output; anomalies a gateway reports in the usage are carried onto
the call.

This is the rule. ``billing.reconcile.fastpath`` restates it in SQL for the most frequent shape of
call (``is_common``); ``tests/reconcile/test_fastpath_property.py`` proves the two agree
over calls generated from the event schemas, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from billing.anomalies import (
    DELIVERED_EXCEEDS_BILLED,
    INPUT_UNKNOWN,
    STARTED_MISSING,
    USAGE_INCONSISTENT,
    USAGE_MISSING,
)
from billing.dimensions import BUCKETS, Tokens
from billing.ingest.schemas import StreamFailed, StreamStarted, StreamUsage
from billing.money import usd_to_pusd
from billing.reconcile.stored import AnyEvent, StoredFailed, StoredStarted, StoredUsage


@dataclass(slots=True)
class AttemptFigures:
    """One upstream attempt's billed figures (CONTRACT "Reconciliation", per attempt); not
    changed once built.

    ``model`` is the attempt's ``stream.started.model`` (the call's when the attempt has none);
    ``usage_source`` is ``upstream`` or ``estimate``; ``status`` is ``failed``,
    ``client_disconnected`` or ``completed``.
    """

    attempt: int
    model: str | None
    tokens: Tokens
    usage_source: str
    status: str
    has_started: bool
    error_type: str | None
    stop_reason: str | None
    anomalies: tuple[str, ...]
    #: (v2) The tier the upstream served (None: not reported), the units (name → count) and the
    #: tokens billed at other models' rates (model → ``Tokens``), from the winning usage.
    service_tier: str | None = None
    units: dict[str, int] = field(default_factory=dict)
    other_models: dict[str, Tokens] = field(default_factory=dict)
    #: (v3) What the provider counts but does not bill per use (name → count), the cost it
    #: reported itself in picodollars (None: not reported) and the place it says it served the
    #: attempt, from the winning usage.
    counters: dict[str, int] = field(default_factory=dict)
    provider_cost_pusd: int | None = None
    inference_geo: str | None = None

    def context_tokens(self) -> int:
        """Input + cache read + cache creation tokens (the prompt's buckets, ``_CONTEXT``):
        what a long-context threshold is about."""
        tokens = self.tokens
        return sum(getattr(tokens, name) for name in _CONTEXT)


@dataclass(slots=True)
class CallFigures:
    """A call's figures: the sum of its attempts, plus identity from the first ``stream.started``;
    not changed once built.

    ``complete`` is true when the call may settle now without waiting for ``settle_after``: its
    ``stream.started`` arrived and every attempt has upstream usage.
    """

    request_id: str
    api_key_id: str | None
    model: str | None
    protocol: str | None
    metadata: dict[str, str] | None
    started_at: datetime | None
    ended_at: datetime | None
    attempts: tuple[AttemptFigures, ...]
    tokens: Tokens
    usage_source: str
    status: str
    error_type: str | None
    stop_reason: str | None
    complete: bool
    anomalies: tuple[str, ...] = field(default=())
    #: (v2) The last attempt's served tier that reported one, the units summed over the
    #: attempts (name → count), and the tokens billed at other models' rates summed per model
    #: (model → ``Tokens``; v3: not counted in ``tokens``, which are the figures billed at the
    #: call's own models, CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported
    #: cost (v3)").
    service_tier: str | None = None
    units: dict[str, int] = field(default_factory=dict)
    other_models: dict[str, Tokens] = field(default_factory=dict)
    #: (v3) The counters summed over the attempts, the provider's own cost summed over the
    #: attempts that reported one (None: none did), the last reported inference geo.
    counters: dict[str, int] = field(default_factory=dict)
    provider_cost_pusd: int | None = None
    inference_geo: str | None = None


#: The buckets with a ``stream.usage`` field that the rule takes as the usage counts them (0
#: without usage; the input from ``stream.started`` when it has none): all but the ``derived``
#: ones, the billed, delivered and undelivered output, which ``_attempt_figures`` works out from
#: the usage and the counters.
_PASSED = tuple(b for b in BUCKETS if b.usage is not None and not b.derived)
_PASSED_NAMES = tuple(b.name for b in _PASSED)
_usage_counts = attrgetter(*(b.usage for b in _PASSED if b.usage is not None))
#: A passed bucket's ``stream.usage`` field.
_USAGE_FIELD = {b.name: b.usage for b in _PASSED if b.usage is not None}
#: The buckets of an ``other_models`` entry (``other_models``), with its field and its default
#: (``None``: the entry must carry it).
_OTHER = tuple((b.name, b.usage, None if b.required else 0) for b in BUCKETS if b.other_models)
#: What a long-context threshold counts: the prompt's buckets, each once (not its parts).
_CONTEXT = tuple(b.name for b in BUCKETS if b.prompt and b.part_of is None)


def _usage_key(usage: StreamUsage | StoredUsage) -> tuple[datetime, int, str]:
    # The latest occurred_at wins; ties go to the larger output_tokens, then the larger event_id.
    return (usage.occurred_at, usage.output_tokens, usage.event_id)


def _attempt_figures(number: int, events: list[AnyEvent], call_model: str | None) -> AttemptFigures:
    # One pass over the attempt's events (this runs for every call of every reconciliation step).
    # Event ids are unique here, so no two events tie on any of the keys below.
    first_started: StreamStarted | StoredStarted | None = None
    upstream: StreamUsage | StoredUsage | None = None
    estimate: StreamUsage | StoredUsage | None = None
    last_failure: StreamFailed | StoredFailed | None = None
    disconnected = False
    anomalies: set[str] = set()
    usages: list[StreamUsage | StoredUsage] = []

    delivered = 0
    generated = 0
    delivered_counts = False
    for e in events:
        if e.type == "stream.tokens":
            delivered_counts = True
            if e.output_tokens_delivered > delivered:
                delivered = e.output_tokens_delivered
            if e.output_tokens_generated > generated:
                generated = e.output_tokens_generated
        elif e.type == "stream.usage":
            usages.append(e)
            if e.source == "upstream":
                if upstream is None or _usage_key(e) > _usage_key(upstream):
                    upstream = e
            elif estimate is None or _usage_key(e) > _usage_key(estimate):
                estimate = e
        elif e.type == "stream.started":
            if first_started is None or (e.occurred_at, e.event_id) < (
                first_started.occurred_at,
                first_started.event_id,
            ):
                first_started = e
        elif e.type == "stream.client_disconnected":
            disconnected = True
            delivered = max(delivered, e.output_tokens_delivered)
            generated = max(generated, e.output_tokens_generated or 0)
        else:
            generated = max(generated, e.output_tokens_generated or 0)
            if last_failure is None or (e.occurred_at, e.event_id) > (
                last_failure.occurred_at,
                last_failure.event_id,
            ):
                last_failure = e

    if upstream is not None:
        billed = upstream.output_tokens
        if billed < delivered:
            anomalies.add(DELIVERED_EXCEEDS_BILLED)
    else:
        billed = max(estimate.output_tokens if estimate else 0, generated, delivered)
    usage = upstream or estimate
    if not delivered_counts and not disconnected:
        # A stream that ended without a disconnect delivered what it generated (CONTRACT
        # "Reconciliation", v2), also when the gateway reported no delivered count.
        delivered = billed
    undelivered = max(0, billed - delivered)
    if usage is not None and usage.anomalies:
        anomalies.update(usage.anomalies)  # found by the gateway or tap: carried onto the call
    # The usage's counts as they are; without a usage, or for an estimate without input ("not
    # known", never 0 over a known input: CONTRACT "Usage dimensions (v2)"), the input comes
    # from stream.started, else 0 with input_unknown.
    counts = {} if usage is None else dict(zip(_PASSED_NAMES, _usage_counts(usage), strict=True))
    if usage is not None and len(usages) > 1 and _keep_largest(counts, usage, usages):
        anomalies.add(USAGE_INCONSISTENT)
    started_input = first_started.input_tokens if first_started is not None else None
    if (
        usage is None
        or usage.input_tokens is None
        # v3: an estimate's explicit 0 is "not known" when stream.started has a count
        or (usage is estimate and not counts["input_tokens"] and started_input is not None)
    ):
        if started_input is not None:
            counts["input_tokens"] = started_input
        else:
            counts["input_tokens"] = 0
            anomalies.add(INPUT_UNKNOWN)
    tokens = Tokens(
        **counts,
        output_tokens_billed=billed,
        output_tokens_delivered=delivered,
        output_tokens_undelivered=undelivered,
    )

    if last_failure is not None:
        status = "failed"
    elif disconnected:
        status = "client_disconnected"
    else:
        status = "completed"
    figures = AttemptFigures(
        attempt=number,
        model=first_started.model if first_started else call_model,
        tokens=tokens,
        usage_source="upstream" if upstream is not None else "estimate",
        status=status,
        has_started=first_started is not None,
        error_type=last_failure.error_type if last_failure else None,
        stop_reason=usage.stop_reason if usage else None,
        anomalies=tuple(sorted(anomalies)),
    )
    if usage is not None:
        figures.service_tier = usage.service_tier
        if usage.units:
            figures.units = {name: count for name, count in usage.units.items() if count}
        if usage.other_models:
            figures.other_models = _other_models(usage.other_models)
        if usage.counters:
            figures.counters = {name: count for name, count in usage.counters.items() if count}
        if usage.provider_cost_usd is not None:
            figures.provider_cost_pusd = usd_to_pusd(usage.provider_cost_usd)
        figures.inference_geo = usage.inference_geo
    return figures


def _keep_largest(
    counts: dict[str, int],
    usage: StreamUsage | StoredUsage,
    usages: list[StreamUsage | StoredUsage],
) -> bool:
    """v3: a count that the winning ``usage`` lowers to 0 where an earlier usage of the same
    source had it above 0 keeps the largest value reported (CONTRACT "Non-streaming calls,
    hosted-tool fees, provider-reported cost (v3)"); True when one was kept. An estimate's
    input left out is not a 0."""
    kept = False
    for name, value in counts.items():
        if value:
            continue
        largest = max(
            (
                getattr(other, _USAGE_FIELD[name]) or 0
                for other in usages
                if other.source == usage.source
            ),
            default=0,
        )
        if largest and (name != "input_tokens" or usage.input_tokens is not None):
            counts[name] = largest
            kept = True
    return kept


def _other_models(entries: Iterable[Any]) -> dict[str, Tokens]:
    """``stream.usage.other_models`` as ``Tokens`` per model (entries of one model summed: they
    are parts of one snapshot, such as two advisor iterations). Their output was not written to
    the client as the call's: it is billed, neither delivered nor undelivered."""
    by_model: dict[str, Tokens] = {}
    for entry in entries:
        tokens = Tokens(
            **{
                name: entry[field] if default is None else entry.get(field, default)
                for name, field, default in _OTHER
            }
        )
        model = entry["model"]
        by_model[model] = by_model[model] + tokens if model in by_model else tokens
    return by_model


def reconcile_call(request_id: str, events: Iterable[AnyEvent]) -> CallFigures:
    """Compute a call's billed figures from its events, in any order and with duplicates.

    ``events`` must all belong to ``request_id`` (validated event models, or events read back
    from storage by ``billing.reconcile.stored``); an event_id seen twice counts once. Returns the
    per-attempt and per-call figures (tokens are integers). Raises ``ValueError`` when no event is
    given. Source: CONTRACT "Reconciliation".
    """
    unique: dict[str, AnyEvent] = {}
    for event in events:
        unique.setdefault(event.event_id, event)
    if not unique:
        raise ValueError(f"call {request_id!r} has no events")
    by_attempt: dict[int, list[AnyEvent]] = {}
    # The call is named by the lowest attempt's stream.started (its first one if repeated).
    first: StreamStarted | StoredStarted | None = None
    earliest: datetime | None = None
    latest: datetime | None = None
    for event in unique.values():
        group = by_attempt.get(event.attempt)
        if group is None:
            by_attempt[event.attempt] = [event]
        else:
            group.append(event)
        when = event.occurred_at
        if earliest is None or when < earliest:
            earliest = when
        if latest is None or when > latest:
            latest = when
        if event.type == "stream.started" and (
            first is None
            or (event.attempt, event.occurred_at, event.event_id)
            < (first.attempt, first.occurred_at, first.event_id)
        ):
            first = event
    call_model = first.model if first else None
    attempts = tuple(_attempt_figures(n, by_attempt[n], call_model) for n in sorted(by_attempt))
    if len(attempts) == 1:
        total = attempts[0].tokens
    else:
        total = Tokens()
        for figures in attempts:
            total = total + figures.tokens
    units: dict[str, int] = {}
    counters: dict[str, int] = {}
    other_models: dict[str, Tokens] = {}
    service_tier = None
    inference_geo = None
    provider_cost: int | None = None
    for figures in attempts:
        for name, count in figures.units.items():
            units[name] = units.get(name, 0) + count
        for name, count in figures.counters.items():
            counters[name] = counters.get(name, 0) + count
        for model, tokens in figures.other_models.items():
            other_models[model] = other_models[model] + tokens if model in other_models else tokens
        if figures.service_tier is not None:
            service_tier = figures.service_tier
        if figures.inference_geo is not None:
            inference_geo = figures.inference_geo
        if figures.provider_cost_pusd is not None:
            provider_cost = (provider_cost or 0) + figures.provider_cost_pusd
    anomalies = {code for a in attempts for code in a.anomalies}
    all_upstream = all(a.usage_source == "upstream" for a in attempts)
    if not all_upstream:
        anomalies.add(USAGE_MISSING)
    if first is None:
        anomalies.add(STARTED_MISSING)
    last = attempts[-1]
    if last.status == "failed":
        status = "failed"
    elif any(a.status == "client_disconnected" for a in attempts):
        status = "client_disconnected"
    else:
        status = "completed"
    assert earliest is not None and latest is not None
    return CallFigures(
        request_id=request_id,
        api_key_id=first.api_key_id if first else None,
        model=call_model,
        protocol=first.protocol if first else None,
        metadata=dict(first.metadata) if first and first.metadata else None,
        started_at=first.occurred_at if first else earliest,
        ended_at=latest,
        attempts=attempts,
        tokens=total,
        usage_source="upstream" if all_upstream else "estimate",
        status=status,
        error_type=last.error_type,
        stop_reason=last.stop_reason,
        complete=first is not None and all_upstream,
        anomalies=tuple(sorted(anomalies)),
        service_tier=service_tier,
        units=dict(sorted(units.items())),
        other_models=dict(sorted(other_models.items())),
        counters=dict(sorted(counters.items())),
        provider_cost_pusd=provider_cost,
        inference_geo=inference_geo,
    )


def _text_ok(value: object) -> bool:
    return value is None or type(value) is str


def check_figures(fig: CallFigures) -> None:
    """Raise ``ValueError`` unless every value of ``fig`` has the type ingest guarantees: token
    counts and attempts non-negative integers, names text. Events read back by
    ``billing.reconcile.stored.decode`` are not validated field by field; any stored value that
    decides a figure ends up here (a value
    that decides nothing, say a smaller counter, cannot change what is billed). The call's
    totals are sums of its attempts' figures, so checking those covers them."""
    ok = _text_ok(fig.api_key_id) and _text_ok(fig.protocol) and _text_ok(fig.model)
    ok = ok and (fig.metadata is None or type(fig.metadata) is dict)
    for attempt in fig.attempts:
        values = (attempt.attempt, *attempt.tokens.values())
        try:
            # sum() of ints is an int; a float makes it a float, text raises TypeError.
            ok = ok and type(sum(values)) is int and min(values) >= 0
        except TypeError:
            ok = False
        ok = ok and _text_ok(attempt.model) and _text_ok(attempt.error_type)
        ok = ok and _text_ok(attempt.stop_reason) and _text_ok(attempt.inference_geo)
        ok = ok and all(type(c) is int and c >= 0 for c in attempt.counters.values())
    if not ok:
        raise ValueError(f"the stored events of call {fig.request_id!r} are not valid events")
