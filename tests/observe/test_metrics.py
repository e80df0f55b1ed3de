"""``/metrics``' ledger families (CONTRACT "Observability and standard exports (v3)"): exact
totals by model and provider read from the rollups at scrape time, the same from every app of
one database, and a bounded size whatever paths, keys and models clients send."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.reconcile.runner import run_pass
from billing.server.app import create_app
from billing.settings import Settings
from tests.plans.test_plans import HAIKU, SONNET
from tests.plans.test_plans import PRO as PRO_PLAN

M1, M2, PRO = SONNET, HAIKU, PRO_PLAN  # m1 at 3 / 15 USD per Mtok, m2 at 1 / 5; 20 % markup
LEDGER_FAMILIES = (
    "billing_cost_usd_total",
    "billing_charge_usd_total",
    "billing_leakage_usd_total",
    "billing_tokens_total",
    "billing_undelivered_output_tokens_total",
    "billing_unpriced_calls_total",
    "billing_webhook_deliveries_total",
    "billing_budget_remaining_usd",
)


def ok(response: Any, *codes: int) -> Any:
    assert response.status_code in (codes or (200, 201)), response.text
    return response.json()


def call(
    rid: str, key: str, model: str, inp: int, out: int, delivered: int | None = None
) -> list[dict[str, Any]]:
    started = {
        "event_id": f"{rid}-s", "request_id": rid, "type": "stream.started",
        "occurred_at": "2026-03-01T10:00:00Z", "api_key_id": key, "model": model,
        "protocol": "anthropic.messages", "provider": "anthropic",
    }  # fmt: skip
    events = [started]
    if delivered is not None:
        events.append({
            "event_id": f"{rid}-d", "request_id": rid, "type": "stream.client_disconnected",
            "occurred_at": "2026-03-01T10:00:00.5Z", "output_tokens_delivered": delivered,
        })  # fmt: skip
    events.append({
        "event_id": f"{rid}-u", "request_id": rid, "type": "stream.usage",
        "occurred_at": "2026-03-01T10:00:01Z", "input_tokens": inp, "output_tokens": out,
        "source": "upstream",
    })  # fmt: skip
    return events


def reconcile(app: FastAPI, settings: Settings) -> None:
    run_pass(
        app.state.billing.sessions,
        settings,
        now=datetime.fromisoformat("2026-03-01T10:01:00+00:00"),
    )


def ledger_lines(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(LEDGER_FAMILIES)]


def test_exact_totals_by_model_and_provider_the_same_from_every_app(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(client.post("/v1/prices", json=M1), 201)
    ok(client.post("/v1/prices", json=M2), 201)
    ok(client.post("/v1/plans", json=PRO), 201)
    key = {"customer_id": "acme", "plan_id": "pro", "effective_from": "2026-01-01T00:00:00Z"}
    ok(client.put("/v1/keys/key_a", json=key), 201)
    budget = {"budget_id": "b1", "scope": {"api_key_id": "key_a"}, "limit_usd": "1",
              "period": "total"}  # fmt: skip
    ok(client.post("/v1/budgets", json=budget), 201)
    events = [
        *call("r1", "key_a", "m1", 22, 750, delivered=380),  # 0.011316, charged 0.0135792
        *call("r2", "key_a", "m1", 22, 750),
        *call("r3", "key_b", "m2", 22, 750),  # 0.000022 + 0.00375 = 0.003772
        *call("r4", "key_b", "unknown-x", 10, 5),  # no price
    ]
    ok(client.post("/v1/events", json={"events": events}), 200)
    reconcile(app, settings)

    body = client.get("/metrics").text
    lines = ledger_lines(body)
    expected = [
        'billing_cost_usd_total{model="m1",provider="anthropic"} 0.022632',
        'billing_cost_usd_total{model="m2",provider="anthropic"} 0.003772',
        'billing_cost_usd_total{model="unknown-x",provider="anthropic"} 0.0',
        'billing_charge_usd_total{model="m1",provider="anthropic"} 0.0271584',
        'billing_charge_usd_total{model="m2",provider="anthropic"} 0.003772',
        'billing_leakage_usd_total{model="m1",provider="anthropic"} 0.0',
        'billing_tokens_total{model="m1",provider="anthropic",type="input"} 44.0',
        'billing_tokens_total{model="m1",provider="anthropic",type="output"} 1500.0',
        'billing_tokens_total{model="m1",provider="anthropic",type="cache_read"} 0.0',
        'billing_tokens_total{model="m2",provider="anthropic",type="output"} 750.0',
        'billing_tokens_total{model="unknown-x",provider="anthropic",type="input"} 10.0',
        'billing_undelivered_output_tokens_total{model="m1",provider="anthropic"} 370.0',
        'billing_undelivered_output_tokens_total{model="m2",provider="anthropic"} 0.0',
        'billing_unpriced_calls_total{model="unknown-x",provider="anthropic"} 1.0',
        'billing_unpriced_calls_total{model="m1",provider="anthropic"} 0.0',
        'billing_webhook_deliveries_total{outcome="failed"} 0.0',
    ]
    missing = [line for line in expected if line not in lines]
    assert not missing, "\n".join(lines)
    status = ok(client.get("/v1/budgets/b1"), 200)
    assert status["remaining_usd"] in ("0.977368", "0.9728416")
    assert f'billing_budget_remaining_usd{{budget_id="b1"}} {status["remaining_usd"]}' in lines
    assert "billing_reconcile_lag_seconds 0.0" in body.splitlines()

    # A second app (another `billing serve` worker or replica) reports the same totals.
    other = create_app(settings)
    with TestClient(other, base_url="http://127.0.0.1") as second:
        assert ledger_lines(second.get("/metrics").text) == lines
    other.state.billing.engine.dispose()


def test_a_call_waiting_for_the_reconciler_shows_as_lag(client: TestClient) -> None:
    ok(client.post("/v1/events", json={"events": call("r1", "key_a", "m1", 1, 1)}), 200)
    lag = [
        line for line in client.get("/metrics").text.splitlines()
        if line.startswith("billing_reconcile_lag_seconds ")
    ]  # fmt: skip
    assert len(lag) == 1
    assert 0 < float(lag[0].split()[1]) < 120


#: The stated bound of ``/metrics`` (the default ``BILLING_METRICS_MAX_MODELS`` of 100).
MAX_METRICS_BYTES = 160 * 1024


def test_metrics_stay_bounded_after_10000_junk_keys_and_models_and_1000_paths(
    client: TestClient, app: FastAPI, settings: Settings
) -> None:
    ok(client.post("/v1/prices", json=M1), 201)
    for i in range(1000):  # every unknown path is one label value: route="unmatched"
        assert client.get(f"/junk/{i}").status_code == 404
    for batch in range(20):
        events = [
            event
            for i in range(batch * 500, (batch + 1) * 500)
            for event in call(f"j{i}", f"key_{i}", f"junk-model-{i}", 1, 1)
        ]
        ok(client.post("/v1/events", json={"events": events}), 200)
    ok(client.post("/v1/events", json={"events": call("r1", "key_a", "m1", 22, 750)}), 200)
    reconcile(app, settings)
    body = client.get("/metrics").text
    assert len(body.encode()) < MAX_METRICS_BYTES
    lines = ledger_lines(body)
    assert 'billing_cost_usd_total{model="m1",provider="anthropic"} 0.011316' in lines
    # The models past the first 100 (m1 and 99 junk ones) are summed, not dropped: the other
    # 9,901 junk calls of 1 + 1 tokens.
    assert 'billing_tokens_total{model="_other",provider="_other",type="input"} 9901.0' in lines
    assert not any("junk/" in line or "key_" in line for line in body.splitlines())
