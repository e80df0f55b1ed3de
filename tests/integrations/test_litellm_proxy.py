"""End to end (issue 28) through a real LiteLLM proxy (``litellm --config``, its own process)
with ``billing.integrations.litellm.handler`` as its callback, in front of the fake upstream
that keeps generating after the client leaves: 50 concurrent streaming clients of which a third
leave early, against the real billing service (SQLite, or PostgreSQL with
``BILLING_TEST_DATABASE_URL``). Offline: LiteLLM's local cost map and bundled tokenizer.

CONTRACT "Background" and "Reconciliation": with the drain on, the callback reads the upstream
on after the disconnect (in its own task: LiteLLM cancels the client's generator, not the task),
so every call is billed the provider's final usage, what the fake generated; delivered is what
the client read, within the last chunk. With the drain off, LiteLLM's cancel reaches the
upstream: billed is what the proxy had received (less than generated), flagged
``drain_skipped`` (LiteLLM's own logged usage for such a call is its count of the cut stream,
which the callback does not send as the provider's).

Delivered, through LiteLLM, is what the proxy wrote to the client's connection before it saw
the client leave, not "what the client read within the last chunk": LiteLLM (its uvicorn
server) notices a closed connection only at a later write, a few chunks after the client's last
read (4 chunks at 20 ms apart for one client alone; up to 5 at 100 ms apart with 50 streams on
this 2-core machine), so delivered is at least what was read and less than what was generated.
With chunks 20 ms apart and 50 streams the proxy falls behind, then writes chunks in bursts into
the socket buffers, and often sees no disconnect before the stream ended (such a call shows no
disconnect at all: delivered = billed). The fake paces its chunks 100 ms apart, a model's pace.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.conftest import LiveServer, _free_port
from tests.extras import import_or_skip
from tests.fakes.upstream import FakeUpstream
from tests.gateway.harness import Billing, Read, billing_server, wait_calls

pytestmark = pytest.mark.slow

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price map fetch at import


@pytest.fixture(scope="module", autouse=True)
def _litellm_proxy_installed() -> None:
    """The extra's check, made when a test here runs rather than at collection: importing
    LiteLLM's proxy takes seconds, which every run that deselects this slow module would pay."""
    import_or_skip("litellm.proxy.proxy_server", "needs the billing[litellm] extra")


ROOT = Path(__file__).resolve().parents[2]
TOTAL = 40  # output tokens per upstream request
LEAVE_AFTER = 8  # output tokens a leaving client reads
CLIENTS = 50
PER_CHUNK = 1  # tokens per chunk (each " t", one token of cl100k_base)
DELAY_S = 0.1  # between two chunks of the fake upstream (see "Pacing" above)
MASTER_KEY = "sk-" + secrets.token_hex(24)


