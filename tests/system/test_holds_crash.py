"""Holds survive a SIGKILL of ``billing serve`` (CONTRACT "Authorizations and holds (v3)": a hold
is stored, not kept in memory; replaced by its call, released, or gone at ``expires_at``).

Sixteen gateways, each with its own ``billing.client.BillingClient``, run call lifecycles against
one $8 budget through a real ``billing serve``: authorize (the typed ``authorize``, $0.10 each from
a token estimate that bounds the call), then either post the call's events (``stream.started``,
``stream.tokens`` and ``stream.usage``: a completed call; or no usage: a call left open), or give
the hold back (``release``, ``DELETE``), or leave it to expire (a 10 s TTL). The service is
SIGKILLed in the middle of it and restarted on the same database; the gateways ask again with the
same ``request_id`` when they got no answer (an authorization is idempotent; so is a release), and
their clients deliver the events they had queued.

Then, exactly: every stored hold is one a gateway was granted, and is converted (its call was
ingested), released or expired at its TTL, as its gateway left it; ``GET /v1/spend`` and
``GET /v1/budgets/gw`` say the ledger's total + the open calls' figures (each at no less than its
live hold) + the other live holds, as read
from the database and as computed from what the gateways sent, before and after the TTL; and
after the TTL an authorization of exactly the remaining headroom is admitted (no phantom hold),
and one of a micro-dollar more is not."""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from billing.client import BillingClient
from billing.client.authorizations import Authorization, Release
from billing.client.errors import AuthorizationUnavailable
from tests.budgets.helpers import MODEL, PRICE
from tests.client.test_client import ServeProcess
from tests.system.cluster import wait_for

pytestmark = pytest.mark.slow

GATEWAYS = 16
CALLS_PER_GATEWAY = 12
KEY = "key_gw"
LIMIT = Decimal("8")
#: The short TTL of the holds left to expire (the contract's least); the others keep the default.
SHORT_TTL_S = 10
LONG_TTL_S = 600
#: 50,000 input tokens at $1/M and at most 25,000 output tokens at $2/M: a $0.10 hold; a call
#: generates fewer (1,000-24,000), so its figure is always below its hold.
INPUT = 50_000
MAX_OUTPUT = 25_000
ESTIMATE = {"input_tokens": INPUT, "max_output_tokens": MAX_OUTPUT}
HOLD_PUSD = 100_000_000_000
#: Picodollars per token: $1 and $2 per million.
IN_PUSD, OUT_PUSD = 1_000_000, 2_000_000
PICO = Decimal(10) ** 12

Kind = Literal["complete", "open", "release", "expire"]
KINDS: tuple[Kind, ...] = ("complete", "open", "release", "expire")


@dataclass
class Lifecycle:
    """What one gateway did with one call: the kind it meant, the decision it got, the output
    tokens it reported (usage, or generated so far for an open call) and how many times the
    service could not answer it."""

    request_id: str
    kind: Kind
    ttl_s: int
    output: int
    answer: Authorization | None = None
    released: Release | None = None
    unavailable: int = 0

    @property
    def allowed(self) -> bool:
        return self.answer is not None and self.answer.allowed

    @property
    def figure_pusd(self) -> int:
        """The call's cost: its input and its output (the usage's, or generated so far)."""
        return INPUT * IN_PUSD + self.output * OUT_PUSD


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _until_answered(what: str, ask: Any, record: Lifecycle, timeout: float = 90.0) -> Any:
    """``ask()`` until the service answers (no answer while it is dead or restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask()
        except AuthorizationUnavailable:
            record.unavailable += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} of {record.request_id}: no answer") from None
            time.sleep(0.05)


class Load:
    """The gateways' shared progress: authorizations answered so far (the kill waits for a
    third of them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answered = 0
        self.errors: list[BaseException] = []

    def one_more(self) -> None:
        with self.lock:
            self.answered += 1


