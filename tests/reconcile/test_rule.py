"""The pure billing rule (billing.reconcile.rule) and the ledger plan, without a database.

Source: CONTRACT "Reconciliation" and "Cost". Also the cases from public reports of gateways that
billed streaming calls wrongly, with the figures the contract asks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from billing.anomalies import (
    DELIVERED_EXCEEDS_BILLED,
    INPUT_UNKNOWN,
    STARTED_MISSING,
    USAGE_MISSING,
)
from billing.dimensions import TOKEN_FIELDS, Tokens
from billing.money import pusd_to_str
from billing.pricing.prices import PriceBook, PriceRow
from billing.reconcile.ledger import REVERSAL_PREFIX, LineKey, NewEntry, plan_entries
from billing.reconcile.rule import CallFigures, reconcile_call
from billing.reconcile.service import call_cost, target_lines
from tests.builders import T0, disconnect, failed, parse, started, tokens, usage

pytestmark = pytest.mark.nodb


# -- helpers (also used by the other reconciliation test modules) -----------------------------


def rule(events: Iterable[Mapping[str, Any]], request_id: str = "r1") -> CallFigures:
    return reconcile_call(request_id, parse(events))


def price(
    pid: int,
    model: str,
    input_: int,
    output: int,
    cache_read: int = 0,
    cache_creation: int = 0,
    effective_from: datetime | None = None,
) -> PriceRow:
    """A price row; rates in micro-USD per million tokens (= picodollars per token)."""
    return PriceRow(
        pid,
        model,
        effective_from or datetime(2026, 1, 1, tzinfo=UTC),
        input_,
        output,
        cache_read,
        cache_creation,
        cache_creation,  # one-hour cache writes: at the cache creation rate
    )


@dataclass
class PureLedger:
    """The reconciler's booking loop without a database: sums entries per line, plans, appends."""

    entries: list[NewEntry] = field(default_factory=list)

    def booked(
        self,
    ) -> tuple[dict[LineKey, Tokens], dict[LineKey, PriceRow | None], set[LineKey]]:
        """Sums per line, each line's price, and the lines whose latest entry reversed them."""
        sums: dict[LineKey, Tokens] = {}
        prices: dict[LineKey, PriceRow | None] = {}
        closed: set[LineKey] = set()
        for entry in self.entries:
            sums[entry.key] = sums.get(entry.key, Tokens()) + entry.tokens
            prices[entry.key] = entry.price
            if entry.reason.startswith(REVERSAL_PREFIX):
                closed.add(entry.key)
            else:
                closed.discard(entry.key)
        return sums, prices, closed

    def book(self, fig: CallFigures, book: PriceBook, reason: str = "settled") -> list[NewEntry]:
        sums, prices, closed = self.booked()
        planned = plan_entries(
            target_lines(fig, book), sums, prices, bool(self.entries), reason, closed
        )
        self.entries.extend(planned)
        return planned

    def tokens(self) -> Tokens:
        total = Tokens()
        for entry in self.entries:
            total = total + entry.tokens
        return total

    def cost(self) -> int:
        """The sum of the priced entries' costs (an unpriced entry has cost None)."""
        return sum(e.cost_pusd for e in self.entries if e.cost_pusd is not None)


def attempt_tokens(fig: CallFigures, n: int) -> dict[str, int]:
    return next(a for a in fig.attempts if a.attempt == n).tokens.as_dict()


# -- per attempt: output billed, delivered, undelivered ---------------------------------------


def test_upstream_usage_is_authoritative_above_counters() -> None:
    fig = rule(
        [
            started("e1", input_tokens=10),
            tokens("e2", 100, 90, at=1),
            disconnect("e3", 90, 100, at=2),
            usage("e4", 12, 300, at=5),
        ]
    )
    assert fig.tokens.output_tokens_billed == 300
    assert fig.tokens.output_tokens_delivered == 90
    assert fig.tokens.output_tokens_undelivered == 210
    assert fig.tokens.input_tokens == 12
    assert fig.usage_source == "upstream"
    assert DELIVERED_EXCEEDS_BILLED not in fig.anomalies
    assert fig.complete


