"""A seeded simulation in the spirit of TigerBeetle's VOPR: random gateways, random stream
lifecycles, random faults, and an auditor that computes what the service must answer and bill on
its own and compares after every reconciliation pass.

- Time is virtual: ingest's clock (``billing.api.events``) and every pass run on the simulation's
  clock, so ``settle_after`` (300 s) passes in a step and a seed replays exactly.
- Gateways post batches of what their calls emitted; faults: reordering within and across
  batches, events held back (sometimes past ``settle_after``, so the call settles without them
  and is adjusted later), the same batch posted twice, answers lost (the batch is posted again),
  the same usage reported under two event ids, an event id reused with other content (409, nothing
  stored), an invalid event (422, nothing stored), prices added or versioned while calls are
  settled, the app restarted between steps, and the reconciler crashing at a random step of a pass
  (its transaction never commits) and run again.
- The auditor implements CONTRACT "Reconciliation" and "Cost" itself (it does not import
  ``billing.reconcile``): per attempt and per call, figures, status, anomalies, cost, which calls
  must be settled, and what each ``POST /v1/events`` must answer. After every pass it compares the
  service's calls, attempts and ledger sums with its own, and runs ``tests.invariants``.

A failing seed raises ``SimulationFailure`` naming the seed, the step and how to replay it:
``BILLING_TEST_SEED=<seed> pytest tests/system/test_simulation.py`` or
``python bench/simulate.py --seed <seed>``. The suite runs a few seeds;
``python bench/simulate.py --seeds 200`` runs many.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event as sa_event
from sqlalchemy import select, update

import billing.api.events as events_api
from billing.dimensions import TOKEN_FIELDS
from billing.reconcile.runner import run_pass
from billing.server.app import create_app
from billing.settings import Settings
from billing.storage.db import make_engine, make_sessionmaker
from billing.storage.models import Call, CallAttempt, LedgerEntry
from tests.invariants import check_invariants, engine_for, ledger_sums

pytestmark = pytest.mark.slow

SETTLE_AFTER = 300.0
BASE = datetime(2031, 3, 3, 9, 0, tzinfo=UTC)
MODELS = ("sim-a", "sim-b", "sim-c")
PROTOCOLS = ("openai.chat_completions", "openai.responses", "anthropic.messages")
SUITE_SEEDS = (1, 2, 3, 4, 5, 6)


class SimulationFailure(AssertionError):
    """The service disagreed with the auditor (or broke an invariant) under a seed."""


# -- the virtual clock ---------------------------------------------------------------------------


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@contextmanager
def virtual_clock(clock: Clock) -> Iterator[None]:
    """Make ingest read ``clock`` (``billing.api.events`` takes ``datetime.now(UTC)``)."""
    real = events_api.__dict__["datetime"]

    class _Virtual(real):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> datetime:
            return clock.now if tz is not None else clock.now.replace(tzinfo=None)

    setattr(events_api, "datetime", _Virtual)  # noqa: B010 - the module does not export it
    try:
        yield
    finally:
        setattr(events_api, "datetime", real)  # noqa: B010


def _ts(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


# -- the auditor: the contract's rule, written again -----------------------------------------------


@dataclass(frozen=True)
class PriceVersion:
    model: str
    effective_from: datetime
    input: int  # micro-USD per million tokens = picodollars per token
    output: int
    cache_read: int
    cache_creation: int

    def body(self) -> dict[str, str]:
        def usd(v: int) -> str:
            return str(Decimal(v) / Decimal(1_000_000))

        return {
            "model": self.model,
            "effective_from": _ts(self.effective_from),
            "input_usd_per_mtok": usd(self.input),
            "output_usd_per_mtok": usd(self.output),
            "cache_read_usd_per_mtok": usd(self.cache_read),
            "cache_creation_usd_per_mtok": usd(self.cache_creation),
        }


@dataclass
class Expected:
    """A call's figures as the contract defines them."""

    tokens: dict[str, int]
    attempts: dict[int, dict[str, Any]]
    cost_pusd: int | None
    api_key_id: str | None
    model: str | None
    status: str
    usage_source: str
    error_type: str | None
    stop_reason: str | None
    anomalies: set[str]
    complete: bool
    lines: dict[tuple[Any, ...], tuple[int, ...]]