def _gateway(url: str, gateway: int, seed: int, load: Load) -> list[Lifecycle]:
    rng = random.Random(seed * 100 + gateway)
    done: list[Lifecycle] = []
    with BillingClient(
        url,
        batch_size=20,
        flush_interval_s=0.05,
        spool_path=None,
        max_retries=30,
        backoff_base_s=0.05,
        backoff_max_s=0.5,
        timeout_s=5,
    ) as client:
        for n in range(CALLS_PER_GATEWAY):
            kind = KINDS[(gateway + n) % len(KINDS)]
            record = Lifecycle(
                f"gw{gateway:02d}-{n:03d}",
                kind,
                SHORT_TTL_S if kind == "expire" else LONG_TTL_S,
                rng.randint(1_000, MAX_OUTPUT - 1_000),
            )
            done.append(record)
            record.answer = _until_answered(
                "authorization",
                lambda r=record: client.authorize(
                    request_id=r.request_id,
                    api_key_id=KEY,
                    model=MODEL,
                    estimate=ESTIMATE,
                    ttl_s=r.ttl_s,
                    timeout_s=5,
                ),
                record,
            )
            load.one_more()
            if not record.allowed:
                continue  # denied: the upstream is never called
            rid, now = record.request_id, datetime.now(UTC)
            if kind == "release":  # the gateway gave up before calling the upstream
                record.released = _until_answered(
                    "release", lambda r=rid: client.release(r, timeout_s=5), record
                )
                continue
            if kind == "expire":  # the gateway went away: the hold ends at its TTL
                continue
            client.send(
                {
                    "event_id": f"{rid}-s",
                    "request_id": rid,
                    "type": "stream.started",
                    "occurred_at": _stamp(now),
                    "api_key_id": KEY,
                    "model": MODEL,
                    "protocol": "openai.chat_completions",
                    "input_tokens": INPUT,
                }
            )
            time.sleep(rng.uniform(0, 0.02))  # the upstream streams
            generated = record.output if kind == "open" else record.output // 2
            client.send(
                {
                    "event_id": f"{rid}-t",
                    "request_id": rid,
                    "type": "stream.tokens",
                    "occurred_at": _stamp(now + timedelta(milliseconds=10)),
                    "output_tokens_generated": generated,
                    "output_tokens_delivered": generated,
                }
            )
            if kind == "complete":
                client.send(
                    {
                        "event_id": f"{rid}-u",
                        "request_id": rid,
                        "type": "stream.usage",
                        "occurred_at": _stamp(now + timedelta(milliseconds=20)),
                        "input_tokens": INPUT,
                        "output_tokens": record.output,
                        "source": "upstream",
                    }
                )
        assert client.flush(timeout=90), "the gateway's events were not all delivered"
    return done


def _run_gateways(url: str, seed: int, load: Load) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = [None] * GATEWAYS

    def run(g: int) -> None:
        try:
            results[g] = _gateway(url, g, seed, load)
        except BaseException as error:  # reported by the test
            with load.lock:
                load.errors.append(error)

    threads = [
        threading.Thread(target=run, args=(g,), name=f"gateway-{g}") for g in range(GATEWAYS)
    ]
    for thread in threads:
        thread.start()
    return threads, results


_wait = functools.partial(wait_for, timeout=90.0)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    found = create_engine(db_url, poolclass=NullPool)
    yield found
    found.dispose()


def _scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.scalar(text(sql), params)


def _usd(pusd: int) -> Decimal:
    return Decimal(pusd) / PICO


@dataclass(frozen=True)
class StoredHold:
    request_id: str
    hold_pusd: int
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None
    has_call: bool
    #: its call's figure so far while the call is open (None: no call, or settled)
    open_cost_pusd: int | None

    def state(self, now: datetime) -> str:
        if self.has_call:
            return "converted"
        if self.released_at is not None:
            return "released"
        return "expired" if self.expires_at <= now else "live"


def _aware(value: Any) -> datetime:
    """A timestamp read with plain SQL: SQLite gives text, PostgreSQL an aware datetime."""
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _stored_holds(engine: Engine) -> dict[str, StoredHold]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT h.request_id, h.hold_pusd, h.created_at, h.expires_at, h.released_at, "
                "c.request_id IS NOT NULL, "
                "CASE WHEN NOT c.settled THEN coalesce(c.cost_pusd, 0) END FROM budget_holds h "
                "LEFT JOIN calls c ON c.request_id = h.request_id"
            )
        ).all()
    return {
        rid: StoredHold(
            rid,
            int(held),
            _aware(created),
            _aware(expires),
            None if released is None else _aware(released),
            bool(call),
            None if open_cost is None else int(open_cost),
        )
        for rid, held, created, expires, released, call, open_cost in rows
    }