def test_upstream_usage_below_delivered_is_billed_with_an_anomaly() -> None:
    fig = rule(
        [
            started("e1"),
            tokens("e2", 130, 130, at=1),
            usage("e3", 5, 100, at=2),
        ]
    )
    assert fig.tokens.output_tokens_billed == 100
    assert fig.tokens.output_tokens_delivered == 130
    assert fig.tokens.output_tokens_undelivered == 0
    assert fig.anomalies == (DELIVERED_EXCEEDS_BILLED,)


@pytest.mark.parametrize(
    ("estimate_out", "gen", "dlv", "billed"),
    [
        (500, 200, 100, 500),  # the estimate is largest
        (150, 400, 100, 400),  # the generated count is largest
        (50, 60, 80, 80),  # delivered is largest (a gateway that under-reports generated)
        (None, 70, 30, 70),  # no estimate at all
    ],
)
def test_without_upstream_billed_is_the_largest_of_estimate_generated_delivered(
    estimate_out: int | None, gen: int, dlv: int, billed: int
) -> None:
    events = [started("e1", input_tokens=7), tokens("e2", gen, dlv, at=1)]
    if estimate_out is not None:
        events.append(usage("e3", 9, estimate_out, source="estimate", at=2))
    fig = rule(events)
    assert fig.tokens.output_tokens_billed == billed
    assert fig.tokens.output_tokens_delivered == dlv
    assert fig.tokens.output_tokens_undelivered == billed - dlv
    assert fig.usage_source == "estimate"
    assert fig.anomalies == (USAGE_MISSING,)
    assert not fig.complete
    # Input from the estimate when there is one, else from stream.started.
    assert fig.tokens.input_tokens == (9 if estimate_out is not None else 7)


def test_generated_counts_from_disconnect_and_failure_are_billed() -> None:
    fig = rule([started("e1", input_tokens=1), disconnect("e2", 40, 90, at=1)])
    assert (fig.tokens.output_tokens_billed, fig.tokens.output_tokens_undelivered) == (90, 50)
    fig = rule(
        [
            started("e1", input_tokens=1),
            tokens("e2", 10, 10, at=1),
            failed("e3", "stalled", at=2, gen=65),
        ]
    )
    assert (fig.tokens.output_tokens_billed, fig.tokens.output_tokens_undelivered) == (65, 55)


def test_counters_keep_the_largest_value_even_when_a_smaller_one_comes_later() -> None:
    fig = rule(
        [
            started("e1", input_tokens=3),
            tokens("e2", 300, 250, at=1),
            tokens("e3", 120, 100, at=5),  # later, smaller: a reordered or stale progress report
            disconnect("e4", 200, 210, at=6),
        ]
    )
    assert fig.tokens.output_tokens_billed == 300
    assert fig.tokens.output_tokens_delivered == 250
    assert fig.tokens.output_tokens_undelivered == 50


# -- per attempt: input and cache -------------------------------------------------------------


def test_input_and_cache_from_upstream_usage_over_estimate_and_started() -> None:
    fig = rule(
        [
            started("e1", input_tokens=1000),
            usage(
                "e2",
                11,
                20,
                source="estimate",
                at=1,
                cache_read_input_tokens=5,
                cache_creation_input_tokens=6,
                reasoning_tokens=7,
            ),
            usage(
                "e3",
                21,
                30,
                source="upstream",
                at=0.5,
                cache_read_input_tokens=15,
                cache_creation_input_tokens=16,
                reasoning_tokens=17,
            ),
        ]
    )
    t = fig.tokens
    assert (t.input_tokens, t.cache_read_input_tokens, t.cache_creation_input_tokens) == (
        21,
        15,
        16,
    )
    assert (t.output_tokens_billed, t.reasoning_tokens) == (30, 17)
    assert fig.usage_source == "upstream"
    assert fig.anomalies == ()


