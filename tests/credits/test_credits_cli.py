"""``billing credits grant|void|balance|list`` on the test database (CONTRACT "Prepaid credits
(v3)", "Command line"): what the API stores, one clear line on error."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from billing.cli import app as cli
from billing.settings import Settings, get_settings
from tests.credits.helpers import JAN, PRICE, call, ok, reconcile


def _run(monkeypatch: pytest.MonkeyPatch, db_url: str, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url)
    get_settings.cache_clear()
    result = CliRunner().invoke(cli, ["credits", *args])
    get_settings.cache_clear()
    return result.exit_code, result.stdout, result.stderr


def test_the_credit_commands(
    monkeypatch: pytest.MonkeyPatch, db_url: str, client: TestClient, app: FastAPI,
    settings: Settings,
) -> None:  # fmt: skip
    ok(client.post("/v1/prices", json=PRICE), 201)
    ok(client.put("/v1/keys/key_a", json={"customer_id": "acme", "effective_from": JAN}), 201)
    args = ("grant", "g1", "--customer", "acme", "--amount", "2.5", "--effective-at", JAN)
    code, out, err = _run(monkeypatch, db_url, *args, "--note", "invoice 7")
    assert code == 0, err
    assert json.loads(out)["remaining_usd"] == "2.5"
    assert "grant g1 stored" in err
    code, _, err = _run(monkeypatch, db_url, *args, "--note", "invoice 7")
    assert (code, "grant g1 unchanged" in err) == (0, True)
    code, _, err = _run(monkeypatch, db_url, *args[:5], "2.6", *args[6:])
    assert code != 0 and len(err.strip().splitlines()) == 1 and "'g1'" in err
    code, _, err = _run(
        monkeypatch, db_url, "grant", "g2", "--customer", "acme", "--amount", "1.0000001"
    )
    assert code != 0 and "more than 6 decimal places" in err
    call(client, "r1", "2026-03-01T10:00:00Z", 1000)  # 0.01
    reconcile(app, settings, "2026-03-01T10:05:00Z")
    code, out, err = _run(monkeypatch, db_url, "balance", "--customer", "acme")
    assert code == 0, err
    assert (json.loads(out)["balance_usd"], json.loads(out)["available_usd"]) == ("2.49", "2.49")
    code, out, _ = _run(monkeypatch, db_url, "void", "g1")
    assert (code, json.loads(out)["state"]) == (0, "voided")
    code, out, _ = _run(monkeypatch, db_url, "list", "--customer", "acme")
    header, *lines = out.splitlines()
    assert header.split("\t") == [
        "entry_id", "kind", "booked_at", "grant_id", "amount_usd", "request_id"
    ]  # fmt: skip
    rows = [line.split("\t") for line in lines]
    # By booking time, newest first: the grant was booked when posted (now), the draw by the
    # reconciliation at its clock (March).
    assert [(r[1], r[3], r[4], r[5]) for r in rows] == [
        ("void", "g1", "2.49", "-"),
        ("grant", "g1", "2.5", "-"),
        ("draw", "g1", "0.01", "r1"),
    ]
    # A key with a customer lists its customer's entries, as its balance is its customer's.
    code, out, _ = _run(monkeypatch, db_url, "list", "--key", "key_a")
    assert [line.split("\t")[1] for line in out.splitlines()[1:]] == ["void", "grant", "draw"]
    code, _, err = _run(monkeypatch, db_url, "balance")
    assert code != 0 and "exactly one of --customer and --key" in err


def test_a_bad_grant_is_one_line_in_the_service_s_words(
    monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    # Pydantic's "Value error, " prefix stood in front of the service's own sentence.
    grant = ("grant", "g3", "--customer", "acme")
    code, _, err = _run(monkeypatch, db_url, *grant, "--amount", "1.0000001")
    assert (code, err) == (
        1,
        "billing: grant amount_usd: has more than 6 decimal places (credit is exact to "
        "0.000001 USD)\n",
    )
    code, _, err = _run(monkeypatch, db_url, *grant, "--amount", "1", "--expires-at", "2027-01-01")
    assert (code, err) == (
        1,
        "billing: grant expires_at: must be an RFC 3339 timestamp string such as "
        "2026-10-15T08:00:00Z\n",
    )
