"""Properties of the billing rule and the ledger plan over generated calls (hypothesis).

Source: CONTRACT "Reconciliation": order and duplicates never change the figures; per attempt the
billed output is never negative and undelivered = max(0, billed − delivered); after any sequence of
late events, a settled call's figures equal the sum of its ledger entries, tokens and cost.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.dimensions import TOKEN_FIELDS
from billing.ingest.schemas import StreamUsage
from billing.pricing.prices import PriceBook
from billing.reconcile.rule import reconcile_call
from billing.reconcile.runner import run_pass
from billing.reconcile.service import call_cost, target_lines
from tests.builders import disconnect, failed, parse, started, tokens, usage
from tests.reconcile.test_rule import PureLedger, price

pytestmark = pytest.mark.slow

P1 = price(1, "m1", 3_000_000, 15_000_000, 300_000, 3_750_000)
P2 = price(2, "m2", 1_250_000, 10_000_000, 125_000, 0)
P3 = price(3, "m3", 300_000, 1_200_000, 30_000, 375_000)  # posted late, or never
PRICE_JSON = {
    "m1": ("3", "15", "0.30", "3.75"),
    "m2": ("1.25", "10", "0.125", "0"),
    "m3": ("0.30", "1.2", "0.03", "0.375"),
}
BOOK = PriceBook([P1, P2])
BOOK_LATE = PriceBook([P1, P2, P3])

counts = st.integers(0, 600)


@st.composite
def calls(draw: st.DrawFn, request_id: str = "r1", prefix: str = "e") -> list[dict[str, Any]]:
    """One call's events: 1–3 attempts with random starts, counters, disconnects, usages and
    failures, at coarse random times (so that ties on ``occurred_at`` are common)."""
    ids = itertools.count()

    def eid() -> str:
        return f"{prefix}{next(ids):02d}"

    events: list[dict[str, Any]] = []
    for attempt in range(1, draw(st.integers(1, 3)) + 1):
        base = (attempt - 1) * 20
        before = len(events)

        def at(base: int = base) -> int:
            return base + draw(st.integers(0, 12))

        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2]))):
            events.append(
                started(
                    eid(),
                    request_id,
                    at(),
                    attempt,
                    key=draw(st.sampled_from(["key_a", "key_b"])),
                    model=draw(st.sampled_from(["m1", "m2", "m3"])),
                    input_tokens=draw(st.none() | counts),
                )
            )
        for _ in range(draw(st.integers(0, 3))):
            events.append(tokens(eid(), draw(counts), draw(counts), request_id, at(), attempt))
        if draw(st.booleans()):
            events.append(
                disconnect(eid(), draw(counts), draw(st.none() | counts), request_id, at(), attempt)
            )
        for _ in range(draw(st.integers(0, 3))):
            events.append(
                usage(
                    eid(),
                    draw(counts),
                    draw(counts),
                    draw(st.sampled_from(["upstream", "estimate"])),
                    request_id,
                    at(),
                    attempt,
                    cache_read_input_tokens=draw(counts),
                    cache_creation_input_tokens=draw(counts),
                    reasoning_tokens=draw(st.integers(0, 50)),
                )
            )
        if draw(st.integers(0, 3)) == 0:
            events.append(
                failed(
                    eid(),
                    draw(st.sampled_from(["api_error", "stalled"])),
                    request_id,
                    at(),
                    attempt,
                    draw(st.none() | counts),
                )
            )
        if len(events) == before:  # an attempt exists through its events: give it one
            events.append(tokens(eid(), draw(counts), draw(counts), request_id, at(), attempt))
    return events


@st.composite
def arrivals(
    draw: st.DrawFn, request_id: str = "r1", prefix: str = "e"
) -> tuple[list[list[dict[str, Any]]], int | None]:
    """A call's events split into an initial set (settled) and later arrivals, some repeated, and
    the arrival (index) after which m3's price is posted (None: never)."""
    events = draw(calls(request_id, prefix))
    order = draw(st.permutations(events))
    cuts = sorted(draw(st.lists(st.integers(1, len(order)), max_size=4)))
    chunks = [order[a:b] for a, b in itertools.pairwise([0, *cuts, len(order)]) if b > a]
    for chunk in chunks[1:]:
        chunk.extend(draw(st.lists(st.sampled_from(order), max_size=2)))  # a retried post
    price_at = draw(st.none() | st.integers(0, len(chunks)))
    return chunks, price_at


def _usage_key(u: dict[str, Any]) -> tuple[str, int, str]:
    return (u["occurred_at"], u["output_tokens"], u["event_id"])


