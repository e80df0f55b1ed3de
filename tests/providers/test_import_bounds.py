"""Issue 44: ``billing providers import`` reads no file whole: a device (``/dev/zero`` reached
6 GB), a FIFO, a directory or a file over ``MAX_REPORT_BYTES`` is refused in one line at once,
with nothing stored and the process's memory unchanged; a page within the bound is imported."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from billing.providers.schemas import MAX_REPORT_BYTES
from tests.cli_runs import run_billing, text


def _import(way: str, db_url: str, tmp_path: Path, file: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_")}
    env["BILLING_DATABASE_URL"] = db_url
    args = ["providers", "import", file, "--provider", "openai", "--kind", "usage"]
    return text(run_billing(way, args, env, tmp_path, 60))


def _sparse(tmp_path: Path, size: int) -> str:
    path = tmp_path / f"sparse-{size}.json"
    with open(path, "wb") as handle:
        handle.truncate(size)
    return str(path)


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "page.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "over the bound"])
def test_an_unbounded_file_is_refused_without_reading_it(
    cli_way: str, db_url: str, tmp_path: Path, kind: str
) -> None:
    file = {
        "device": lambda: "/dev/zero",
        "fifo": lambda: _fifo(tmp_path),
        "directory": lambda: str(tmp_path),
        "over the bound": lambda: _sparse(tmp_path, MAX_REPORT_BYTES + 1),
    }[kind]()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    done = _import(cli_way, db_url, tmp_path, file)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"billing: cannot read {file}:"), line
    assert grown_kb < 50 * 1024
    assert "Traceback" not in done.stderr


def test_a_page_within_the_bound_is_imported(cli_way: str, db_url: str, tmp_path: Path) -> None:
    page = tmp_path / "page.json"
    page.write_text('{"object": "page", "data": [], "has_more": false, "next_page": null}')
    done = _import(cli_way, db_url, tmp_path, str(page))
    assert done.returncode == 0, done.stderr
