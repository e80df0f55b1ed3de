"""``billing providers import`` and ``billing drift``: the same stores and rows as the API."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.cli_runs import run_billing
from tests.drift.test_drift import DAY, PERIOD, call, settle
from tests.providers.pages import openai_page, openai_usage_result

Billing = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture
def billing(cli_way: str) -> Billing:
    """``billing(db_url, cwd, *args)``: the command in process, or in a subprocess (slow)."""

    def run(db_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
        env["BILLING_DATABASE_URL"] = db_url
        return run_billing(cli_way, args, env, cwd)

    return run


def test_import_files_then_drift_gives_the_bytes_of_the_http_export(
    client: TestClient, db_url: str, tmp_path: Path, billing: Billing
) -> None:
    call(client, "r1", output=380)
    call(client, "r2", model="gpt-4o-mini")
    settle(client)
    first = tmp_path / "page1.json"
    second = tmp_path / "page2.json"
    first.write_text(
        json.dumps(openai_page([(DAY, [openai_usage_result("gpt-4o", 150, 50, 750, 1)])], "n2"))
    )
    second.write_text(json.dumps(openai_page([(DAY, [openai_usage_result("o3", 1, 0, 1, 1)])])))
    done = billing(
        db_url,
        tmp_path,
        "providers",
        "import",
        str(first),
        "--provider",
        "openai",
        "--kind",
        "usage",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"buckets": 1, "new": 1, "changed": 0, "unchanged": 0}
    # The second page is another version of the same day's bucket: it supersedes the first.
    done = billing(
        db_url,
        tmp_path,
        "providers",
        "import",
        str(first),
        str(second),
        "--provider",
        "openai",
        "--kind",
        "usage",
    )
    assert json.loads(done.stdout) == {"buckets": 2, "new": 0, "changed": 1, "unchanged": 1}

    exported = client.get("/v1/exports/drift.csv", params=PERIOD).content
    done = billing(
        db_url, tmp_path, "drift", "--since", PERIOD["since"], "--until", PERIOD["until"]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == exported
    statuses = [line.split(b",")[3] for line in exported.split(b"\r\n")[1:-1]]
    assert statuses == [b"missing_ours", b"missing_theirs", b"missing_theirs"]
    done = billing(
        db_url,
        tmp_path,
        "drift",
        "--since",
        PERIOD["since"],
        "--until",
        PERIOD["until"],
        "--format",
        "json",
    )
    assert json.loads(done.stdout) == client.get("/v1/drift", params=PERIOD).json()


def test_import_of_a_file_of_another_shape_fails_in_one_line(
    db_url: str, tmp_path: Path, billing: Billing
) -> None:
    page = tmp_path / "costs.json"
    page.write_text(json.dumps({"object": "list", "data": []}))
    done = billing(
        db_url, tmp_path, "providers", "import", str(page), "--provider", "openai", "--kind", "cost"
    )
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"billing: {page}: report.has_more: expected a page of openai GET "
        "/v1/organization/costs: Field required (and 1 more)\n"
    )