def expected_attempt(events: list[dict[str, Any]]) -> dict[str, int]:
    """The contract's per-attempt rule, written out again independently of billing.reconcile."""
    delivered = max([e.get("output_tokens_delivered", 0) for e in events], default=0)
    generated = max(
        [e.get("output_tokens_generated") or 0 for e in events if e["type"] != "stream.started"],
        default=0,
    )
    usages = {
        s: [e for e in events if e["type"] == "stream.usage" and e["source"] == s]
        for s in ("upstream", "estimate")
    }
    upstream = max(usages["upstream"], key=_usage_key, default=None)
    estimate = max(usages["estimate"], key=_usage_key, default=None)
    if upstream is not None:
        billed = upstream["output_tokens"]
    else:
        billed = max(estimate["output_tokens"] if estimate else 0, generated, delivered)
    chosen = upstream or estimate
    # v2: without a disconnect and any delivered count, the attempt delivered what it billed.
    if not any(e["type"] in ("stream.tokens", "stream.client_disconnected") for e in events):
        delivered = billed
    starts = sorted(
        (e for e in events if e["type"] == "stream.started"),
        key=lambda e: (e["occurred_at"], e["event_id"]),
    )
    started_input = starts[0].get("input_tokens") if starts else None
    if chosen is not None and chosen.get("input_tokens") is not None:
        input_tokens = chosen["input_tokens"]
        if input_tokens == 0:  # v3: lowered to 0 after a count of the same source: the largest
            same = usages[chosen["source"]]
            input_tokens = max(u.get("input_tokens") or 0 for u in same)
        if input_tokens == 0 and chosen["source"] == "estimate" and started_input is not None:
            input_tokens = started_input  # v3: an estimate's 0 is "not known"
    else:
        input_tokens = started_input or 0
    return {
        "input_tokens": input_tokens,
        "output_tokens_billed": billed,
        "output_tokens_delivered": delivered,
        "output_tokens_undelivered": max(0, billed - delivered),
    }


# -- pure properties --------------------------------------------------------------------------


@pytest.mark.nodb
@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_order_and_duplicates_change_nothing(data: st.DataObject) -> None:
    events = data.draw(calls())
    figures = reconcile_call("r1", parse(events))
    shuffled = data.draw(st.permutations(events))
    repeated = data.draw(st.lists(st.sampled_from(events), max_size=len(events)))
    again = reconcile_call("r1", parse(shuffled + repeated))
    assert again == figures
    assert PureLedger().book(again, BOOK) == PureLedger().book(figures, BOOK)


@pytest.mark.nodb
@given(events=calls())
@settings(max_examples=300, deadline=None)
def test_per_attempt_figures(events: list[dict[str, Any]]) -> None:
    figures = reconcile_call("r1", parse(events))
    assert [a.attempt for a in figures.attempts] == sorted({e["attempt"] for e in events})
    total = dict.fromkeys(TOKEN_FIELDS, 0)
    for attempt in figures.attempts:
        t = attempt.tokens
        assert t.output_tokens_billed >= 0
        assert t.output_tokens_undelivered == max(
            0, t.output_tokens_billed - t.output_tokens_delivered
        )
        own = [e for e in events if e["attempt"] == attempt.attempt]
        expected = expected_attempt(own)
        assert {k: getattr(t, k) for k in expected} == expected
        has_upstream = any(e["type"] == "stream.usage" and e["source"] == "upstream" for e in own)
        assert attempt.usage_source == ("upstream" if has_upstream else "estimate")
        if not has_upstream:
            assert t.output_tokens_billed >= t.output_tokens_delivered
        for name, value in t.as_dict().items():
            total[name] += value
    assert figures.tokens.as_dict() == total
    assert figures.usage_source == (
        "upstream" if all(a.usage_source == "upstream" for a in figures.attempts) else "estimate"
    )
    assert figures.complete == (
        figures.usage_source == "upstream" and any(e["type"] == "stream.started" for e in events)
    )


def _check_ledger(ledger: PureLedger, events: list[dict[str, Any]], book: PriceBook) -> None:
    figures = reconcile_call("r1", parse(events))
    lines = target_lines(figures, book)
    assert ledger.tokens() == figures.tokens
    booked, _, _ = ledger.booked()
    assert {k: v for k, v in booked.items() if not v.is_zero()} == {
        line.key: line.tokens for line in lines if not line.tokens.is_zero()
    }
    # Every entry's cost is its own tokens at its own prices; its reason fits the ledger.
    for entry in ledger.entries:
        assert 0 < len(entry.reason) <= 200
        own = None if entry.price is None else entry.price.cost_pusd(entry.tokens)
        assert entry.cost_pusd == own
    priced = sum(line.price.cost_pusd(line.tokens) for line in lines if line.price is not None)
    assert ledger.cost() == priced
    cost = call_cost(lines)
    if cost is not None:
        assert ledger.cost() == cost