def _check_figures(budget: dict[str, Any], engine: Engine, lifecycles: list[Lifecycle]) -> Decimal:
    """A status of the budget against the database and against what the gateways sent, as of
    its ``as_of``; its spent figure."""
    as_of = datetime.fromisoformat(budget["as_of"])
    # From the database: the ledger, the calls still open, the holds live at as_of.
    ledger = int(
        _scalar(
            engine,
            "SELECT coalesce(sum(cost_pusd), 0) FROM ledger_entries WHERE api_key_id = :key",
            key=KEY,
        )
    )
    open_calls = int(
        _scalar(
            engine,
            "SELECT coalesce(sum(cost_pusd), 0) FROM calls WHERE api_key_id = :key AND NOT settled",
            key=KEY,
        )
    )
    stored = _stored_holds(engine).values()
    live = sum(h.hold_pusd for h in stored if h.state(as_of) == "live")
    # An open call counts at no less than its live hold: the rest of the hold is still held.
    beyond = sum(
        max(0, h.hold_pusd - h.open_cost_pusd)
        for h in stored
        if h.open_cost_pusd is not None and h.expires_at > as_of
    )
    spent = ledger + open_calls + live + beyond
    figures = (
        Decimal(budget["settled_usd"]),
        Decimal(budget["provisional_usd"]),
        Decimal(budget["held_usd"]),
        Decimal(budget["spent_usd"]),
        Decimal(budget["remaining_usd"]),
    )
    assert figures == (
        _usd(ledger),
        _usd(open_calls),
        _usd(live + beyond),
        _usd(spent),
        LIMIT - _usd(spent),
    )
    # From what the gateways sent: every completed call settled at its usage, every open call
    # at its input and the output generated so far, the holds left to expire until their TTL.
    allowed = [lc for lc in lifecycles if lc.allowed]
    assert ledger == sum(lc.figure_pusd for lc in allowed if lc.kind == "complete")
    assert open_calls == sum(lc.figure_pusd for lc in allowed if lc.kind == "open")
    expiring = [lc for lc in allowed if lc.kind == "expire"]
    assert live == HOLD_PUSD * sum(
        1 for lc in expiring if lc.answer is not None and lc.answer.expires_at > as_of
    )
    assert Decimal(budget["limit_usd"]) == LIMIT
    return figures[3]


def _check_spend(http: httpx.Client, engine: Engine, lifecycles: list[Lifecycle]) -> Decimal:
    """``GET /v1/spend`` (the gateways' check) and ``GET /v1/budgets/gw`` (the budget's own
    status), each checked by ``_check_figures``; the spent figure of the second."""
    spend = http.get("/v1/spend", params={"api_key_id": KEY})
    assert spend.status_code == 200, spend.text
    [budget] = spend.json()["budgets"]
    _check_figures(budget, engine, lifecycles)
    status = http.get("/v1/budgets/gw")
    assert status.status_code == 200, status.text
    return _check_figures(status.json(), engine, lifecycles)


