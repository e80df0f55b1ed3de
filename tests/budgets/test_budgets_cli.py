"""``billing budgets create|update|delete|list|show`` on the test database."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from billing.cli import app
from billing.settings import get_settings


def _run(monkeypatch: pytest.MonkeyPatch, db_url: str, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url)
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["budgets", *args])
    get_settings.cache_clear()
    return result.exit_code, result.stdout, result.stderr


def test_the_budget_commands(monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    code, out, _ = _run(
        monkeypatch,
        db_url,
        "create",
        "cli-1",
        "--api-key-id",
        "key_cli",
        "--limit-usd",
        "5",
        "--period",
        "week",
        "--tz",
        "Europe/Paris",
        "--thresholds",
        "0.5,0.9,1",
    )
    assert code == 0, out
    created = json.loads(out)
    assert created["webhook_secret"].startswith("whsec_")
    assert (created["scope"], created["thresholds"]) == (
        {"api_key_id": "key_cli"},
        ["0.5", "0.9", "1"],
    )
    code, out, _ = _run(monkeypatch, db_url, "show", "cli-1")
    assert code == 0 and json.loads(out)["spent_usd"] == "0"
    code, out, _ = _run(
        monkeypatch,
        db_url,
        "update",
        "cli-1",
        "--api-key-id",
        "key_cli",
        "--limit-usd",
        "7",
        "--period",
        "month",
    )
    assert code == 0 and json.loads(out)["version"] == 2
    code, out, _ = _run(monkeypatch, db_url, "list")
    assert [(b["budget_id"], b["limit_usd"]) for b in json.loads(out)] == [("cli-1", "7")]
    code, _, err = _run(
        monkeypatch,
        db_url,
        "create",
        "x",
        "--api-key-id",
        "k",
        "--limit-usd",
        "0",
        "--period",
        "day",
    )
    assert code == 2 and "limit_usd" in err
    code, _, err = _run(
        monkeypatch,
        db_url,
        "create",
        "x",
        "--api-key-id",
        "k",
        "--limit-usd",
        "1",
        "--period",
        "day",
        "--tz",
        "Nowhere/Land",
    )
    assert code == 2 and "tz" in err
    code, out, _ = _run(monkeypatch, db_url, "delete", "cli-1")
    assert code == 0 and json.loads(out)["ended_at"] is not None
    code, _, err = _run(monkeypatch, db_url, "show", "cli-1")
    assert code == 1 and "was deleted" in err