def test_input_and_cache_from_estimate_over_started() -> None:
    fig = rule(
        [
            started("e1", input_tokens=1000),
            usage(
                "e2",
                11,
                20,
                source="estimate",
                at=1,
                cache_read_input_tokens=5,
                cache_creation_input_tokens=6,
            ),
        ]
    )
    t = fig.tokens
    assert (t.input_tokens, t.cache_read_input_tokens, t.cache_creation_input_tokens) == (11, 5, 6)


def test_input_from_started_then_zero_with_input_unknown() -> None:
    fig = rule([started("e1", input_tokens=44), tokens("e2", 3, 3, at=1)])
    assert fig.tokens.input_tokens == 44
    assert INPUT_UNKNOWN not in fig.anomalies
    fig = rule([started("e1"), tokens("e2", 3, 3, at=1)])
    assert fig.tokens.input_tokens == 0
    assert fig.tokens.cache_read_input_tokens == 0
    assert fig.anomalies == (INPUT_UNKNOWN, USAGE_MISSING)
    # An explicit 0 from the gateway is a known input, not an unknown one.
    fig = rule([started("e1", input_tokens=0), tokens("e2", 3, 3, at=1)])
    assert INPUT_UNKNOWN not in fig.anomalies


# -- several usages of one source -------------------------------------------------------------


def test_latest_usage_wins_not_the_largest() -> None:
    fig = rule(
        [
            started("e1"),
            usage("e2", 10, 500, at=1),
            usage("e3", 12, 480, at=3),  # the provider's final, corrected count
            usage("e4", 11, 490, at=2),
        ]
    )
    assert (fig.tokens.input_tokens, fig.tokens.output_tokens_billed) == (12, 480)


def test_usage_tie_on_occurred_at_goes_to_larger_output_then_larger_event_id() -> None:
    fig = rule([started("e1"), usage("u-b", 10, 480, at=3), usage("u-a", 11, 490, at=3)])
    assert (fig.tokens.input_tokens, fig.tokens.output_tokens_billed) == (11, 490)
    fig = rule([started("e1"), usage("u-a", 10, 490, at=3), usage("u-b", 11, 490, at=3)])
    assert fig.tokens.input_tokens == 11
    fig = rule([started("e1"), usage("u-b", 10, 490, at=3), usage("u-a", 11, 490, at=3)])
    assert fig.tokens.input_tokens == 10


def test_estimate_usages_follow_the_same_order() -> None:
    fig = rule(
        [
            started("e1"),
            usage("e2", 10, 900, source="estimate", at=1),
            usage("e3", 20, 100, source="estimate", at=4),
            tokens("e4", 50, 50, at=2),
        ]
    )
    assert fig.tokens.input_tokens == 20
    assert fig.tokens.output_tokens_billed == 100


def test_the_same_usage_under_two_event_ids_bills_once() -> None:
    # Public report 2: a final usage posted twice (a retried post with a new event id).
    events = [
        started("e1", input_tokens=40),
        usage("u1", 40, 300, at=2, stop_reason="end_turn"),
        usage("u2", 40, 300, at=2, stop_reason="end_turn"),
    ]
    fig = rule(events)
    assert fig.tokens.input_tokens == 40
    assert fig.tokens.output_tokens_billed == 300
    assert fig.attempts[0].tokens.output_tokens_billed == 300


def test_an_event_id_seen_twice_counts_once_and_order_does_not_matter() -> None:
    events = [started("e1", input_tokens=3), tokens("e2", 10, 8, at=1), usage("e3", 3, 12, at=2)]
    fig = rule(events)
    assert rule(events[::-1] + events) == fig
    assert fig.tokens.output_tokens_billed == 12


def test_no_events_is_an_error() -> None:
    with pytest.raises(ValueError, match="no events"):
        reconcile_call("r1", [])