def test_holds_settle_release_or_expire_exactly_across_a_sigkill_of_serve(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = int(os.environ.get("BILLING_TEST_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nholds across a SIGKILL: seed {seed}; replay with BILLING_TEST_SEED={seed}")
    monkeypatch.setenv("BILLING_RECONCILE_INTERVAL_S", "0.2")
    with ServeProcess(db_url, tmp_path) as server:
        server.start()
        with httpx.Client(base_url=server.url, timeout=10) as admin:
            assert admin.post("/v1/prices", json=PRICE).status_code in (200, 201)
            made = admin.post(
                "/v1/budgets",
                json={
                    "budget_id": "gw",
                    "scope": {"api_key_id": KEY},
                    "limit_usd": str(LIMIT),
                    "period": "total",
                    "measure": "cost",
                },
            )
            assert made.status_code == 201, made.text
        load = Load()
        threads, results = _run_gateways(server.url, seed, load)
        total = GATEWAYS * CALLS_PER_GATEWAY
        _wait("a third of the authorizations", lambda: load.answered >= total // 3 or load.errors)
        server.kill(signal.SIGKILL)
        killed_at = load.answered
        server.start(wait=False)
        server.wait_ready(timeout=60)
        for thread in threads:
            thread.join(timeout=180)
            assert not thread.is_alive(), f"{thread.name} did not finish"
        assert not load.errors, load.errors
        lifecycles: list[Lifecycle] = [lc for found in results for lc in found]
        assert len(lifecycles) == total
        assert killed_at < total, "the kill came after the load"
        allowed = [lc for lc in lifecycles if lc.allowed]
        denied = [lc for lc in lifecycles if not lc.allowed]
        assert allowed
        assert all(lc.answer is not None for lc in lifecycles)
        # Only headroom taken by holds and calls in flight denies: the budget is never spent.
        assert {lc.answer.reason for lc in denied if lc.answer is not None} <= {
            "insufficient_headroom"
        }
        calls = {lc.request_id for lc in allowed if lc.kind in ("complete", "open")}
        completed = sum(1 for lc in allowed if lc.kind == "complete")

        # Every call ingested and read by a reconciliation step; each completed one settled.
        def caught_up() -> bool:
            with engine.connect() as conn:
                stored = {r for (r,) in conn.execute(text("SELECT request_id FROM calls"))}
                unstepped = conn.scalar(text("SELECT count(*) FROM calls WHERE attempts = 0"))
                settled = conn.scalar(text("SELECT count(*) FROM calls WHERE settled"))
            return stored == calls and unstepped == 0 and settled == completed

        _wait("the reconciler", caught_up)
        # Every hold stored is one granted, with its TTL, and none granted is missing.
        holds = _stored_holds(engine)
        assert sorted(holds) == sorted(lc.request_id for lc in allowed)
        for lc in allowed:
            assert lc.answer is not None and lc.answer.expires_at is not None
            stored = holds[lc.request_id]
            assert stored.hold_pusd == HOLD_PUSD
            assert stored.expires_at == lc.answer.expires_at
            assert stored.expires_at - stored.created_at == timedelta(seconds=lc.ttl_s)
        # Released holds were released (once: a repeated DELETE answered the same).
        for lc in allowed:
            if lc.kind == "release":
                assert lc.released is not None and lc.released.state == "released"
                assert holds[lc.request_id].released_at is not None
            else:
                assert holds[lc.request_id].released_at is None

        with httpx.Client(base_url=server.url, timeout=10) as http:
            # Before the short TTL has passed for all: spend = ledger + open calls + live holds.
            _check_spend(http, engine, lifecycles)
            last_expiry = max(
                (lc.answer.expires_at for lc in allowed if lc.answer and lc.kind == "expire"),
                default=datetime.now(UTC),
            )
            time.sleep(max(0.0, (last_expiry - datetime.now(UTC)).total_seconds()) + 0.2)
            # After it: every hold converted, released or expired, as its gateway left it.
            now = datetime.now(UTC)
            states = {rid: h.state(now) for rid, h in _stored_holds(engine).items()}
            expected = {
                "complete": "converted",
                "open": "converted",
                "release": "released",
                "expire": "expired",
            }
            assert states == {lc.request_id: expected[lc.kind] for lc in allowed}
            # ... and so says the service (a DELETE after the end changes nothing).
            with BillingClient(server.url, spool_path=None) as client:
                for lc in allowed:
                    assert client.release(lc.request_id).state == expected[lc.kind]
            spent = _check_spend(http, engine, lifecycles)
            remaining = LIMIT - spent
            assert remaining > 0
            [before] = http.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
            # No phantom hold: exactly the remaining headroom is admitted, a micro-dollar more
            # is not; retryable only while open calls still hold more than their figures (that
            # part may come back when they settle below their holds), never for expired holds.
            over = http.post(
                "/v1/authorizations",
                json={
                    "request_id": "after-ttl-over",
                    "api_key_id": KEY,
                    "model": MODEL,
                    "estimate": {"amount_usd": str(remaining + Decimal("0.000001"))},
                },
            ).json()
            assert (over["decision"], over["reason"], over["retryable"]) == (
                "deny",
                "insufficient_headroom",
                Decimal(before["held_usd"]) > 0,
            )
            fits = http.post(
                "/v1/authorizations",
                json={
                    "request_id": "after-ttl-fits",
                    "api_key_id": KEY,
                    "model": MODEL,
                    "estimate": {"amount_usd": str(remaining)},
                },
            ).json()
            assert (fits["decision"], fits["reason"], Decimal(fits["hold_usd"])) == (
                "allow",
                None,
                remaining,
            )
            [after] = http.get("/v1/spend", params={"api_key_id": KEY}).json()["budgets"]
            held_before = Decimal(before["held_usd"])  # the open calls' holds beyond them
            assert (Decimal(after["held_usd"]), Decimal(after["spent_usd"])) == (
                held_before + remaining,
                LIMIT,
            )
    unavailable = sum(lc.unavailable for lc in lifecycles)
    print(
        f"allowed {len(allowed)}, denied {len(denied)}, unanswered tries {unavailable}, "
        f"killed after {killed_at} answers"
    )
