"""``billing plans load FILE`` and ``billing keys set|list`` (CONTRACT "Command line", "Keys,
customers and plans (v2)"): what the API stores, in one clear line on error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.plans.test_plans import GOLD, OWN_M2, PRO
from tests.pricing.test_prices import run_cli


@pytest.mark.slow
def test_plans_load_and_keys_set_list(client: TestClient, db_url: str, tmp_path: Path) -> None:
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps([PRO, dict(GOLD, prices=[OWN_M2])]))
    first = run_cli(db_url, tmp_path, "plans", "load", str(plans))
    assert first.returncode == 0, first.stderr
    assert "2 plan version(s) added, 0 already present" in first.stderr
    again = run_cli(db_url, tmp_path, "plans", "load", str(plans))
    assert "0 plan version(s) added, 2 already present" in again.stderr
    listed = client.get("/v1/plans").json()["data"]
    assert [(p["plan_id"], p["markup_pct"], len(p["prices"])) for p in listed] == [
        ("gold", "50", 1),
        ("pro", "20", 0),
    ]
    conflict = tmp_path / "conflict.json"
    conflict.write_text(json.dumps([dict(PRO, plan_id="new"), dict(PRO, markup_pct="21")]))
    refused = run_cli(db_url, tmp_path, "plans", "load", str(conflict))
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "'pro'" in refused.stderr
    assert len(client.get("/v1/plans").json()["data"]) == 2  # nothing of the file stored

    set_key = run_cli(
        db_url, tmp_path, "keys", "set", "key_a", "--customer", "acme", "--plan", "pro",
        "--name", "Acme prod", "--effective-from", "2026-01-01T00:00:00Z",
    )  # fmt: skip
    assert set_key.returncode == 0, set_key.stderr
    assert "key key_a set" in set_key.stderr
    shown = run_cli(db_url, tmp_path, "keys", "list")
    assert shown.stdout == "key_a\tacme\tpro\tAcme prod\t2026-01-01T00:00:00Z\n"
    unknown = run_cli(db_url, tmp_path, "keys", "set", "key_b", "--plan", "nope")
    assert unknown.returncode != 0
    assert "no plan 'nope'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