@contextmanager
def litellm_proxy(
    upstream: str,
    billing: Billing,
    tmp_path: Path,
    *,
    drain: bool,
    authorize: bool = False,
    fail_open: bool = True,
) -> Iterator[str]:
    """``litellm --config`` (examples/litellm_config.yaml) in its own process, in front of
    ``upstream``, posting to ``billing`` (``BILLING_AUTHORIZE=on`` with ``authorize``,
    ``BILLING_FAIL_OPEN`` as ``fail_open``); yields its base URL."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "UPSTREAM_BASE_URL": upstream + "/v1",
        "UPSTREAM_API_KEY": "fake-upstream-key",
        "BILLING_URL": billing.url,
        "BILLING_TOKEN": billing.ingest_token,
        "BILLING_DRAIN": "on" if drain else "off",
        "BILLING_AUTHORIZE": "on" if authorize else "off",
        "BILLING_FAIL_OPEN": "on" if fail_open else "off",
        "XDG_CACHE_HOME": str(tmp_path / "proxy-cache"),
    }
    # The example's config, forwarding the clients' X-Request-Id to the fake upstream (which
    # records each generation under it).
    config = yaml.safe_load((ROOT / "examples" / "litellm_config.yaml").read_text())
    config["general_settings"] = {"forward_client_headers_to_llm_api": True}
    config["model_list"].append(  # an upstream that is down: nothing listens on its port
        {
            "model_name": "down-model",
            "litellm_params": {
                "model": "openai/down-model",
                "api_base": f"http://127.0.0.1:{_free_port()}/v1",
                "api_key": "fake-upstream-key",
            },
        }
    )
    config_path = tmp_path / f"litellm-{port}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = (tmp_path / f"litellm-{port}.log").open("wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "litellm"), "--config", str(config_path),
         "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # LiteLLM imports a lot
        while True:
            assert proc.poll() is None, (tmp_path / f"litellm-{port}.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the LiteLLM proxy did not start"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _client(http: httpx.AsyncClient, url: str, rid: str, leave_after: int | None) -> Read:
    """One streaming chat completion through the proxy; counts the output tokens read (one per
    content chunk of the fake) and leaves once ``leave_after`` were read."""
    body = {
        "model": "fake-model",
        "stream": True,
        "messages": [{"role": "user", "content": "Count to forty."}],
    }
    headers = {
        "Authorization": f"Bearer {MASTER_KEY}",
        "x-litellm-call-id": rid,  # LiteLLM's call id: the call's metadata litellm_call_id
        "X-Request-Id": rid,  # forwarded: the fake upstream's record of the generation
    }
    read, left = 0, False
    async with http.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":" t"' in line.replace(": ", ":"):
                read += PER_CHUNK
                if leave_after is not None and read >= leave_after:
                    left = True
                    break
    return Read(rid, "openai.chat_completions", read, left)


def _run(url: str, tag: str) -> list[Read]:
    async def main() -> list[Read]:
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return list(
                await asyncio.gather(
                    *(
                        _client(http, url, f"ll-{tag}-{i}", LEAVE_AFTER if i % 3 == 0 else None)
                        for i in range(CLIENTS)
                    )
                )
            )

    return asyncio.run(main())


def _ids_by_litellm_id(
    billing: Billing, litellm_ids: list[str], *, timeout: float = 60.0
) -> dict[str, list[str]]:
    """The billing ``request_id`` of every call whose metadata ``litellm_call_id`` (LiteLLM's
    call id, set by the client's ``x-litellm-call-id``) is one of ``litellm_ids``, once each
    of them names a call (the call log, every page)."""
    headers = {"Authorization": f"Bearer {billing.admin_token}"}
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, list[str]] = {}
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": 200}
            if cursor is not None:
                params["cursor"] = cursor
            page = httpx.get(billing.url + "/v1/calls", params=params, headers=headers).json()
            for call in page["data"]:
                litellm_id = call["metadata"].get("litellm_call_id")
                if litellm_id in litellm_ids:
                    found.setdefault(litellm_id, []).append(call["request_id"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        if set(found) == set(litellm_ids):
            return found
        assert time.monotonic() < deadline, sorted(set(litellm_ids) - set(found))[:5]
        time.sleep(0.5)


def _billed_calls(
    billing: Billing, litellm_ids: list[str], *, timeout: float = 90.0
) -> dict[str, dict[str, Any]]:
    """The settled call of each of ``litellm_ids`` (one call each: asserted), by that id; each
    call's ``request_id`` is the callback's own (``llm-`` and 32 hex digits), never LiteLLM's."""
    ids = _ids_by_litellm_id(billing, litellm_ids)
    for litellm_id, request_ids in ids.items():
        assert len(request_ids) == 1, (litellm_id, request_ids)
        assert re.fullmatch(r"llm-[0-9a-f]{32}", request_ids[0]), request_ids
    calls = asyncio.run(wait_calls(billing, [ids[i][0] for i in litellm_ids], timeout=timeout))
    return {i: calls[ids[i][0]] for i in litellm_ids}


def test_through_litellm_billed_is_generated_and_delivered_is_read(
    db_url: str, tmp_path: Path
) -> None:
    with (
        FakeUpstream(total=TOTAL, tokens_per_chunk=PER_CHUNK, delay_s=DELAY_S) as fake,
        billing_server(db_url) as billing,
        litellm_proxy(fake.url, billing, tmp_path, drain=True) as proxy,
    ):
        reads = _run(proxy, "on")
        hello = [{"role": "user", "content": "hi"}]
        down = httpx.post(
            proxy + "/v1/chat/completions",
            json={"model": "down-model", "stream": True, "messages": hello},
            headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": "ll-down"},
            timeout=120,
        )
        fake.wait_finished([r.request_id for r in reads])
        calls = _billed_calls(billing, [r.request_id for r in reads] + ["ll-down"])
    assert down.status_code >= 500, down.text
    failed = calls["ll-down"]
    assert down.headers["x-billing-request-id"] == failed["request_id"]  # the call's own id
    assert (failed["status"], failed["error_type"]) == ("failed", "upstream_disconnect"), failed
    assert (failed["model"], failed["api_key_id"]) == ("down-model", "litellm_proxy_master_key")
    assert failed["output_tokens_billed"] == 0
    assert sum(r.left for r in reads) == 17
    for r in reads:
        call = calls[r.request_id]
        generated = fake.generated(r.request_id)
        assert generated == TOTAL, r
        assert call["output_tokens_billed"] == generated, (r, call)
        assert call["usage_source"] == "upstream", (r, call)
        assert call["input_tokens"] == 12, call
        assert call["api_key_id"] == "litellm_proxy_master_key"  # LiteLLM's name of that key
        assert call["model"] == "fake-model" and call["protocol"] == "openai.chat_completions"
        assert call["metadata"]["billing.gateway"] == "litellm"
        assert call["metadata"]["billing.drain"] == "on"
        assert call["anomalies"] == [], (r, call)
        assert call["cost_usd"] == "0.00043"  # 12 input and 40 output tokens
        if r.left:
            assert call["status"] == "client_disconnected", (r, call)
            # what the client read, plus what LiteLLM wrote before it saw the disconnect
            assert r.read <= call["output_tokens_delivered"] < generated, (r, call)
            assert call["output_tokens_undelivered"] == generated - call["output_tokens_delivered"]
        else:
            assert r.read == TOTAL
            assert call["status"] == "completed", (r, call)
            assert call["output_tokens_delivered"] == TOTAL


def test_through_litellm_without_drain_the_calls_are_flagged(db_url: str, tmp_path: Path) -> None:
    with (
        FakeUpstream(total=TOTAL, tokens_per_chunk=PER_CHUNK, delay_s=DELAY_S) as fake,
        billing_server(db_url) as billing,
        litellm_proxy(fake.url, billing, tmp_path, drain=False) as proxy,
    ):
        reads = _run(proxy, "off")
        fake.wait_finished([r.request_id for r in reads])
        calls = _billed_calls(billing, [r.request_id for r in reads])
    for r in reads:
        call = calls[r.request_id]
        generated = fake.generated(r.request_id)
        assert generated == TOTAL  # the provider generated (and bills) all of it
        assert call["metadata"]["billing.drain"] == "off"
        if r.left:
            assert call["anomalies"] == ["drain_skipped", "usage_missing"], (r, call)
            assert call["status"] == "client_disconnected"
            assert call["usage_source"] == "estimate"
            # billed what the proxy had received when LiteLLM cancelled: less than generated
            assert r.read <= call["output_tokens_billed"] < generated, (r, call)
            assert r.read <= call["output_tokens_delivered"] <= call["output_tokens_billed"]
        else:
            assert call["anomalies"] == [] and call["output_tokens_billed"] == generated
            assert call["usage_source"] == "upstream"


def _chat(proxy: str, rid: str, max_tokens: int) -> httpx.Response:
    """One streaming chat completion through the proxy with the master key, read to its end."""
    body = {
        "model": "fake-model",
        "stream": True,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Count to forty."}],
    }
    headers = {
        "Authorization": f"Bearer {MASTER_KEY}",
        "x-litellm-call-id": rid,
        "X-Request-Id": rid,  # forwarded: the fake upstream counts its requests under it
    }
    return httpx.post(proxy + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def test_through_litellm_an_over_budget_key_is_refused_before_the_upstream(
    db_url: str, tmp_path: Path
) -> None:
    key = "litellm_proxy_master_key"  # LiteLLM's name of the master key
    with (
        FakeUpstream(total=TOTAL, tokens_per_chunk=PER_CHUNK, delay_s=0.005) as fake,
        billing_server(db_url) as billing,
        litellm_proxy(fake.url, billing, tmp_path, drain=True, authorize=True) as proxy,
    ):
        admin = {"Authorization": f"Bearer {billing.admin_token}"}
        ingest = {"Authorization": f"Bearer {billing.ingest_token}"}
        budget = {"budget_id": "b_ll", "scope": {"api_key_id": key}, "limit_usd": "1"}
        made = httpx.post(
            billing.url + "/v1/budgets", json={**budget, "period": "total"}, headers=admin
        )
        assert made.status_code == 201, made.text
        over = _chat(proxy, "ll-over", 200_000)  # $2 at $10/M: over the limit
        in_flight = httpx.post(  # $0.95 of the dollar held by a call in flight
            billing.url + "/v1/authorizations",
            json={
                "request_id": "ll-in-flight",
                "api_key_id": key,
                "model": "fake-model",
                "estimate": {"amount_usd": "0.95"},
            },
            headers=ingest,
        )
        assert in_flight.json()["decision"] == "allow", in_flight.text
        busy = _chat(proxy, "ll-busy", 10_000)  # $0.10, $0.05 left
        gone = httpx.delete(billing.url + "/v1/authorizations/ll-in-flight", headers=ingest)
        assert gone.json()["state"] == "released", gone.text
        allowed = _chat(proxy, "ll-ok", 1_000)  # $0.01
        fake.fail_status = 500
        failed = _chat(proxy, "ll-fail", 1_000)
        fake.fail_status = None
        calls = _billed_calls(billing, ["ll-ok"])
        deadline = time.monotonic() + 30
        while True:  # the failed call's hold: released by the failure hooks
            status = httpx.get(billing.url + "/v1/budgets/b_ll", headers=admin).json()
            if status["held_usd"] == "0" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        (fail_id,) = _ids_by_litellm_id(billing, ["ll-fail"])["ll-fail"]  # the call's own id
        released = httpx.delete(billing.url + f"/v1/authorizations/{fail_id}", headers=ingest)
    # Refused with the proxy's budget-exceeded error, and the upstream never called.
    assert over.status_code == 402, over.text
    assert over.json()["error"] == {
        "message": "budget b_ll: estimate_exceeds_limit",
        "type": "budget_exceeded",
        "param": None,
        "code": "402",
    }
    assert busy.status_code == 429, busy.text
    assert busy.json()["error"]["type"] == "budget_exceeded"
    assert busy.json()["error"]["message"] == "budget b_ll: insufficient_headroom; retry later"
    assert 1 <= int(busy.headers["retry-after"]) <= 60
    assert (fake.requests("ll-over"), fake.requests("ll-busy")) == (0, 0)
    # Allowed: its hold became the call (12 input and 40 output tokens: $0.00043).
    assert allowed.status_code == 200 and fake.requests("ll-ok") == 1
    assert allowed.headers["x-billing-request-id"] == calls["ll-ok"]["request_id"]
    assert failed.headers["x-billing-request-id"] == fail_id  # its hold's id
    assert calls["ll-ok"]["cost_usd"] == "0.00043"
    # The failed call gave its hold back: only the allowed call is spent.
    assert failed.status_code >= 500 and fake.requests("ll-fail") >= 1
    assert released.status_code == 200 and released.json()["state"] == "released", released.text
    assert (status["held_usd"], status["settled_usd"], status["spent_usd"]) == (
        "0",
        "0.00043",
        "0.00043",
    )


#: What the scripted billing service answers an authorization, by its estimate's
#: ``max_output_tokens`` (the request's ``max_tokens``).
SCRIPTED = {
    503: ({"error": "the database is unavailable; retry after Retry-After seconds"}, 503),
    401: ({"error": "the bearer token is unknown, revoked or expired"}, 401),
    422: ({"errors": [{"index": None, "path": "body.model", "message": "bad model"}]}, 422),
}


def _scripted_billing(seen: dict[int, str]) -> FastAPI:
    """A billing service that answers each authorization as its estimate's
    ``max_output_tokens`` says (:data:`SCRIPTED`), recording its ``request_id`` in ``seen``
    under that number, and accepts any events."""
    app = FastAPI()

    @app.post("/v1/authorizations")
    async def authorize(request: Request) -> JSONResponse:
        asked = await request.json()
        limit = asked["estimate"]["max_output_tokens"]
        seen[limit] = asked["request_id"]
        body, code = SCRIPTED[limit]
        return JSONResponse(body, code, {"Retry-After": "7"} if code == 503 else None)

    @app.post("/v1/events")
    async def events(request: Request) -> JSONResponse:
        sent = (await request.json())["events"]
        return JSONResponse({"accepted": len(sent), "duplicates": 0, "results": []})

    return app


@pytest.mark.nodb
def test_through_litellm_fail_open_covers_only_an_unavailable_service(tmp_path: Path) -> None:
    """``BILLING_FAIL_OPEN=on``: a 503 lets the call through (logged); a 401 or a 422 from the
    service is a misconfiguration, refused with the proxy's 500 (logged at ERROR with the
    service's answer), the upstream never called. ``off`` with no service listening: refused
    (503), the upstream never called."""
    nowhere = Billing(f"http://127.0.0.1:{_free_port()}", "ingest-token", "")
    seen: dict[int, str] = {}  # the authorizations' request ids, by max_output_tokens
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    with (
        FakeUpstream(total=TOTAL, tokens_per_chunk=PER_CHUNK, delay_s=0.005) as fake,
        LiveServer(_scripted_billing(seen)) as scripted,
    ):
        service = Billing(scripted.url, "ingest-token", "")
        with litellm_proxy(
            fake.url, service, tmp_path / "open", drain=True, authorize=True
        ) as proxy:
            unavailable = _chat(proxy, "ll-fo-503", 503)
            bad_token = _chat(proxy, "ll-fo-401", 401)
            bad_body = _chat(proxy, "ll-fo-422", 422)
        opened_log = _proxy_log(tmp_path / "open")
        with litellm_proxy(
            fake.url, nowhere, tmp_path / "closed", drain=True, authorize=True, fail_open=False
        ) as proxy:
            unreachable = _chat(proxy, "ll-fc-none", 100)
        closed_log = _proxy_log(tmp_path / "closed")
    # each authorization under the call's own id, never the client's x-litellm-call-id
    assert sorted(seen) == [401, 422, 503]
    assert all(re.fullmatch(r"llm-[0-9a-f]{32}", rid) for rid in seen.values()), seen
    assert len(set(seen.values())) == 3
    assert unavailable.status_code == 200, unavailable.text
    assert fake.requests("ll-fo-503") == 1
    assert f"authorization of {seen[503]} unavailable (authorization: HTTP 503" in opened_log
    for refused, status in ((bad_token, "401"), (bad_body, "422")):
        assert refused.status_code == 500, refused.text
        assert refused.json()["error"] == {
            "message": "the billing service refused the gateway's authorization request "
            f"(HTTP {status}); see the gateway's log",
            "type": "internal_server_error",
            "param": None,
            "code": "500",
        }
        assert fake.requests(f"ll-fo-{status}") == 0
    assert (
        f"authorization of {seen[401]} rejected (authorization: HTTP 401: the bearer token is "
        'unknown, revoked or expired); the service answered {"error": "the bearer token is '
        'unknown, revoked or expired"}: refusing the call'
    ) in opened_log
    assert (
        f"authorization of {seen[422]} rejected (authorization: HTTP 422); the service answered "
        '{"errors": [{"index": null, "path": "body.model", "message": "bad model"}]}'
    ) in opened_log
    assert unreachable.status_code == 503, unreachable.text
    assert unreachable.json()["error"]["message"] == (
        "the billing service cannot authorize the call now"
    )
    assert fake.requests("ll-fc-none") == 0
    assert re.search(
        r"authorization of llm-[0-9a-f]{32} unavailable \(authorization: no answer", closed_log
    ), closed_log[-2000:]


def _proxy_log(directory: Path) -> str:
    """The text the proxy of ``directory`` wrote (stdout and stderr)."""
    return "\n".join(path.read_text(errors="replace") for path in directory.glob("litellm-*.log"))


def test_through_litellm_one_client_call_id_is_never_one_billed_call(
    db_url: str, tmp_path: Path
) -> None:
    """Four requests, streamed and not, all with the client's ``x-litellm-call-id: ll-same``
    (LiteLLM takes it as its ``litellm_call_id``): four calls, each billed its own upstream
    usage under an id of the callback's own, LiteLLM's id kept as the metadata
    ``litellm_call_id``. Were the calls keyed on LiteLLM's id, the events being idempotent by
    ``request_id``, they would make one call billed once."""
    totals = {"same-s1": (True, 30), "same-s2": (True, 12), "same-w1": (False, 20)}
    totals["same-w2"] = (False, 8)
    with (
        FakeUpstream(total=TOTAL, tokens_per_chunk=PER_CHUNK, delay_s=0.005) as fake,
        billing_server(db_url) as billing,
        litellm_proxy(fake.url, billing, tmp_path, drain=True) as proxy,
    ):
        answers = {}
        for upstream_id, (stream, total) in totals.items():
            answers[upstream_id] = httpx.post(
                proxy + "/v1/chat/completions",
                json={"model": "fake-model", "stream": stream, "messages": [{"role": "user",
                      "content": "Count to forty."}]},
                headers={
                    "Authorization": f"Bearer {MASTER_KEY}",
                    "x-litellm-call-id": "ll-same",  # the client's choice, four times
                    "X-Request-Id": upstream_id,  # forwarded: the fake's record
                    "X-Fake-Total": str(total),  # forwarded: what the fake generates
                },
                timeout=120,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:  # the four calls, once each has its usage
            ids = _ids_by_litellm_id(billing, ["ll-same"])["ll-same"]
            if len(ids) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        calls = asyncio.run(wait_calls(billing, ids, timeout=90))
    assert {k: a.status_code for k, a in answers.items()} == dict.fromkeys(totals, 200)
    assert answers["same-w1"].json()["choices"][0]["message"]["content"] == " t" * 20
    assert {k: fake.generated(k) for k in totals} == {k: t for k, (_, t) in totals.items()}
    assert len(ids) == 4 and len(set(ids)) == 4, ids
    assert all(re.fullmatch(r"llm-[0-9a-f]{32}", rid) for rid in ids), ids
    # each answer names its own call (x-billing-request-id), LiteLLM's id is the client's
    named = {k: a.headers["x-billing-request-id"] for k, a in answers.items()}
    assert sorted(named.values()) == sorted(ids)
    assert {a.headers["x-litellm-call-id"] for a in answers.values()} == {"ll-same"}
    for upstream_id, (_, total) in totals.items():
        assert calls[named[upstream_id]]["output_tokens_billed"] == total, upstream_id
    billed = sorted(
        (
            c["output_tokens_billed"],
            c["output_tokens_delivered"],
            c["input_tokens"],
            c["cost_usd"],
            c["status"],
            c["usage_source"],
            c["metadata"]["litellm_call_id"],
            c["anomalies"],
        )
        for c in calls.values()
    )
    assert billed == [  # 12 input tokens at $2.50/M, output at $10/M
        (8, 8, 12, "0.00011", "completed", "upstream", "ll-same", []),
        (12, 12, 12, "0.00015", "completed", "upstream", "ll-same", []),
        (20, 20, 12, "0.00023", "completed", "upstream", "ll-same", []),
        (30, 30, 12, "0.00033", "completed", "upstream", "ll-same", []),
    ]