# -- attempts ---------------------------------------------------------------------------------


def test_attempts_are_summed_stalled_estimate_then_upstream() -> None:
    fig = rule(
        [
            started("a1", input_tokens=100, attempt=1),
            tokens("a2", 40, 30, at=5, attempt=1),
            usage("a3", 100, 45, source="estimate", at=6, attempt=1),
            failed("a4", "stalled", at=30, attempt=1),
            started("b1", input_tokens=100, at=31, attempt=2),
            tokens("b2", 200, 200, at=40, attempt=2),
            usage("b3", 98, 210, source="upstream", at=41, attempt=2, stop_reason="end_turn"),
        ]
    )
    assert fig.attempts and len(fig.attempts) == 2
    assert attempt_tokens(fig, 1) == {
        "input_tokens": 100,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation_1h_input_tokens": 0,
        "output_tokens_billed": 45,
        "output_tokens_delivered": 30,
        "output_tokens_undelivered": 15,
        "reasoning_tokens": 0,
    }
    assert attempt_tokens(fig, 2)["output_tokens_billed"] == 210
    assert fig.tokens.input_tokens == 198
    assert fig.tokens.output_tokens_billed == 255
    assert fig.tokens.output_tokens_delivered == 230
    assert fig.tokens.output_tokens_undelivered == 25
    assert [a.usage_source for a in fig.attempts] == ["estimate", "upstream"]
    assert [a.status for a in fig.attempts] == ["failed", "completed"]
    assert fig.usage_source == "estimate"
    assert USAGE_MISSING in fig.anomalies
    assert not fig.complete  # attempt 1 has no upstream usage
    assert fig.status == "completed"
    assert fig.error_type is None
    assert fig.stop_reason == "end_turn"


def test_every_attempt_upstream_is_complete_and_upstream() -> None:
    fig = rule(
        [
            started("a1", input_tokens=5, attempt=1),
            usage("a2", 5, 7, at=1, attempt=1),
            failed("a3", "overloaded_error", at=2, attempt=1),
            started("b1", input_tokens=5, at=3, attempt=2),
            usage("b2", 5, 9, at=4, attempt=2),
        ]
    )
    assert len(fig.attempts) == 2
    assert fig.tokens.output_tokens_billed == 16
    assert fig.usage_source == "upstream"
    assert USAGE_MISSING not in fig.anomalies
    assert fig.complete


def test_attempts_are_numbered_by_the_events_not_counted_from_starts() -> None:
    fig = rule(
        [
            started("a1", attempt=1, input_tokens=1),
            usage("a2", 1, 1, attempt=1, at=1),
            usage("c1", 2, 2, attempt=3, at=5),
        ]
    )
    assert [a.attempt for a in fig.attempts] == [1, 3]
    assert fig.attempts[1].model == "m1"  # no stream.started of its own: the call's model


def test_status_error_type_and_stop_reason_come_from_the_last_attempt() -> None:
    fig = rule(
        [
            started("a1", input_tokens=5, attempt=1),
            usage("a2", 5, 7, at=1, attempt=1, stop_reason="max_tokens"),
            started("b1", input_tokens=5, at=3, attempt=2),
            tokens("b2", 50, 20, at=4, attempt=2),
            failed("b3", "overloaded_error", at=5, attempt=2),
        ]
    )
    assert fig.status == "failed"
    assert fig.error_type == "overloaded_error"
    assert fig.stop_reason is None

    fig = rule(
        [
            started("a1", input_tokens=5, attempt=1),
            failed("a2", "stalled", at=1, attempt=1),
            started("b1", input_tokens=5, at=3, attempt=2),
            tokens("b2", 50, 20, at=4, attempt=2),
            disconnect("b3", 20, 50, at=5, attempt=2),
            usage("b4", 5, 60, at=6, attempt=2, stop_reason="end_turn"),
        ]
    )
    assert fig.status == "client_disconnected"
    assert fig.error_type is None
    assert fig.stop_reason == "end_turn"

    fig = rule(
        [
            started("a1", input_tokens=5, attempt=1),
            failed("a2", "stalled", at=1, attempt=1),
            started("b1", input_tokens=5, at=3, attempt=2),
            usage("b2", 5, 60, at=6, attempt=2, stop_reason="stop"),
        ]
    )
    assert fig.status == "completed"
    assert fig.error_type is None
    assert fig.stop_reason == "stop"