@pytest.mark.nodb
@given(plan=arrivals())
@settings(max_examples=400, deadline=None)
def test_late_events_ledger_sums_equal_the_figures(
    plan: tuple[list[list[dict[str, Any]]], int | None],
) -> None:
    chunks, price_at = plan
    ledger = PureLedger()
    seen: list[dict[str, Any]] = []
    for step, chunk in enumerate(chunks):
        seen.extend(chunk)
        book = BOOK_LATE if price_at is not None and step >= price_at else BOOK
        before = len(ledger.entries)
        planned = ledger.book(reconcile_call("r1", parse(seen)), book)
        if step == 0:
            assert planned and {e.kind for e in planned} == {"settlement"}
        elif planned:
            assert before > 0
            # A new settlement only ever follows a reversal of an old line.
            if any(e.kind == "settlement" for e in planned):
                assert any(e.reason.startswith("reversal") for e in planned)
        _check_ledger(ledger, seen, book)
        # Booking again with nothing new books nothing.
        assert ledger.book(reconcile_call("r1", parse(seen)), book) == []
    if price_at == len(chunks):  # the price arrives after the last event
        ledger.book(reconcile_call("r1", parse(seen)), BOOK_LATE)
        _check_ledger(ledger, seen, BOOK_LATE)


@pytest.mark.nodb
@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_same_usage_under_new_ids_never_bills_twice(data: st.DataObject) -> None:
    events = data.draw(calls())
    usages = [e for e in events if e["type"] == "stream.usage"]
    if not usages:
        return
    copies = [dict(u, event_id=u["event_id"] + "-again") for u in usages]
    with_copies = reconcile_call("r1", parse(events + copies))
    assert with_copies.tokens == reconcile_call("r1", parse(events)).tokens
    assert all(isinstance(e, StreamUsage) for e in parse(copies))


# -- the same property through HTTP and the database ------------------------------------------

_example = itertools.count()
TOKEN_NAMES = list(TOKEN_FIELDS)


def _post_prices(client: TestClient, models: dict[str, str]) -> None:
    """Post the prices of ``{generated model: model name in the database}``."""
    for model, name in models.items():
        i, o, cr, cc = PRICE_JSON[model]
        response = client.post(
            "/v1/prices",
            json={
                "model": name,
                "effective_from": "2026-01-01T00:00:00Z",
                "input_usd_per_mtok": i,
                "output_usd_per_mtok": o,
                "cache_read_usd_per_mtok": cr,
                "cache_creation_usd_per_mtok": cc,
            },
        )
        assert response.status_code in (200, 201), response.text


@given(data=st.data())
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_late_events_through_http_and_the_database(client: TestClient, data: st.DataObject) -> None:
    n = next(_example)
    rid = f"prop-{n}"
    chunks, price_at = data.draw(arrivals(rid, f"p{n}-"))
    sessions = client.app.state.billing.sessions  # type: ignore[attr-defined]
    app_settings = client.app.state.billing.settings  # type: ignore[attr-defined]
    # The database outlives the examples: m3, unpriced until posted, gets a name of its own.
    m3 = f"m3-{n}"

    def own(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(e, model=m3) if e.get("model") == "m3" else e for e in events]

    _post_prices(client, {"m1": "m1", "m2": "m2"})
    seen: list[dict[str, Any]] = []
    priced_m3 = False
    for step, chunk in enumerate([*chunks, []]):
        if chunk:
            response = client.post("/v1/events", json={"events": own(chunk)})
            assert response.status_code == 200, response.text
        seen.extend(chunk)
        if price_at is not None and step >= price_at and not priced_m3:
            _post_prices(client, {"m3": m3})
            priced_m3 = True
        # A clock past settle_after, so that the first pass settles the call whatever it holds.
        later = datetime.now(UTC) + timedelta(seconds=app_settings.settle_after_s + 1)
        run_pass(sessions, app_settings, now=later)
        call = client.get(f"/v1/calls/{rid}").json()
        assert call["settled"] is True
        entries = call["ledger_entries"]
        for name in TOKEN_NAMES:
            assert sum(e[name] for e in entries) == call[name], name
        book = BOOK_LATE if priced_m3 else BOOK
        figures = reconcile_call(rid, parse(seen))
        assert {name: call[name] for name in TOKEN_NAMES} == figures.tokens.as_dict()
        # The price ids differ in the database, the rates do not: the cost needs only the rates.
        expected = call_cost(target_lines(figures, book))
        priced = sum(Decimal(e["cost_usd"]) for e in entries if e["cost_usd"] is not None)
        if expected is None:
            assert call["cost_usd"] is None
            assert "unpriced" in call["anomalies"]
        else:
            assert call["cost_usd"] is not None
            assert Decimal(call["cost_usd"]) == priced == Decimal(expected).scaleb(-12)
        assert [e["kind"] for e in entries].count("settlement") >= 1
        assert entries[0]["kind"] == "settlement"
