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


def test_v3_budgets_from_the_command_line(monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    code, out, _ = _run(
        monkeypatch,
        db_url,
        "create",
        "cli-tag",
        "--tag",
        "team-a",
        "--model",
        "claude-*",
        "--limit-usd",
        "2",
        "--period",
        "rolling",
        "--window-s",
        "3600",
        "--unpriced",
        "deny",
    )
    assert code == 0, out
    created = json.loads(out)
    assert {k: created[k] for k in ("scope", "model", "period", "window_s", "unpriced")} == {
        "scope": {"tag": "team-a"},
        "model": "claude-*",
        "period": "rolling",
        "window_s": 3600,
        "unpriced": "deny",
    }
    code, out, _ = _run(
        monkeypatch, db_url, "create", "cli-all", "--all", "--limit-usd", "9", "--period", "day"
    )
    assert code == 0 and json.loads(out)["scope"] == {"all": True}
    code, out, _ = _run(monkeypatch, db_url, "show", "cli-tag")
    assert code == 0 and (json.loads(out)["spent_usd"], json.loads(out)["held_usd"]) == ("0", "0")
    code, _, err = _run(
        monkeypatch, db_url, "create", "x", "--all", "--limit-usd", "1", "--period", "rolling"
    )
    assert code == 2 and "window_s" in err
