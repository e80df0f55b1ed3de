"""The README's "Integrate a gateway" app, run as written: at most 15 lines of billing code, and
served by uvicorn in its own process in front of the fake upstream, it bills a call the
provider's count, also when the client left early or did not stream, and refuses a call it
could not bill before the upstream sees it; and it enforces a $1 budget (its
``authorize=True``): a denied call never reaches the upstream, an allowed call's hold becomes
the call, an upstream that fails before a byte gives the hold back."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _free_port
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import (
    ROOT,
    Billing,
    billing_server,
    client_call,
    serving,
    wait_calls,
)

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


@contextmanager
def readme_app(tmp_path: Path, billing: Billing, upstream: str) -> Iterator[str]:
    """The README's app, as written, served by uvicorn in its own process; yields its URL."""
    (tmp_path / "readme_gateway.py").write_text(readme_gateway())
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
        "BILLING_URL": billing.url,
        "BILLING_TOKEN": billing.ingest_token,
        "UPSTREAM_URL": upstream,
    }
    args = [sys.executable, "-m", "uvicorn", "readme_gateway:app", "--port", str(port)]
    with serving(args, env, port) as url:
        yield url


@pytest.mark.slow  # a gateway process
def test_the_readme_gateway_runs_as_written(db_url: str, tmp_path: Path) -> None:
    with (
        FakeUpstream(total=30, delay_s=0.05, input_tokens=7) as fake,
        billing_server(db_url) as billing,
        readme_app(tmp_path, billing, fake.url) as url,
    ):

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
        whole_id = whole.headers["x-request-id"]  # the call's id: the gateway's, not the client's
        assert whole.status_code == 200 and re.fullmatch("gw-[0-9a-f]{32}", whole_id)
        assert whole.json()["usage"]["completion_tokens"] == 30
        assert sorted(fake.records) == sorted([full.request_id, left.request_id, whole_id])
        fake.wait_finished([full.request_id, left.request_id])
        ids = [full.request_id, left.request_id, whole_id]
        calls = asyncio.run(wait_calls(billing, ids))
    for read in (full, left):
        call = calls[read.request_id]
        assert call["output_tokens_billed"] == 30 and call["input_tokens"] == 7
        assert call["usage_source"] == "upstream" and call["metadata"]["billing.drain"] == "on"
    assert calls[full.request_id]["status"] == "completed"
    assert calls[full.request_id]["output_tokens_delivered"] == 30 == full.read
    assert calls[left.request_id]["api_key_id"] == "key_b"
    assert calls[left.request_id]["status"] == "client_disconnected"
    assert (calls[whole_id]["status"], calls[whole_id]["output_tokens_delivered"]) == (
        "completed",
        30,
    )
    assert calls[whole_id]["metadata"]["client_request_id"] == "readme-whole"
    assert "client_request_id" not in calls[full.request_id]["metadata"]
    assert left.read <= calls[left.request_id]["output_tokens_delivered"] <= left.read + 1


