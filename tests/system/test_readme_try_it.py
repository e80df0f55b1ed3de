"""The README's "Try it" commands, run as written (curl through a shell, from the project's root)
against a live server: prices, the seed scenario, a reconcile pass and the call read back."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def try_it_commands() -> list[str]:
    """The shell commands of the first ``sh`` block of the README's "Try it" section, with their
    continuation lines joined."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Try it", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match is not None, "no sh block in the README's 'Try it'"
    return [line for line in match.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readme_try_it_commands_work_as_written(live_server: LiveServer) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    commands = try_it_commands()
    assert [re.findall(r"localhost:8000(\S+)", c) for c in commands] == [
        ["/v1/prices"],
        ["/v1/events"],
        ["/v1/reconcile"],
        ["/v1/calls/req-seed-1"],
    ]
    answers = []
    for command in commands:
        served = command.replace("localhost:8000", f"127.0.0.1:{live_server.port}")
        done = subprocess.run(
            ["bash", "-c", served + " -w '\\n%{http_code}'"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (command, done.stderr)
        body, _, status = done.stdout.rpartition("\n")
        assert status in ("200", "201"), (command, status, body)
        answers.append(json.loads(body))
    assert answers[1] == {"accepted": 6, "duplicates": 0}
    call = answers[3]
    assert call["settled"] is True
    assert (
        call["output_tokens_billed"],
        call["output_tokens_delivered"],
        call["output_tokens_undelivered"],
        call["cost_usd"],
    ) == (750, 380, 370, "0.011316")