def test_failed_wins_over_client_disconnected_in_the_last_attempt() -> None:
    fig = rule(
        [
            started("e1", input_tokens=5),
            disconnect("e2", 10, 12, at=1),
            failed("e3", "upstream_disconnect", at=2),
        ]
    )
    assert fig.status == "failed"
    assert fig.error_type == "upstream_disconnect"


def test_last_of_several_failures_names_the_error() -> None:
    fig = rule(
        [
            started("e1", input_tokens=5),
            failed("e3", "api_error", at=4),
            failed("e2", "overloaded_error", at=2),
        ]
    )
    assert fig.error_type == "api_error"


# -- identity, started_missing, complete ------------------------------------------------------


def test_identity_from_the_lowest_attempts_stream_started() -> None:
    fig = rule(
        [
            started("b1", at=10, attempt=2, key="key_b", model="m2", protocol="openai.responses"),
            started("a1", at=0, attempt=1, key="key_a", model="m1", metadata={"team": "x"}),
            usage("a2", 1, 1, at=1, attempt=1),
            usage("b2", 1, 1, at=11, attempt=2),
        ]
    )
    assert (fig.api_key_id, fig.model, fig.protocol) == ("key_a", "m1", "anthropic.messages")
    assert fig.metadata == {"team": "x"}
    assert fig.started_at == T0
    assert fig.ended_at == T0 + timedelta(seconds=11)
    assert [a.model for a in fig.attempts] == ["m1", "m2"]


def test_started_missing_never_complete_and_no_key() -> None:
    fig = rule([usage("e1", 10, 20, at=3), tokens("e2", 20, 20, at=2)])
    assert fig.api_key_id is None
    assert fig.model is None
    assert STARTED_MISSING in fig.anomalies
    assert fig.usage_source == "upstream"
    assert not fig.complete
    assert fig.started_at == T0 + timedelta(seconds=2)  # the earliest event stands in
    assert fig.tokens.output_tokens_billed == 20


def test_complete_needs_started_and_upstream_usage() -> None:
    assert not rule([started("e1", input_tokens=1)]).complete
    assert not rule([started("e1"), usage("e2", 1, 1, source="estimate")]).complete
    assert rule([started("e1"), usage("e2", 1, 1)]).complete


# -- money ------------------------------------------------------------------------------------


def test_cost_is_exact_picodollars_per_bucket() -> None:
    fig = rule(
        [
            started("e1"),
            usage("e2", 1000, 2000, cache_read_input_tokens=3000, cache_creation_input_tokens=4000),
        ]
    )
    book = PriceBook([price(1, "m1", 3_000_000, 15_000_000, 300_000, 3_750_000)])
    lines = target_lines(fig, book)
    # 1000×3 + 2000×15 + 3000×0.30 + 4000×3.75 = 3000 + 30000 + 900 + 15000 µ$ = 0.0489 USD
    assert pusd_to_str(call_cost(lines)) == "0.0489"


def test_unpriced_model_costs_none_never_zero() -> None:
    fig = rule([started("e1", model="m-new"), usage("e2", 10, 10)])
    assert call_cost(target_lines(fig, PriceBook([price(1, "m1", 1, 1)]))) is None


