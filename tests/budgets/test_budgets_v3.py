"""Budgets gain (CONTRACT "Authorizations and holds (v3)"): a tag scope (metadata tags or an
authorization's tags), every call, a model or a prefix, a rolling window, and the 422s of their
bad values; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from billing.storage.models import Budget, BudgetHold
from tests.budgets.helpers import MODEL, PRICE, _ts, create, price, read, reconcile, status
from tests.budgets.test_holds import KEY, auth_at, body
from tests.builders import post

T0 = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)


def settled_call(
    client: TestClient,
    rid: str,
    at: datetime,
    input_tokens: int,
    *,
    model: str = MODEL,
    key: str = KEY,
    tags: str | None = None,
) -> None:
    started: dict[str, Any] = {
        "event_id": f"{rid}-s",
        "request_id": rid,
        "type": "stream.started",
        "occurred_at": _ts(at),
        "api_key_id": key,
        "model": model,
        "protocol": "openai.chat_completions",
        "input_tokens": input_tokens,
    }
    if tags is not None:
        started["metadata"] = {"tags": tags}
    used = {
        "event_id": f"{rid}-u",
        "request_id": rid,
        "type": "stream.usage",
        "occurred_at": _ts(at + timedelta(seconds=1)),
        "input_tokens": input_tokens,
        "output_tokens": 0,
        "source": "upstream",
    }
    response = post(client, [started, used])
    assert response.status_code == 200, response.text


def spent(client: TestClient, budget_id: str, at: datetime) -> tuple[str, str, str]:
    s = status(client, budget_id, at)
    return s["settled_usd"], s["held_usd"], s["spent_usd"]


def test_a_tag_budget_and_a_model_prefix_budget_count_only_their_calls(
    client: TestClient,
) -> None:
    price(client)
    price(client, model="claude-x")
    price(client, model="claude-y")
    create(client, T0, budget_id="team-a", scope={"tag": "team-a"}, limit_usd="10", period="day")
    create(
        client,
        T0,
        budget_id="claude",
        scope={"all": True},
        model="claude-*",
        limit_usd="10",
        period="month",
    )
    create(client, T0, budget_id="every", scope={"all": True}, limit_usd="10", period="total")
    at = T0 + timedelta(minutes=1)
    settled_call(client, "t1", at, 100_000, model="claude-x", tags="team-b, team-a")  # $0.10
    settled_call(client, "t2", at, 200_000, tags="team-ab,team-c")  # $0.20
    settled_call(client, "t3", at, 400_000, model="claude-y", key="key_other")  # $0.40
    reconcile(client, at + timedelta(seconds=30))
    # t4's tag is its authorization's ($0.80 held until its call).
    auth = auth_at(client, at, rid="t4", tags=["team-a"], estimate={"amount_usd": "0.8"})
    assert [b["budget_id"] for b in auth["budgets"]] == ["every", "team-a"]
    assert spent(client, "team-a", at) == ("0.1", "0.8", "0.9")
    settled_call(client, "t4", at, 1_600_000)  # $1.60
    reconcile(client, at + timedelta(minutes=1))
    later = at + timedelta(minutes=2)
    assert spent(client, "team-a", later) == ("1.7", "0", "1.7")
    assert spent(client, "claude", later) == ("0.5", "0", "0.5")
    assert spent(client, "every", later) == ("2.3", "0", "2.3")
    # The spend check names no tag: the tag budget is not over the key.
    check = client.get("/v1/spend", params={"api_key_id": "key_other"}).json()
    assert [b["budget_id"] for b in check["budgets"]] == ["claude", "every"]
    # An authorization of another model is not under the claude budget.
    other = auth_at(client, later, rid="t5", estimate={"amount_usd": "0.01"})
    assert [b["budget_id"] for b in other["budgets"]] == ["every"]
    claude = auth_at(client, later, rid="t6", model="claude-x", estimate={"amount_usd": "0.01"})
    assert [b["budget_id"] for b in claude["budgets"]] == ["claude", "every"]


def test_a_rolling_window_forgets_a_call_after_its_window(client: TestClient) -> None:
    price(client)
    create(
        client,
        T0,
        budget_id="per-minute",
        scope={"api_key_id": KEY},
        limit_usd="0.25",
        period="rolling",
        window_s=60,
    )
    settled_call(client, "w1", T0, 200_000)  # $0.20
    reconcile(client, T0 + timedelta(seconds=2))
    s = status(client, "per-minute", T0 + timedelta(seconds=59))
    assert (s["period_start"], s["period_end"], s["spent_usd"]) == (
        "2026-11-10T11:59:59Z",
        "2026-11-10T12:00:59Z",
        "0.2",
    )
    denied = auth_at(client, T0 + timedelta(seconds=59), rid="w2", estimate={"amount_usd": "0.1"})
    assert (denied["decision"], denied["reason"], denied["retryable"]) == (
        "deny",
        "insufficient_headroom",
        False,
    )
    assert spent(client, "per-minute", T0 + timedelta(seconds=60)) == ("0", "0", "0")
    allowed = auth_at(client, T0 + timedelta(seconds=60), rid="w2", estimate={"amount_usd": "0.1"})
    assert (allowed["decision"], allowed["budgets"][0]["held_usd"]) == ("allow", "0.1")


BUDGET: dict[str, Any] = {
    "budget_id": "bad",
    "scope": {"api_key_id": KEY},
    "limit_usd": "1",
    "period": "day",
}


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"period": "rolling"}, "body"),
        ({"window_s": 60}, "body"),
        ({"period": "rolling", "window_s": 59}, "body.window_s"),
        ({"period": "rolling", "window_s": 2_592_001}, "body.window_s"),
        ({"period": "rolling", "window_s": "60"}, "body.window_s"),
        ({"model": "cl*aude"}, "body.model"),
        ({"model": "*"}, "body.model"),
        ({"unpriced": "maybe"}, "body.unpriced"),
        ({"scope": {"tag": "a", "all": True}}, "body.scope"),
        ({"scope": {"all": False}}, "body.scope.all"),
        ({"scope": {"tag": "x" * 65}}, "body.scope.tag"),
        # A tag a call's metadata can never hold (a comma-separated list, each trimmed).
        ({"scope": {"tag": "a,b"}}, "body.scope.tag"),
        ({"scope": {"tag": " a"}}, "body.scope.tag"),
    ],
)
def test_bad_v3_budget_values_are_422_naming_the_field(
    client: TestClient, change: dict[str, Any], path: str
) -> None:
    response = client.post("/v1/budgets", json={**BUDGET, **change})
    assert response.status_code == 422, response.text
    assert path in {e["path"] for e in response.json()["errors"]}, response.text
    assert read(client, lambda s: s.scalar(select(func.count()).select_from(Budget))) == 0


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"model": ""}, "body.model"),
        ({"estimate": {"input_tokens": -1, "max_output_tokens": 10}}, "body.estimate"),
        ({"estimate": {"amount_usd": "-0.05"}}, "body.estimate"),
        ({"estimate": {"amount_usd": 0.05}}, "body.estimate"),
        ({"estimate": {"amount_usd": "0.05", "input_tokens": 1}}, "body.estimate"),
        ({"ttl_s": 9}, "body.ttl_s"),
        ({"ttl_s": 3601}, "body.ttl_s"),
        ({"tags": [f"t{i}" for i in range(9)]}, "body.tags"),
        ({"tags": ["ok", "a,b"]}, "body.tags.1"),
        ({"tags": ["b "]}, "body.tags.0"),
        ({"api_key_id": "sk-ant-api03-" + "x" * 40}, "body.api_key_id"),
        ({"request_id": ""}, "body.request_id"),
    ],
)
def test_bad_authorizations_are_422_and_store_nothing(
    client: TestClient, change: dict[str, Any], path: str
) -> None:
    client.post("/v1/prices", json=PRICE)
    response = client.post("/v1/authorizations", json={**body("bad"), **change})
    assert response.status_code == 422, response.text
    paths = {e["path"] for e in response.json()["errors"]}
    assert any(p.startswith(path) for p in paths), response.text
    assert read(client, lambda s: s.scalar(select(func.count()).select_from(BudgetHold))) == 0


@pytest.mark.parametrize(
    ("estimate", "errors"),
    [
        ({"amount_usd": "-0.05"}, [("body.estimate.amount_usd", "must not be negative")]),
        ({"amount_usd": "1e-3"}, [("body.estimate.amount_usd", "is not a plain decimal")]),
        ({"input_tokens": 10}, [("body.estimate.max_output_tokens", "is required")]),
        (
            {"input_tokens": -1, "max_output_tokens": 10},
            [("body.estimate.input_tokens", "greater than or equal to 0")],
        ),
        (
            {"amount_usd": "0.05", "input_tokens": 1},
            [("body.estimate.input_tokens", "is not a field of this request")],
        ),
        (
            {},
            [
                ("body.estimate.input_tokens", "is required"),
                ("body.estimate.max_output_tokens", "is required"),
            ],
        ),
        (None, [("body.estimate", '{"input_tokens", "max_output_tokens"} or {"amount_usd"}')]),
        ("0.05", [("body.estimate", '{"input_tokens", "max_output_tokens"} or {"amount_usd"}')]),
    ],
)
def test_a_bad_estimate_is_named_in_the_form_it_was_sent_in(
    client: TestClient, estimate: Any, errors: list[tuple[str, str]]
) -> None:
    """An estimate is read in the form its fields name (``amount_usd``: an amount, else
    tokens): the 422 lists only that form's errors, at the field's own path, never one that
    tells the sender to remove the field it meant, nor a Python class name."""
    response = client.post("/v1/authorizations", json={**body("bad"), "estimate": estimate})
    assert response.status_code == 422, response.text
    got = [(e["path"], e["message"]) for e in response.json()["errors"]]
    assert [path for path, _ in got] == [path for path, _ in errors], got
    for (_, message), (_, words) in zip(got, errors, strict=True):
        assert words in message, got
    assert read(client, lambda s: s.scalar(select(func.count()).select_from(BudgetHold))) == 0
