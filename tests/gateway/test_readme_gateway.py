"""The README's "Integrate a gateway" app, run as written: at most 15 lines of billing code, and
served by uvicorn in its own process in front of the fake upstream, it bills a call the
provider's count, also when the client left early or did not stream, and refuses a call it
could not bill before the upstream sees it."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import _free_port
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import ROOT, billing_server, client_call, serving, wait_calls

#: Names that are billing code in the snippet: the imports from billing and what they make.
BILLING_NAMES = {"AsyncBillingClient", "Meters", "billing", "meters", "meter"}


def readme_gateway() -> str:
    """The first Python block of the README's "Integrate a gateway" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Integrate a gateway\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block in the README's 'Integrate a gateway'"
    return match.group(1)


def billing_lines(source: str) -> set[int]:
    """Lines of the statements that name billing code (imports from ``billing`` included)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt) or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef
        ):
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("billing"):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if names & BILLING_NAMES:
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_the_readme_gateway_has_at_most_15_billing_lines() -> None:
    lines = billing_lines(readme_gateway())
    assert 6 <= len(lines) <= 15, sorted(lines)


@pytest.mark.slow  # a gateway process
def test_the_readme_gateway_runs_as_written(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "readme_gateway.py").write_text(readme_gateway())
    port = _free_port()
    with (
        FakeUpstream(total=30, delay_s=0.05, input_tokens=7) as fake,
        billing_server(db_url) as billing,
    ):
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
            "BILLING_URL": billing.url,
            "BILLING_TOKEN": billing.ingest_token,
            "UPSTREAM_URL": fake.url,
        }
        args = [sys.executable, "-m", "uvicorn", "readme_gateway:app", "--port", str(port)]
        with serving(args, env, port) as url:

            async def run() -> list:
                async with httpx.AsyncClient(timeout=30) as http:
                    return list(
                        await asyncio.gather(
                            client_call(http, url, "openai.chat_completions", key="key_a"),
                            client_call(
                                http, url, "openai.chat_completions", key="key_b", leave_after=4
                            ),
                        )
                    )

            full, left = asyncio.run(run())
            chat = url + "/v1/chat/completions"
            body = {"model": "fake-model", "messages": []}
            refused = httpx.post(chat, json=body, headers={"X-Request-Id": "readme-no-key"})
            assert refused.status_code == 400
            whole = httpx.post(
                chat, json=body, headers={"X-Api-Key-Id": "key_c", "X-Request-Id": "readme-whole"}
            )
            assert whole.status_code == 200 and whole.headers["x-request-id"] == "readme-whole"
            assert whole.json()["usage"]["completion_tokens"] == 30
            assert sorted(fake.records) == sorted(
                [full.request_id, left.request_id, "readme-whole"]
            )
            fake.wait_finished([full.request_id, left.request_id])
            ids = [full.request_id, left.request_id, "readme-whole"]
            calls = asyncio.run(wait_calls(billing, ids))
    for read in (full, left):
        call = calls[read.request_id]
        assert call["output_tokens_billed"] == 30 and call["input_tokens"] == 7
        assert call["usage_source"] == "upstream" and call["metadata"]["billing.drain"] == "on"
    assert calls[full.request_id]["status"] == "completed"
    assert calls[full.request_id]["output_tokens_delivered"] == 30 == full.read
    assert calls[left.request_id]["api_key_id"] == "key_b"
    assert calls[left.request_id]["status"] == "client_disconnected"
    assert (calls["readme-whole"]["status"], calls["readme-whole"]["output_tokens_delivered"]) == (
        "completed",
        30,
    )
    assert left.read <= calls[left.request_id]["output_tokens_delivered"] <= left.read + 1