def test_price_in_force_at_the_calls_start() -> None:
    fig = rule([started("e1", at=0), usage("e2", 1_000_000, 0, at=600)])
    book = PriceBook(
        [
            price(1, "m1", 1_000_000, 0, effective_from=T0 - timedelta(days=1)),
            price(2, "m1", 2_000_000, 0, effective_from=T0 + timedelta(seconds=1)),
        ]
    )
    assert pusd_to_str(call_cost(target_lines(fig, book))) == "1"
    book = PriceBook(
        [
            price(1, "m1", 1_000_000, 0, effective_from=T0 - timedelta(days=1)),
            price(2, "m1", 2_000_000, 0, effective_from=T0),  # effective exactly at the start
        ]
    )
    assert pusd_to_str(call_cost(target_lines(fig, book))) == "2"


def test_attempts_of_different_models_are_priced_by_their_own_model() -> None:
    fig = rule(
        [
            started("a1", attempt=1, model="m1"),
            usage("a2", 1000, 0, attempt=1, at=1),
            started("b1", attempt=2, model="m2", at=2),
            usage("b2", 1000, 0, attempt=2, at=3),
        ]
    )
    book = PriceBook([price(1, "m1", 1_000_000, 0), price(2, "m2", 5_000_000, 0)])
    lines = target_lines(fig, book)
    assert sorted((line.key.model, line.tokens.input_tokens) for line in lines) == [
        ("m1", 1000),
        ("m2", 1000),
    ]
    assert pusd_to_str(call_cost(lines)) == "0.006"


# -- public reports of gateways getting it wrong ----------------------------------------------

SONNET = price(1, "m1", 3_000_000, 15_000_000, 300_000, 3_750_000)


def test_report_1_disconnect_at_zero_delivered_bills_what_upstream_generated() -> None:
    fig = rule(
        [
            started("e1"),
            disconnect("e2", 0, at=0.5),
            usage("e3", 40, 300, at=9),
        ]
    )
    assert fig.tokens.input_tokens == 40
    assert fig.tokens.output_tokens_billed == 300
    assert fig.tokens.output_tokens_delivered == 0
    assert fig.tokens.output_tokens_undelivered == 300
    assert fig.status == "client_disconnected"
    assert fig.complete


def test_report_2_same_final_usage_twice_billed_once_in_the_ledger() -> None:
    ledger = PureLedger()
    book = PriceBook([SONNET])
    ledger.book(rule([started("e1"), usage("u1", 40, 300, at=2)]), book)
    late = ledger.book(
        rule([started("e1"), usage("u1", 40, 300, at=2), usage("u2", 40, 300, at=2)]), book
    )
    assert late == []
    assert ledger.tokens().output_tokens_billed == 300
    assert [e.kind for e in ledger.entries] == ["settlement"]


def test_report_3_settled_on_estimates_then_upstream_usage_adjusts() -> None:
    ledger = PureLedger()
    book = PriceBook([SONNET])
    early = [
        started("e1", input_tokens=50),
        tokens("e2", 200, 120, at=3),
        disconnect("e3", 120, at=3),
    ]
    fig = rule(early)
    assert (fig.tokens.input_tokens, fig.tokens.output_tokens_billed) == (50, 200)
    assert (fig.tokens.output_tokens_delivered, fig.tokens.output_tokens_undelivered) == (120, 80)
    first = ledger.book(fig, book)
    assert [e.kind for e in first] == ["settlement"]
    assert pusd_to_str(first[0].cost_pusd) == "0.00315"

    fig = rule([*early, usage("e4", 52, 400, at=20)])
    adjustment = ledger.book(fig, book)
    assert len(adjustment) == 1
    (entry,) = adjustment
    assert entry.kind == "adjustment"
    assert entry.tokens == Tokens(
        input_tokens=2, output_tokens_billed=200, output_tokens_undelivered=200
    )
    assert pusd_to_str(entry.cost_pusd) == "0.003006"
    assert "input_tokens +2" in entry.reason and "output_tokens_billed +200" in entry.reason
    assert ledger.entries[0] is first[0]
    assert ledger.tokens() == fig.tokens
    assert (fig.tokens.input_tokens, fig.tokens.output_tokens_billed) == (52, 400)
    assert (fig.tokens.output_tokens_delivered, fig.tokens.output_tokens_undelivered) == (120, 280)
    assert fig.usage_source == "upstream"
    assert pusd_to_str(ledger.cost()) == "0.006156"
    assert pusd_to_str(call_cost(target_lines(fig, book))) == "0.006156"