def _chat(url: str, rid: str, key: str, max_tokens: int) -> httpx.Response:
    """One streaming chat completion through the gateway, read to its end (``rid``: the
    client's X-Request-Id; the call's id is the response's)."""
    body = {"model": "fake-model", "stream": True, "messages": [], "max_tokens": max_tokens}
    headers = {"X-Request-Id": rid, "X-Api-Key-Id": key}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _budget(billing: Billing, key: str) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {billing.admin_token}"}
    answer = httpx.get(f"{billing.url}/v1/budgets/b_{key}", headers=admin, timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


@pytest.mark.slow  # a gateway process
def test_the_readme_gateway_enforces_a_budget(db_url: str, tmp_path: Path) -> None:
    keys = ("key_over", "key_busy", "key_ok", "key_fail")
    with (
        FakeUpstream(total=30, delay_s=0.01, input_tokens=7) as fake,
        billing_server(db_url) as billing,
    ):
        admin = {"Authorization": f"Bearer {billing.admin_token}"}
        for key in keys:  # $1 each, over all time
            budget = {"budget_id": f"b_{key}", "scope": {"api_key_id": key}, "limit_usd": "1"}
            made = httpx.post(
                billing.url + "/v1/budgets", json={**budget, "period": "total"}, headers=admin
            )
            assert made.status_code == 201, made.text
        in_flight = httpx.post(  # $0.95 of key_busy's dollar held by a call in flight
            billing.url + "/v1/authorizations",
            json={
                "request_id": "in-flight",
                "api_key_id": "key_busy",
                "model": "fake-model",
                "estimate": {"amount_usd": "0.95"},
            },
            headers={"Authorization": f"Bearer {billing.ingest_token}"},
        )
        assert in_flight.json()["decision"] == "allow", in_flight.text
        with readme_app(tmp_path, billing, fake.url) as url:
            over = _chat(url, "rg-over", "key_over", 200_000)  # $2 at $10/M: over the limit
            busy = _chat(url, "rg-busy", "key_busy", 10_000)  # $0.10, $0.05 left
            allowed = _chat(url, "rg-ok", "key_ok", 1_000)  # $0.01
            fake.fail_status = 503
            failed = _chat(url, "rg-fail", "key_fail", 1_000)
            fake.fail_status = None
            held_during = _budget(billing, "key_busy")["held_usd"]
            ok_id, fail_id = allowed.headers["x-request-id"], failed.headers["x-request-id"]
            calls = asyncio.run(wait_calls(billing, [ok_id, fail_id]))
            budgets = {key: _budget(billing, key) for key in keys}
            again = httpx.delete(
                billing.url + f"/v1/authorizations/{fail_id}",
                headers={"Authorization": f"Bearer {billing.ingest_token}"},
            )
    # Denied: in OpenAI's error shape, and the upstream never called.
    assert over.status_code == 402, over.text
    message = "budget b_key_over: estimate_exceeds_limit"
    kind, code = "insufficient_quota", "estimate_exceeds_limit"
    assert over.json() == {"error": {"message": message, "type": kind, "param": None, "code": code}}
    assert "retry-after" not in over.headers
    assert busy.status_code == 429, busy.text
    message = "budget b_key_busy: insufficient_headroom; retry later"
    kind, code = "rate_limit_exceeded", "insufficient_headroom"
    assert busy.json() == {"error": {"message": message, "type": kind, "param": None, "code": code}}
    assert 1 <= int(busy.headers["retry-after"]) <= 60
    over_id, busy_id = over.headers["x-request-id"], busy.headers["x-request-id"]
    assert len({over_id, busy_id, ok_id, fail_id} - {"rg-over", "rg-busy", "rg-ok", "rg-fail"}) == 4
    assert sorted(fake.records) == sorted([ok_id, fail_id])  # never called for the refused
    assert held_during == "0.95"  # the refused call held nothing
    # Allowed: streamed, and its hold ($0.01) became the call: 7 input, 30 output tokens.
    assert allowed.status_code == 200 and fake.requests(ok_id) == 1
    assert calls[ok_id]["cost_usd"] == "0.0003175"
    assert calls[ok_id]["metadata"]["client_request_id"] == "rg-ok"
    ok = budgets["key_ok"]
    assert (ok["settled_usd"], ok["held_usd"], ok["spent_usd"]) == ("0.0003175", "0", "0.0003175")
    # The upstream failed before a byte: its error passed on (and metered), the hold released.
    assert calls[fail_id]["status"] == "failed", calls[fail_id]
    assert fail_id.startswith("gw-")
    assert failed.status_code == 503 and fake.requests(fail_id) == 1
    assert failed.json()["error"]["message"] == "the fake upstream fails"
    assert (budgets["key_fail"]["held_usd"], budgets["key_fail"]["spent_usd"]) == ("0", "0")
    assert again.status_code == 200 and again.json()["state"] == "released", again.text
    assert budgets["key_over"]["spent_usd"] == "0"


@pytest.mark.slow  # a gateway process
def test_the_readme_gateway_names_calls_itself_and_refuses_bad_bodies(
    db_url: str, tmp_path: Path
) -> None:
    """A client that reuses one X-Request-Id gets two calls, each billed its own usage (the
    client's id only as metadata); a body that is not a JSON object, a ``model`` not a string,
    a ``stream`` not a boolean or a key id of 300 characters is a 400 in OpenAI's shape, with
    no upstream request; the client's stream_options go upstream beside include_usage, and a
    client that did not ask for usage gets no usage chunk."""
    with (
        FakeUpstream(total=30, delay_s=0.0, input_tokens=7) as fake,
        billing_server(db_url) as billing,
        readme_app(tmp_path, billing, fake.url) as url,
    ):
        chat = url + "/v1/chat/completions"
        headers = {"X-Api-Key-Id": "key_same", "X-Request-Id": "same-id"}
        answers = []
        for total in (30, 12):  # the same client id twice: two generations upstream
            body = {
                "model": "fake-model",
                "stream": True,
                "messages": [],
                "stream_options": {"include_obfuscation": False},
                "x_fake": {"total": total},
            }
            answers.append(httpx.post(chat, json=body, headers=headers, timeout=30))
        first, second = (a.headers["x-request-id"] for a in answers)
        assert [a.status_code for a in answers] == [200, 200]
        assert first != second and first.startswith("gw-") and second.startswith("gw-")
        assert sorted(fake.records) == sorted([first, second])
        sent = [fake.records[rid][0].body["stream_options"] for rid in (first, second)]
        assert sent == [{"include_obfuscation": False, "include_usage": True}] * 2
        for answer in answers:  # the client did not ask for usage: no chunk with usage
            frames = [f for f in answer.text.split("\n\n") if f.startswith("data: {")]
            assert frames and all('"usage"' not in f for f in frames), answer.text
        calls = asyncio.run(wait_calls(billing, [first, second]))

        not_json = httpx.post(
            chat, content=b"{not json", headers={"X-Api-Key-Id": "key_same"}, timeout=10
        )
        a_list = httpx.post(chat, json=[1], headers={"X-Api-Key-Id": "key_same"}, timeout=10)
        bad_options = httpx.post(
            chat,
            json={"model": "fake-model", "stream": True, "stream_options": "yes"},
            headers={"X-Api-Key-Id": "key_same"},
            timeout=10,
        )
        key = {"X-Api-Key-Id": "key_same"}
        model_5 = httpx.post(chat, json={"model": 5, "stream": True}, headers=key, timeout=10)
        stream_text = httpx.post(
            chat, json={"model": "fake-model", "stream": "true"}, headers=key, timeout=10
        )
        long_key = httpx.post(
            chat,
            json={"model": "fake-model", "stream": True},
            headers={"X-Api-Key-Id": "k" * 300},
            timeout=10,
        )
        upstream_requests = len(fake.records)
    for rid, total, cost in ((first, 30, "0.0003175"), (second, 12, "0.0001375")):
        call = calls[rid]
        assert (call["status"], call["usage_source"]) == ("completed", "upstream"), call
        assert (call["input_tokens"], call["output_tokens_billed"]) == (7, total)
        assert call["cost_usd"] == cost
        assert call["metadata"]["client_request_id"] == "same-id"
    assert not_json.status_code == 400
    message = "the body is not JSON"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    assert not_json.json() == {"error": error}
    message = "the body must be an object, its stream_options too"
    for refused in (a_list, bad_options):
        assert refused.status_code == 400
        assert refused.json() == {"error": {**error, "message": message}}
    required = "X-Api-Key-Id and model are required"
    assert model_5.status_code == 400
    assert model_5.json() == {"error": {**error, "message": required}}
    assert stream_text.status_code == 400
    assert stream_text.json() == {"error": {**error, "message": "stream must be true or false"}}
    assert long_key.status_code == 400  # the meter's own refusal: stream.started's rule
    assert long_key.json() == {
        "error": {
            "message": "api_key_id is too long: at most 128 characters",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
    assert upstream_requests == 2