def _latest(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Of several usages of one source: the latest occurred_at, then the larger output_tokens,
    then the larger event_id."""
    if not events:
        return None
    return max(events, key=lambda e: (_parse(e["occurred_at"]), e["output_tokens"], e["event_id"]))


#: The usage's counts that a later usage cannot lower to 0 (v3); the billed output is worked
#: out from the usage and the progress counters.
_KEPT = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "reasoning_tokens",
)


def audit_call(events: list[dict[str, Any]], prices: list[PriceVersion]) -> Expected:
    """CONTRACT "Reconciliation": a call's expected figures from its stored events."""
    by_attempt: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_attempt[e.get("attempt", 1)].append(e)
    starts = [e for e in events if e["type"] == "stream.started"]
    first = min(
        starts,
        key=lambda e: (e.get("attempt", 1), _parse(e["occurred_at"]), e["event_id"]),
        default=None,
    )
    call_model = first["model"] if first else None
    started_at = _parse(first["occurred_at"]) if first else None
    totals = dict.fromkeys(TOKEN_FIELDS, 0)
    attempts: dict[int, dict[str, Any]] = {}
    anomalies: set[str] = set()
    cost: int | None = 0
    for n in sorted(by_attempt):
        evs = by_attempt[n]
        kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in evs:
            kinds[e["type"]].append(e)
        delivered = max(
            [e["output_tokens_delivered"] for e in kinds["stream.tokens"]]
            + [e["output_tokens_delivered"] for e in kinds["stream.client_disconnected"]],
            default=0,
        )
        generated = max(
            [e["output_tokens_generated"] for e in kinds["stream.tokens"]]
            + [
                e.get("output_tokens_generated") or 0
                for e in kinds["stream.client_disconnected"] + kinds["stream.failed"]
            ],
            default=0,
        )
        upstream = _latest([u for u in kinds["stream.usage"] if u["source"] == "upstream"])
        estimate = _latest([u for u in kinds["stream.usage"] if u["source"] == "estimate"])
        usage = upstream or estimate
        own_start = min(
            kinds["stream.started"],
            key=lambda e: (_parse(e["occurred_at"]), e["event_id"]),
            default=None,
        )
        if upstream is not None:
            billed = upstream["output_tokens"]
            if billed < delivered:
                anomalies.add("delivered_exceeds_billed")
        else:
            billed = max(estimate["output_tokens"] if estimate else 0, generated, delivered)
        if not kinds["stream.tokens"] and not kinds["stream.client_disconnected"]:
            delivered = billed  # no disconnect, no delivered count: all delivered (v2)
        counts = dict.fromkeys(_KEPT, 0)
        if usage is not None:
            # v3: a count the winning usage lowers to 0 keeps the largest that a usage of the
            # same source reported, flagged usage_inconsistent (an input left out is not a 0)
            same = [u for u in kinds["stream.usage"] if u["source"] == usage["source"]]
            for name in _KEPT:
                counts[name] = usage.get(name) or 0
                if counts[name] or (name == "input_tokens" and usage.get(name) is None):
                    continue
                largest = max((u.get(name) or 0 for u in same), default=0)
                if largest:
                    counts[name] = largest
                    anomalies.add("usage_inconsistent")
        cread = counts["cache_read_input_tokens"]
        ccreate = counts["cache_creation_input_tokens"]
        ccreate_1h = counts["cache_creation_1h_input_tokens"]
        reasoning = counts["reasoning_tokens"]
        # v3: an estimate's explicit input 0 is "not known" when stream.started has a count
        known_zero = (
            usage is estimate
            and not counts["input_tokens"]
            and own_start is not None
            and own_start.get("input_tokens") is not None
        )
        if usage is not None and usage.get("input_tokens") is not None and not known_zero:
            inp = counts["input_tokens"]
        elif own_start is not None and own_start.get("input_tokens") is not None:
            inp = own_start["input_tokens"]  # an estimate without input: the gateway's count
        else:
            inp = 0
            anomalies.add("input_unknown")
        figures = {
            "input_tokens": inp,
            "cache_read_input_tokens": cread,
            "cache_creation_input_tokens": ccreate,
            "cache_creation_1h_input_tokens": ccreate_1h,
            "output_tokens_billed": billed,
            "output_tokens_delivered": delivered,
            "output_tokens_undelivered": max(0, billed - delivered),
            "reasoning_tokens": reasoning,
        }
        failure = max(
            kinds["stream.failed"],
            key=lambda e: (_parse(e["occurred_at"]), e["event_id"]),
            default=None,
        )
        status = (
            "failed"
            if failure
            else "client_disconnected"
            if kinds["stream.client_disconnected"]
            else "completed"
        )
        model = own_start["model"] if own_start else call_model
        attempts[n] = {
            **figures,
            "model": model,
            "status": status,
            "usage_source": "upstream" if upstream else "estimate",
            "error_type": failure["error_type"] if failure else None,
            "stop_reason": usage.get("stop_reason") if usage else None,
        }
        for name in TOKEN_FIELDS:
            totals[name] += figures[name]
        price = _price_at(prices, model, started_at)
        if price is None or cost is None:
            cost = None
        else:
            cost += (
                inp * price.input
                + cread * price.cache_read
                + ccreate * price.cache_creation
                + billed * price.output
            )
    all_upstream = all(a["usage_source"] == "upstream" for a in attempts.values())
    if not all_upstream:
        anomalies.add("usage_missing")
    if first is None:
        anomalies.add("started_missing")
    if cost is None:
        anomalies.add("unpriced")
    lines: dict[tuple[Any, ...], tuple[int, ...]] = {}
    key = first["api_key_id"] if first else None
    for a in attempts.values():
        price = _price_at(prices, a["model"], started_at)
        rates = (
            None
            if price is None
            else (price.input, price.output, price.cache_read, price.cache_creation)
        )
        line = (key, a["model"], rates)
        before = lines.get(line, (0,) * len(TOKEN_FIELDS))
        lines[line] = tuple(x + a[name] for x, name in zip(before, TOKEN_FIELDS, strict=True))
    lines = {line: tokens for line, tokens in lines.items() if any(tokens)}
    last = attempts[max(attempts)]
    status = (
        "failed"
        if last["status"] == "failed"
        else "client_disconnected"
        if any(a["status"] == "client_disconnected" for a in attempts.values())
        else "completed"
    )
    return Expected(
        totals,
        attempts,
        cost,
        first["api_key_id"] if first else None,
        call_model,
        status,
        "upstream" if all_upstream else "estimate",
        last["error_type"],
        last["stop_reason"],
        anomalies,
        first is not None and all_upstream,
        lines,
    )


def _price_at(
    prices: list[PriceVersion], model: str | None, when: datetime | None
) -> PriceVersion | None:
    if model is None or when is None:
        return None
    found = None
    for p in sorted(prices, key=lambda p: p.effective_from):
        if p.model == model and p.effective_from <= when:
            found = p
    return found


class Auditor:
    """What the service holds, as far as the contract lets an outsider know: the stored events,
    when each call last got a new one, which calls are settled, and the prices."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.last_new: dict[str, datetime] = {}
        self.settled: set[str] = set()
        self.prices: list[PriceVersion] = []

    def expect_post(self, batch: list[dict[str, Any]]) -> tuple[int, Any]:
        """The answer a batch must get: (200, (accepted, duplicates)) or (409, indexes)."""
        seen: dict[str, bytes] = {}
        conflicts = []
        new = 0
        for i, e in enumerate(batch):
            body = _canonical(e)
            eid = e["event_id"]
            before = seen.get(eid)
            if before is None and eid in self.events:
                before = _canonical(self.events[eid])
            if before is None:
                new += 1
                seen[eid] = body
            elif before != body:
                conflicts.append(i)
        if conflicts:
            return 409, conflicts
        return 200, (new, len(batch) - new)

    def stored(self, batch: list[dict[str, Any]], now: datetime) -> None:
        for e in batch:
            if e["event_id"] not in self.events:
                self.events[e["event_id"]] = e
                self.by_call[e["request_id"]].append(e)
                self.last_new[e["request_id"]] = now

    def after_pass(self, now: datetime) -> None:
        cutoff = now - timedelta(seconds=SETTLE_AFTER)
        for rid, events in self.by_call.items():
            if rid in self.settled:
                continue
            if self.last_new[rid] <= cutoff or audit_call(events, self.prices).complete:
                self.settled.add(rid)

    def expected(self, rid: str) -> Expected:
        return audit_call(self.by_call[rid], self.prices)


def _canonical(e: dict[str, Any]) -> bytes:
    body = dict(e)
    body.setdefault("attempt", 1)
    body["occurred_at"] = _ts(_parse(body["occurred_at"]))
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


# -- the world: gateways and their calls ---------------------------------------------------------


@dataclass
class Gateway:
    name: str
    keys: list[str]
    outbox: list[dict[str, Any]] = field(default_factory=list)
    held: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)
    unanswered: list[list[dict[str, Any]]] = field(default_factory=list)


def plan_call(rng: random.Random, rid: str, key: str, start: datetime) -> list[dict[str, Any]]:
    """One call's events with their emission times as ``occurred_at``; a random lifecycle."""
    model = rng.choice(MODELS)
    protocol = rng.choice(PROTOCOLS)
    attempts = rng.choice([1, 1, 1, 2, 3])
    events: list[dict[str, Any]] = []
    t = start

    def emit(type_: str, attempt: int, dt: float | None = None, **fields: Any) -> dict[str, Any]:
        nonlocal t
        t += timedelta(seconds=rng.uniform(0.05, 4.0) if dt is None else dt)
        e = {
            "event_id": f"{rid}.{len(events)}",
            "request_id": rid,
            "type": type_,
            "occurred_at": _ts(t),
            **fields,
        }
        if attempt != 1 or rng.random() < 0.5:
            e["attempt"] = attempt
        events.append(e)
        return e

    no_started = rng.random() < 0.08
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        if not (no_started and attempt == 1) and not (attempt > 1 and rng.random() < 0.1):
            fields: dict[str, Any] = {
                "api_key_id": key,
                "model": model if rng.random() < 0.8 else rng.choice(MODELS),
                "protocol": protocol,
            }
            if rng.random() < 0.6:
                fields["input_tokens"] = rng.randint(0, 3000)
            emit("stream.started", attempt, **fields)
        generated = delivered = 0
        for _ in range(rng.randint(0, 5)):
            generated += rng.randint(0, 120)
            delivered = max(delivered, generated - rng.randint(0, 10))
            emit(
                "stream.tokens",
                attempt,
                output_tokens_generated=generated,
                output_tokens_delivered=min(delivered, generated),
            )
        if rng.random() < 0.25:
            extra = {"output_tokens_generated": generated} if rng.random() < 0.5 else {}
            emit("stream.client_disconnected", attempt, output_tokens_delivered=delivered, **extra)
            generated += rng.randint(0, 300)
        if not last and rng.random() < 0.8:
            emit(
                "stream.failed",
                attempt,
                error_type=rng.choice(["stalled", "upstream_disconnect"]),
                **({"output_tokens_generated": generated} if rng.random() < 0.7 else {}),
            )
            continue
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            source = "upstream" if rng.random() < 0.75 else "estimate"
            usage: dict[str, Any] = {
                "input_tokens": rng.randint(0, 4000),
                "output_tokens": max(0, generated + rng.randint(-20, 40)),
                "source": source,
            }
            if rng.random() < 0.5:
                usage["cache_read_input_tokens"] = rng.randint(0, 2000)
            if rng.random() < 0.3:
                usage["cache_creation_input_tokens"] = rng.randint(0, 1000)
            if rng.random() < 0.4:
                usage["reasoning_tokens"] = rng.randint(0, usage["output_tokens"])
            if rng.random() < 0.5:
                usage["stop_reason"] = rng.choice(["end_turn", "max_tokens", "stop"])
            tie = events and events[-1]["type"] == "stream.usage" and rng.random() < 0.3
            u = emit("stream.usage", attempt, dt=0.0 if tie else None, **usage)
            if rng.random() < 0.15:  # the same usage again, under another event id
                again = dict(u, event_id=f"{rid}.{len(events)}")
                events.append(again)
        if rng.random() < 0.1:
            emit("stream.failed", attempt, error_type="api_error", message="upstream 500")
    return events


# -- the simulation ------------------------------------------------------------------------------


@dataclass
class Stats:
    seed: int
    steps: int = 0
    calls: int = 0
    events: int = 0
    posts: int = 0
    duplicate_posts: int = 0
    lost_answers: int = 0
    conflicts: int = 0
    rewritten_duplicates: int = 0
    invalid: int = 0
    held_back: int = 0
    passes: int = 0
    reconciler_crashes: int = 0
    app_restarts: int = 0
    settle_jumps: int = 0
    prices_added: int = 0
    comparisons: int = 0
    ledger_entries: int = 0
    adjustments: int = 0


class _Crash(BaseException):
    """The simulated crash of a reconciler (raised before a step's commit)."""


class Simulation:
    """One seed: ``run()`` raises ``SimulationFailure`` at the first disagreement."""

    def __init__(self, seed: int, db_url: str, *, steps: int = 60, calls: int = 40) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.db_url = db_url
        self.steps = steps
        self.calls = calls
        self.clock = Clock(BASE)
        self.auditor = Auditor()
        self.stats = Stats(seed)
        self.step = 0
        batch = self.rng.choice([1, 3, 7, 50, 500])
        self.settings = Settings(
            database_url=db_url, settle_after_s=SETTLE_AFTER, reconcile_batch_size=batch
        )
        self.client: TestClient | None = None
        self.engine = make_engine(self.settings)
        self.sessions = make_sessionmaker(self.engine)
        self.check_engine = engine_for(db_url)
        self.crash_at: int | None = None
        sa_event.listen(self.sessions, "before_commit", self._maybe_crash)
        self.commits = 0

    # -- plumbing ------------------------------------------------------------------------------

    def fail(self, message: str) -> SimulationFailure:
        return SimulationFailure(
            f"seed {self.seed}, step {self.step}, virtual time "
            f"{(self.clock.now - BASE).total_seconds():.1f} s: {message}\n"
            f"replay: BILLING_TEST_SEED={self.seed} pytest tests/system/test_simulation.py "
            f"(or python bench/simulate.py --seed {self.seed})"
        )

    def _maybe_crash(self, _session: Any) -> None:
        self.commits += 1
        if self.crash_at is not None and self.commits >= self.crash_at:
            self.crash_at = None
            raise _Crash("the reconciler crashed before this step committed")

    def _start_app(self) -> None:
        self.client = TestClient(create_app(self.settings), base_url="http://127.0.0.1")
        self.client.__enter__()

    def _stop_app(self) -> None:
        if self.client is not None:
            self.client.__exit__(None, None, None)
            self.client = None

    def close(self) -> None:
        self._stop_app()
        self.engine.dispose()
        self.check_engine.dispose()

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> Stats:
        rng = self.rng
        with virtual_clock(self.clock):
            self._start_app()
            try:
                self._setup_prices()
                gateways = [
                    Gateway(f"gw{g}", [f"gw{g}-key{k}" for k in range(rng.randint(1, 3))])
                    for g in range(rng.randint(1, 3))
                ]
                # Calls start over the first part of the run, each emitted at its own times.
                schedule: list[tuple[datetime, Gateway, dict[str, Any]]] = []
                for c in range(self.calls):
                    gw = rng.choice(gateways)
                    start = BASE + timedelta(seconds=rng.uniform(0, self.steps * 8))
                    for e in plan_call(rng, f"s{self.seed}-c{c}", rng.choice(gw.keys), start):
                        schedule.append((_parse(e["occurred_at"]), gw, e))
                schedule.sort(key=lambda item: (item[0], item[2]["event_id"]))
                self.stats.calls = self.calls
                self.stats.events = len(schedule)
                for step in range(1, self.steps + 1):
                    self.step = step
                    self._advance()
                    while schedule and schedule[0][0] <= self.clock.now:
                        _, gw, e = schedule.pop(0)
                        gw.outbox.append(e)
                    for gw in gateways:
                        self._deliver(gw)
                    self._maybe_price()
                    if rng.random() < 0.05:
                        self._stop_app()
                        self._start_app()
                        self.stats.app_restarts += 1
                    if rng.random() < 0.45:
                        self._reconcile()
                # The end: everything is delivered, time passes settle_after, a last pass.
                for _, gw, e in schedule:
                    gw.outbox.append(e)
                self.step += 1
                for gw in gateways:
                    gw.held = [(self.clock.now, e) for _, e in gw.held]
                    while gw.outbox or gw.held or gw.unanswered:
                        self._deliver(gw, final=True)
                self.clock.advance(SETTLE_AFTER + 1)
                self._reconcile(allow_crash=False)
                if self.auditor.settled != set(self.auditor.by_call):
                    raise self.fail("the auditor expects every call settled at the end")
                self.stats.steps = self.step
                return self.stats
            finally:
                self._stop_app()

    def _advance(self) -> None:
        if self.rng.random() < 0.06:
            self.clock.advance(SETTLE_AFTER + self.rng.uniform(1, 60))  # past settle_after
            self.stats.settle_jumps += 1
        else:
            self.clock.advance(self.rng.uniform(0.5, 12))

    def _setup_prices(self) -> None:
        a = PriceVersion(
            "sim-a", BASE - timedelta(days=30), 3_000_000, 15_000_000, 300_000, 3_750_000
        )
        b = PriceVersion("sim-b", BASE - timedelta(days=30), 1_250_000, 10_000_000, 125_000, 0)
        for price in (a, b):
            self._post_price(price)

    def _maybe_price(self) -> None:
        rng = self.rng
        if rng.random() < 0.04 and not any(p.model == "sim-c" for p in self.auditor.prices):
            # The unpriced model gets a price: its settled calls are re-priced by adjustments.
            self._post_price(
                PriceVersion("sim-c", BASE - timedelta(days=1), 500_000, 1_234_567, 1, 2)
            )
        elif rng.random() < 0.03:
            # A new price version from a moment inside the run: calls started since then change.
            starts = [e for e in self.auditor.events.values() if e["type"] == "stream.started"]
            if starts and rng.random() < 0.5:  # exactly at a call's start: in force for it
                at = _parse(rng.choice(starts)["occurred_at"])
            else:
                at = BASE + timedelta(
                    seconds=rng.uniform(0, (self.clock.now - BASE).total_seconds())
                )
                at = at.replace(microsecond=0)
            if any(p.effective_from == at for p in self.auditor.prices):
                return
            model = rng.choice(MODELS)
            self._post_price(
                PriceVersion(
                    model,
                    at,
                    rng.randint(0, 9_000_000),
                    rng.randint(0, 40_000_000),
                    rng.randint(0, 900_000),
                    rng.randint(0, 5_000_000),
                )
            )

    def _post_price(self, price: PriceVersion) -> None:
        assert self.client is not None
        reply = self.client.post("/v1/prices", json=price.body())
        if reply.status_code != 201:
            raise self.fail(f"POST /v1/prices {price.body()}: {reply.status_code} {reply.text}")
        self.auditor.prices.append(price)
        self.stats.prices_added += 1

    # -- a gateway posts -------------------------------------------------------------------------

    def _deliver(self, gw: Gateway, final: bool = False) -> None:
        rng = self.rng
        now = self.clock.now
        released = [e for t, e in gw.held if t <= now]
        gw.held = [(t, e) for t, e in gw.held if t > now]
        pending = gw.outbox + released
        gw.outbox = []
        if not final:
            keep = []
            for e in pending:
                if rng.random() < 0.05:  # held back: a slow path, sometimes past settle_after
                    delay = rng.choice([rng.uniform(1, 30), SETTLE_AFTER + rng.uniform(1, 100)])
                    gw.held.append((now + timedelta(seconds=delay), e))
                    self.stats.held_back += 1
                else:
                    keep.append(e)
            pending = keep
        if rng.random() < 0.4:
            rng.shuffle(pending)
        retries, gw.unanswered = gw.unanswered, []
        for batch in retries:  # answers that were lost: post the same batch again
            self._post(gw, batch, lost_ok=False)
        while pending:
            size = rng.choice([1, 2, 5, 20, 100])
            batch, pending = pending[:size], pending[size:]
            if rng.random() < 0.08 and len(batch) > 1:
                batch.append(dict(rng.choice(batch)))  # the same event twice in one batch
            self._post(gw, batch, lost_ok=not final)
            if rng.random() < 0.08:
                self.stats.duplicate_posts += 1
                self._post(gw, list(batch), lost_ok=False)

    def _post(self, gw: Gateway, batch: list[dict[str, Any]], lost_ok: bool) -> None:
        rng = self.rng
        assert self.client is not None
        if lost_ok and rng.random() < 0.04 and self.auditor.events:
            # An event id reused with other content: 409, nothing of the batch stored.
            victim = dict(self.auditor.events[rng.choice(sorted(self.auditor.events))])
            victim["occurred_at"] = _ts(_parse(victim["occurred_at"]) + timedelta(seconds=1))
            bad = [*batch, victim]
            status, conflicts = self.auditor.expect_post(bad)
            reply = self._send(bad)
            if status != 409 or reply.status_code != 409:
                raise self.fail(
                    f"reused event id: expected 409, got {reply.status_code} "
                    f"{reply.text[:300]} (auditor: {status})"
                )
            got = sorted(c["index"] for c in reply.json()["conflicts"])
            if got != conflicts:
                raise self.fail(f"409 conflicts {got}, expected {conflicts}")
            self.stats.conflicts += 1
        if lost_ok and rng.random() < 0.1 and self.auditor.events:
            # A stored event again, written differently: the same instant in another offset, the
            # default attempt spelt out or left out: the same content, so a duplicate.
            again = dict(self.auditor.events[rng.choice(sorted(self.auditor.events))])
            when = _parse(again["occurred_at"]).astimezone(timezone(timedelta(hours=5, minutes=30)))
            again["occurred_at"] = when.isoformat()
            if again.get("attempt", 1) == 1:
                if "attempt" in again:
                    del again["attempt"]
                else:
                    again["attempt"] = 1
            batch = [*batch, again]
            self.stats.rewritten_duplicates += 1
        if lost_ok and rng.random() < 0.03:
            bad = [
                *batch,
                {
                    **batch[0],
                    "event_id": f"bad-{self.step}-{len(batch)}",
                    "occurred_at": _ts(self.clock.now + timedelta(minutes=10)),
                },
            ]
            reply = self._send(bad)
            if reply.status_code != 422:
                raise self.fail(
                    f"an event 10 minutes ahead: expected 422, got "
                    f"{reply.status_code} {reply.text[:300]}"
                )
            self.stats.invalid += 1
        status, expected = self.auditor.expect_post(batch)
        reply = self._send(batch)
        self.stats.posts += 1
        if reply.status_code != status:
            raise self.fail(
                f"POST /v1/events: {reply.status_code} {reply.text[:300]}, expected "
                f"{status} {expected}"
            )
        if status == 200:
            answer = reply.json()
            if (answer["accepted"], answer["duplicates"]) != expected:
                raise self.fail(
                    f"POST /v1/events answered {answer}, expected accepted/duplicates {expected}"
                )
            self.auditor.stored(batch, self.clock.now)
        if lost_ok and rng.random() < 0.05:  # the answer never reached the gateway
            gw.unanswered.append(list(batch))
            self.stats.lost_answers += 1

    def _send(self, batch: list[dict[str, Any]]) -> Any:
        assert self.client is not None
        return self.client.post(
            "/v1/events",
            content=orjson.dumps({"events": batch}),
            headers={"content-type": "application/json"},
        )

    # -- reconciliation and the comparison -----------------------------------------------------

    def _reconcile(self, allow_crash: bool = True) -> None:
        now = self.clock.now
        if allow_crash and self.rng.random() < 0.2:
            self.crash_at = self.commits + self.rng.randint(1, 4)
            try:
                run_pass(self.sessions, self.settings, now=now)
            except _Crash:
                self.stats.reconciler_crashes += 1
            self.crash_at = None
            # A restarted reconciler: a fresh engine and sessions.
            sa_event.remove(self.sessions, "before_commit", self._maybe_crash)
            self.engine.dispose()
            self.engine = make_engine(self.settings)
            self.sessions = make_sessionmaker(self.engine)
            sa_event.listen(self.sessions, "before_commit", self._maybe_crash)
        run_pass(self.sessions, self.settings, now=now)
        self.stats.passes += 1
        self.auditor.after_pass(now)
        self._compare()

    def _compare(self) -> None:
        self.stats.comparisons += 1
        try:
            report = check_invariants(self.check_engine)
        except AssertionError as error:
            raise self.fail(f"invariants: {error}") from None
        self.stats.ledger_entries = report.entries
        self.stats.adjustments = report.adjustments
        auditor = self.auditor
        with self.check_engine.connect() as conn:
            calls = {c.request_id: c for c in conn.execute(select(Call))}
            attempts: dict[str, dict[int, Any]] = defaultdict(dict)
            for a in conn.execute(select(CallAttempt)):
                attempts[a.request_id][a.attempt] = a
        sums = ledger_sums(self.check_engine)
        if set(calls) != set(auditor.by_call):
            raise self.fail(f"calls {sorted(set(calls) ^ set(auditor.by_call))[:5]} differ")
        problems: list[str] = []
        for rid, call in sorted(calls.items()):
            want = auditor.expected(rid)
            settled = rid in auditor.settled
            _diff_call(rid, call, want, settled, attempts.get(rid, {}), sums.get(rid), problems)
        if problems:
            raise self.fail(f"{len(problems)} disagreement(s):\n  " + "\n  ".join(problems[:15]))


def _diff_call(
    rid: str,
    call: Any,
    want: Expected,
    settled: bool,
    attempts: dict[int, Any],
    sums: dict[str, Any] | None,
    problems: list[str],
) -> None:
    def check(what: str, got: Any, expected: Any) -> None:
        if got != expected:
            problems.append(f"{rid}: {what} is {got!r}, expected {expected!r}")

    check("settled", call.settled, settled)
    for name in TOKEN_FIELDS:
        check(name, getattr(call, name), want.tokens[name])
    check("cost_pusd", call.cost_pusd, want.cost_pusd)
    check("attempts", call.attempts, len(want.attempts))
    check("api_key_id", call.api_key_id, want.api_key_id)
    check("model", call.model, want.model)
    check("status", call.status, want.status if settled else "open")
    check("usage_source", call.usage_source, want.usage_source)
    check("error_type", call.error_type, want.error_type)
    check("stop_reason", call.stop_reason, want.stop_reason)
    check("anomalies", set(call.anomalies or ()), want.anomalies)
    # Attempt rows only for a call with several attempts (a call with one is its attempt).
    check(
        "attempt numbers", sorted(attempts), sorted(want.attempts) if len(want.attempts) > 1 else []
    )
    per_attempt = (*TOKEN_FIELDS, "model", "usage_source", "error_type", "stop_reason")
    for n, a in attempts.items():
        exp = want.attempts.get(n)
        if exp is None:
            continue
        for name in (*per_attempt, "status"):
            check(f"attempt {n} {name}", getattr(a, name), exp[name])
    if len(want.attempts) == 1:  # the call's row is its attempt's: the same figures
        (exp,) = want.attempts.values()
        for name in per_attempt:
            check(f"its attempt's {name}", getattr(call, name), exp[name])
        if settled:
            check("its attempt's status", call.status, exp["status"])
    if settled:
        if sums is None:
            problems.append(f"{rid}: settled but no ledger entries")
            return
        for name in TOKEN_FIELDS:
            check(f"ledger {name}", sums[name], want.tokens[name])
        if want.cost_pusd is not None:
            check("ledger cost_pusd", sums["cost_pusd"], want.cost_pusd)
        # The lines that hold tokens: booked under the call's key, each attempt's model, at the
        # price in force at the call's start.
        check("ledger lines", sums["lines"], want.lines)
        check("ledger unpriced", sums["unpriced"], want.cost_pusd is None)
    elif sums is not None:
        problems.append(f"{rid}: open but has ledger entries {sums}")


def run_seed(seed: int, db_url: str, **options: Any) -> Stats:
    """Simulate ``seed`` on the (empty, migrated) database ``db_url``."""
    sim = Simulation(seed, db_url, **options)
    try:
        return sim.run()
    finally:
        sim.close()


def _seeds() -> tuple[int, ...]:
    value = os.environ.get("BILLING_TEST_SEED")
    return (int(value),) if value else SUITE_SEEDS


@pytest.mark.parametrize("seed", _seeds())
def test_simulation_seed(seed: int, db_url: str) -> None:
    stats = run_seed(seed, db_url)
    print(f"\nsimulation: {stats}")
    assert stats.passes > 0 and stats.comparisons > 0


def test_the_auditor_catches_a_wrong_ledger(db_url: str) -> None:
    """The auditor is not blind: a ledger entry booked behind the service's back is reported
    with the seed."""
    sim = Simulation(99, db_url, steps=20, calls=8)
    original: Callable[[], None] = sim._compare
    tampered = False

    def tamper_then_compare() -> None:
        nonlocal tampered
        if not tampered and sim.auditor.settled:
            rid = sorted(sim.auditor.settled)[0]
            with sim.check_engine.begin() as conn:
                conn.execute(
                    update(Call)
                    .where(Call.request_id == rid)
                    .values(output_tokens_billed=Call.__table__.c.output_tokens_billed + 1)
                )
            tampered = True
        original()

    sim._compare = tamper_then_compare  # type: ignore[method-assign]
    try:
        with pytest.raises(SimulationFailure, match="seed 99"):
            sim.run()
    finally:
        sim.close()
    assert tampered


# -- found by the simulation ---------------------------------------------------------------------


def _zero_token_call(client: TestClient, rid: str, *, started: bool, model: str) -> None:
    at = _ts(datetime.now(UTC) - timedelta(minutes=30))
    events: list[dict[str, Any]] = [
        {
            "event_id": f"{rid}-d",
            "request_id": rid,
            "type": "stream.client_disconnected",
            "occurred_at": at,
            "output_tokens_delivered": 0,
        },
    ]
    if started:
        events.append(
            {
                "event_id": f"{rid}-s",
                "request_id": rid,
                "type": "stream.started",
                "occurred_at": at,
                "api_key_id": "key_zero",
                "model": model,
                "protocol": "anthropic.messages",
            }
        )
    reply = client.post("/v1/events", json={"events": events})
    assert reply.status_code == 200, reply.text


def _settle_all(settings: Settings, offset_s: float) -> None:
    engine = make_engine(settings)
    try:
        run_pass(
            make_sessionmaker(engine), settings, now=datetime.now(UTC) + timedelta(seconds=offset_s)
        )
    finally:
        engine.dispose()


def _entries(db_url: str, rid: str) -> list[Any]:
    engine = engine_for(db_url)
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    select(*LedgerEntry.__table__.c)
                    .where(LedgerEntry.request_id == rid)
                    .order_by(LedgerEntry.seq)
                )
            )
    finally:
        engine.dispose()