def test_report_4_two_request_ids_are_two_calls() -> None:
    def call(rid: str, suffix: str) -> CallFigures:
        return rule([started("s" + suffix, rid), usage("u" + suffix, 40, 300, rid=rid, at=1)], rid)

    one, two = call("req-1", "1"), call("req-2", "2")
    assert one.request_id != two.request_id
    assert one.tokens == two.tokens
    assert one.tokens.output_tokens_billed == 300


def test_report_5_a_tiny_call_is_not_free() -> None:
    fig = rule([started("e1", input_tokens=25), usage("e2", 25, 0)])
    book = PriceBook([price(1, "m1", 300_000, 0)])
    assert pusd_to_str(call_cost(target_lines(fig, book))) == "0.0000075"


# -- the ledger plan --------------------------------------------------------------------------


def test_ledger_key_change_reverses_then_settles_again() -> None:
    ledger = PureLedger()
    book = PriceBook([SONNET, price(2, "m2", 1_000_000, 2_000_000)])
    # stream.started is late: the call settles with no key and no model (started_missing).
    ledger.book(rule([usage("e2", 10, 20, at=1)]), book)
    assert [(e.kind, e.key.api_key_id, e.cost_pusd) for e in ledger.entries] == [
        ("settlement", None, None)
    ]
    fig = rule([usage("e2", 10, 20, at=1), started("e1", model="m2")])
    planned = ledger.book(fig, book)
    assert [(e.kind, e.key.api_key_id, e.key.model) for e in planned] == [
        ("adjustment", None, None),
        ("settlement", "key_a", "m2"),
    ]
    assert planned[0].reason.startswith("reversal")
    # No disconnect and no delivered count: it delivered what it billed (CONTRACT v2).
    assert planned[0].tokens == -Tokens(
        input_tokens=10, output_tokens_billed=20, output_tokens_delivered=20
    )
    assert ledger.tokens() == fig.tokens
    assert ledger.cost() == call_cost(target_lines(fig, book)) == 10 * 1_000_000 + 20 * 2_000_000


def test_ledger_late_event_on_a_call_settled_at_zero_is_an_adjustment() -> None:
    ledger = PureLedger()
    book = PriceBook([SONNET])
    early = [started("e1", input_tokens=0)]
    ledger.book(rule(early), book)
    assert [e.kind for e in ledger.entries] == ["settlement"]
    assert ledger.entries[0].tokens.is_zero()
    fig = rule([*early, usage("e2", 40, 300, at=400)])
    planned = ledger.book(fig, book)
    assert [e.kind for e in planned] == ["adjustment"]
    assert planned[0].reason.startswith("late events changed the usage")
    assert ledger.tokens() == fig.tokens
    assert [e.kind for e in ledger.entries].count("settlement") == 1


def test_ledger_unpriced_then_priced() -> None:
    ledger = PureLedger()
    fig = rule([started("e1", model="m-new"), usage("e2", 1000, 2000, at=1)])
    ledger.book(fig, PriceBook([]))
    assert ledger.entries[0].cost_pusd is None
    book = PriceBook([price(7, "m-new", 1_000_000, 2_000_000)])
    planned = ledger.book(fig, book)
    assert [(e.kind, e.key.price_id, e.cost_pusd) for e in planned] == [
        ("adjustment", None, None),
        ("adjustment", 7, 5_000_000_000),
    ]
    assert planned[0].reason.startswith("reversal")
    assert planned[1].reason.startswith("re-priced")
    assert ledger.tokens() == fig.tokens
    assert ledger.cost() == 5_000_000_000
    assert ledger.book(fig, book) == []


def test_ledger_token_fields_are_all_booked() -> None:
    ledger = PureLedger()
    fig = rule(
        [
            started("e1"),
            disconnect("e2", 3, at=1),
            usage(
                "e3",
                1,
                9,
                at=2,
                cache_read_input_tokens=4,
                cache_creation_input_tokens=5,
                reasoning_tokens=6,
            ),
        ]
    )
    ledger.book(fig, PriceBook([SONNET]))
    assert ledger.tokens().as_dict() == dict(
        zip(TOKEN_FIELDS, [1, 4, 5, 0, 9, 3, 6, 6], strict=True)
    )


def test_ledger_late_attempt_on_another_model_is_an_adjustment_not_a_second_settlement() -> None:
    ledger = PureLedger()
    book = PriceBook([SONNET, price(2, "m2", 1_000_000, 2_000_000)])
    early = [started("a1", input_tokens=10, attempt=1), failed("a2", "stalled", at=1, attempt=1)]
    ledger.book(rule(early), book)
    # The gateway retried on a fallback model after the call had settled on attempt 1.
    later = [*early, started("b1", input_tokens=10, at=2, attempt=2, model="m2")]
    assert ledger.book(rule(later), book)[0].tokens == Tokens(input_tokens=10)
    fig = rule([*later, usage("b2", 10, 30, at=3, attempt=2)])
    planned = ledger.book(fig, book)
    assert [(e.kind, e.key.model) for e in planned] == [("adjustment", "m2")]
    assert [e.kind for e in ledger.entries].count("settlement") == 1
    assert ledger.tokens() == fig.tokens
    assert (
        ledger.cost()
        == call_cost(target_lines(fig, book))
        == (10 * 3_000_000 + 10 * 1_000_000 + 30 * 2_000_000)
    )


def test_ledger_unpriced_call_settled_at_zero_then_priced_and_used() -> None:
    ledger = PureLedger()
    early = [started("e1", model="m-new", input_tokens=0)]
    ledger.book(rule(early), PriceBook([]))
    fig = rule([*early, usage("e2", 1000, 0, at=1)])
    planned = ledger.book(fig, PriceBook([price(7, "m-new", 1_000_000, 0)]))
    # The unpriced line booked at zero is closed by a reversal of zero tokens, then re-posted.
    assert [(e.kind, e.key.price_id, e.tokens.is_zero()) for e in planned] == [
        ("adjustment", None, True),
        ("adjustment", 7, False),
    ]
    assert planned[0].reason.startswith("reversal")
    assert planned[1].reason.startswith("re-priced")
    assert ledger.cost() == 1_000_000_000
    assert ledger.book(fig, PriceBook([price(7, "m-new", 1_000_000, 0)])) == []


def test_ledger_reason_fits_the_ledgers_column() -> None:
    big = 999_999_999
    ledger = PureLedger()
    early = [started("a1", input_tokens=0)]
    ledger.book(rule(early), PriceBook([SONNET]))
    fig = rule(
        [
            *early,
            disconnect("a2", big, at=1),
            usage(
                "a3",
                big,
                big,
                at=2,
                cache_read_input_tokens=big,
                cache_creation_input_tokens=big,
                reasoning_tokens=big,
            ),
            *(
                usage(
                    f"b{n}",
                    big,
                    big,
                    attempt=n,
                    at=n,
                    cache_read_input_tokens=big,
                    cache_creation_input_tokens=big,
                    reasoning_tokens=big,
                )
                for n in range(2, 40)
            ),
        ]
    )
    (entry,) = ledger.book(fig, PriceBook([SONNET]))
    assert entry.kind == "adjustment"
    assert len(entry.reason) <= 200
    assert entry.reason.startswith("late events changed the usage: input_tokens +38999999961")