def test_a_zero_token_call_is_re_booked_when_its_model_gets_a_price(db_url: str) -> None:
    settings = Settings(database_url=db_url)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        _zero_token_call(client, "zt-price", started=True, model="zt-model")
        _settle_all(settings, SETTLE_AFTER + 1)
        reply = client.post(
            "/v1/prices",
            json={
                "model": "zt-model",
                "effective_from": "2020-01-01T00:00:00Z",
                "input_usd_per_mtok": "1",
                "output_usd_per_mtok": "2",
                "cache_read_usd_per_mtok": "0",
                "cache_creation_usd_per_mtok": "0",
            },
        )
        assert reply.status_code == 201
        _settle_all(settings, SETTLE_AFTER + 2)
        call = client.get("/v1/calls/zt-price").json()
    assert call["cost_usd"] == "0" and "unpriced" not in call["anomalies"]
    entries = _entries(db_url, "zt-price")
    # The ledger must say what the call says: booked at the model's price (zero cost), not null.
    assert entries[-1].price_id is not None and entries[-1].cost_pusd == 0, entries


def test_a_zero_token_call_settled_without_its_key_is_re_booked_under_it(db_url: str) -> None:
    settings = Settings(database_url=db_url)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        _zero_token_call(client, "zt-key", started=False, model="zt-model")
        _settle_all(settings, SETTLE_AFTER + 1)
        assert _entries(db_url, "zt-key")[0].api_key_id is None
        at = _ts(datetime.now(UTC) - timedelta(minutes=30))
        reply = client.post(
            "/v1/events",
            json={
                "events": [
                    {
                        "event_id": "zt-key-s",
                        "request_id": "zt-key",
                        "type": "stream.started",
                        "occurred_at": at,
                        "api_key_id": "key_zero",
                        "model": "zt-model",
                        "protocol": "anthropic.messages",
                    }
                ]
            },
        )
        assert reply.status_code == 200
        _settle_all(settings, SETTLE_AFTER + 2)
        call = client.get("/v1/calls/zt-key").json()
    assert call["api_key_id"] == "key_zero"
    settlements = [e for e in _entries(db_url, "zt-key") if e.kind == "settlement"]
    assert settlements[-1].api_key_id == "key_zero", settlements
