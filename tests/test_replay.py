"""``billing replay`` and :func:`billing.replay.replay` against a running service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from billing.replay import ReplayError, replay
from billing.taps import open_tap
from tests.client.test_client import ROOT, ServeProcess
from tests.conftest import LiveServer, _free_port

pytestmark = pytest.mark.slow

SSE = Path(__file__).parent / "fixtures" / "sse"
SEEDS = sorted(SSE.glob("seed_*.sse"))
REAL = sorted((SSE / "real").glob("*.sse"))
EXPECTED = {
    **json.loads((SSE / "expected.json").read_text()),
    **json.loads((SSE / "real" / "expected.json").read_text()),
}
FILE_01 = SSE / "real" / "01_chat_gpt4o_text_usage.sse"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("BILLING_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-c", "from billing.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[ServeProcess]:
    with ServeProcess(db_url, tmp_path) as process:
        process.start()
        yield process


def settle_and_get(http: httpx.Client, request_id: str) -> dict[str, Any]:
    assert http.post("/v1/reconcile", json={}).status_code == 200
    answer = http.get(f"/v1/calls/{request_id}")
    assert answer.status_code == 200, answer.text
    call: dict[str, Any] = answer.json()
    return call


# -- the command line ----------------------------------------------------------------------------


def test_cli_replay_with_a_disconnect_bills_what_was_generated(serve: ServeProcess) -> None:
    """The client left after 10 of the 30 output tokens: delivered 10, billed 30, undelivered 20."""
    done = run_cli(
        "replay",
        str(FILE_01.relative_to(ROOT)),
        "--protocol",
        "openai.chat_completions",
        "--api-key-id",
        "key_x",
        "--disconnect-after",
        "10",
        "--url",
        serve.url,
    )
    assert done.returncode == 0, done.stderr
    request_id, _, rest = done.stdout.partition("\n")
    assert request_id.startswith("replay-") and len(request_id) == len("replay-") + 32
    call = json.loads(rest)
    assert call["request_id"] == request_id
    assert call["output_tokens_delivered"] == 10
    assert call["output_tokens_billed"] == 30
    assert call["output_tokens_undelivered"] == 20
    assert call["input_tokens"] == 14
    assert call["settled"] is True
    assert call["status"] == "client_disconnected"
    assert call["usage_source"] == "upstream"
    assert call["api_key_id"] == "key_x"
    assert call["model"] == "gpt-4o-2024-08-06"  # as the stream reports it
    assert call["protocol"] == "openai.chat_completions"
    types = [event["type"] for event in call["events"]]
    assert types[0] == "stream.started" and types.count("stream.client_disconnected") == 1
    assert types[-1] == "stream.usage"


def test_cli_replay_options(serve: ServeProcess) -> None:
    done = run_cli(
        "replay",
        str(SSE / "seed_anthropic.sse"),
        "--protocol",
        "anthropic.messages",
        "--api-key-id",
        "key_y",
        "--model",
        "claude-custom",
        "--request-id",
        "req-cli-1",
        "--url",
        serve.url + "/",
    )
    assert done.returncode == 0, done.stderr
    request_id, _, rest = done.stdout.partition("\n")
    assert request_id == "req-cli-1"
    call = json.loads(rest)
    assert (call["model"], call["api_key_id"], call["status"]) == (
        "claude-custom",
        "key_y",
        "completed",
    )
    assert (call["output_tokens_billed"], call["output_tokens_delivered"]) == (14, 14)


@pytest.mark.nodb
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["/nonexistent/x.sse", "--protocol", "openai.chat_completions"], "cannot read"),
        ([str(FILE_01), "--protocol", "openai.completions"], "unknown protocol"),
        ([str(FILE_01), "--protocol", "openai.chat_completions"], "cannot reach"),
    ],
    ids=["missing-file", "unknown-protocol", "unreachable"],
)
def test_cli_replay_errors_are_one_clear_line(args: list[str], expected: str) -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    done = run_cli("replay", *args, "--api-key-id", "key_x", "--url", url)
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("billing: ") and expected in lines[0]


# -- replay(): the events it posts ---------------------------------------------------------------


def test_replay_events_with_a_disconnect(live_server: LiveServer, http: httpx.Client) -> None:
    request_id, events = replay(
        FILE_01,
        protocol="openai.chat_completions",
        api_key_id="key_x",
        url=live_server.url,
        request_id="req-ev-1",
        disconnect_after=10,
    )
    assert request_id == "req-ev-1"
    assert all(event["request_id"] == "req-ev-1" for event in events)
    assert len({event["event_id"] for event in events}) == len(events)
    stamps = [event["occurred_at"] for event in events]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert all(stamp.endswith("Z") for stamp in stamps)
    types = [event["type"] for event in events]
    assert types[0] == "stream.started" and types[-1] == "stream.usage"
    assert 4 <= len(events) <= 8  # a handful
    assert events[0]["model"] == "gpt-4o-2024-08-06" and events[0]["api_key_id"] == "key_x"
    gone = types.index("stream.client_disconnected")
    assert events[gone]["output_tokens_delivered"] == 10
    assert events[gone]["output_tokens_generated"] >= 10
    progress = [e for e in events if e["type"] == "stream.tokens"]
    assert all(e["output_tokens_delivered"] <= 10 for e in progress)
    after = [e for e in events[gone:] if e["type"] == "stream.tokens"]
    assert after and after[-1] == {**after[-1], "output_tokens_delivered": 10}
    assert after[-1]["output_tokens_generated"] == 30
    usage = events[-1]
    assert (usage["source"], usage["output_tokens"], usage["input_tokens"]) == ("upstream", 30, 14)
    # and the service stored exactly these
    call = settle_and_get(http, request_id)
    assert sorted(e["event_id"] for e in call["events"]) == sorted(e["event_id"] for e in events)


def test_replay_without_a_disconnect_delivers_everything(
    live_server: LiveServer, http: httpx.Client
) -> None:
    request_id, events = replay(
        FILE_01, protocol="openai.chat_completions", api_key_id="k", url=live_server.url
    )
    assert request_id.startswith("replay-")
    assert "stream.client_disconnected" not in [e["type"] for e in events]
    progress = [e for e in events if e["type"] == "stream.tokens"]
    assert all(e["output_tokens_delivered"] == e["output_tokens_generated"] for e in progress)
    assert progress[-1]["output_tokens_delivered"] == 30
    call = settle_and_get(http, request_id)
    assert (call["status"], call["output_tokens_undelivered"]) == ("completed", 0)


def test_a_long_stream_stays_a_handful_of_events(
    live_server: LiveServer, http: httpx.Client
) -> None:
    path = SSE / "real" / "12_responses_gpt5_reasoning_toolcall.sse"
    request_id, events = replay(
        path,
        protocol="openai.responses",
        api_key_id="k",
        url=live_server.url,
        disconnect_after=100,
    )
    assert len(events) <= 14
    call = settle_and_get(http, request_id)
    assert (call["output_tokens_billed"], call["output_tokens_delivered"]) == (469, 100)
    assert (call["output_tokens_undelivered"], call["reasoning_tokens"]) == (369, 448)


def test_replay_errors_before_posting(live_server: LiveServer) -> None:
    with pytest.raises(ReplayError, match="unknown protocol"):
        replay(FILE_01, protocol="nope", api_key_id="k", url=live_server.url)
    with pytest.raises(ReplayError, match="cannot read"):
        replay(SSE / "missing.sse", protocol="openai.responses", api_key_id="k")
    with pytest.raises(ReplayError, match="disconnect-after"):
        replay(FILE_01, protocol="openai.chat_completions", api_key_id="k", disconnect_after=-1)


def test_replay_rejected_events_are_a_clear_error(live_server: LiveServer) -> None:
    with pytest.raises(ReplayError, match="rejected"):
        replay(
            FILE_01,
            protocol="openai.chat_completions",
            api_key_id="k" * 129,
            url=live_server.url,
        )


# -- every fixture -------------------------------------------------------------------------------


def _tap_count(path: Path, protocol: str) -> int:
    tap = open_tap(protocol)
    tap.feed(path.read_bytes())
    tap.close()
    return tap.output_tokens


@pytest.mark.parametrize("path", SEEDS + REAL, ids=lambda p: p.name)
def test_replayed_fixture_bills_the_expected_usage(
    path: Path, live_server: LiveServer, http: httpx.Client
) -> None:
    """Each recorded stream, replayed, gives a call whose billed figures are the ones in
    expected.json (a stream without usage: an open call billed on the tap's estimate)."""
    expected = EXPECTED[path.name]
    request_id, events = replay(
        path, protocol=expected["protocol"], api_key_id="key_fx", url=live_server.url
    )
    call = settle_and_get(http, request_id)
    usage = expected["usage"]
    error = expected["error"]
    # the v2 dimensions the tap read, as the service stored them (CONTRACT "Usage dimensions")
    (stored,) = [e for e in call["events"] if e["type"] == "stream.usage"]
    assert stored.get("service_tier") == expected.get("service_tier")
    assert stored.get("units", {}) == expected.get("units", {})
    assert stored.get("other_models", []) == expected.get("other_models", [])
    assert stored.get("anomalies", []) == expected.get("anomalies", [])
    assert ("stream.failed" in [e["type"] for e in events]) is (error is not None)
    if usage is not None:
        # v3: the call's top-level figures are those billed at its own model; its other
        # models' tokens appear only under other_models (CONTRACT "Non-streaming calls,
        # hosted-tool fees, provider-reported cost (v3)"), each with a ledger line of its own
        others = expected.get("other_models", [])

        def total(key: str) -> int:
            return int(usage[key])

        assert call["settled"] is True
        assert call["usage_source"] == "upstream"
        assert call["output_tokens_billed"] == total("output_tokens")
        # delivered and undelivered are the call's own model's output (an other model's output
        # is never streamed to the client)
        assert call["output_tokens_delivered"] == usage["output_tokens"]
        assert call["output_tokens_undelivered"] == 0
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            assert call[key] == total(key), key
        assert call["reasoning_tokens"] == usage["reasoning_tokens"]
        assert len(call["ledger_entries"]) == 1 + len(others) or call["cost_usd"] is None
        assert call["stop_reason"] == expected["stop_reason"]
        if error is None:
            assert call["status"] == "completed"
        else:
            assert (call["status"], call["error_type"]) == ("failed", error["type"])
    else:
        # no upstream usage: the call waits for settle_after and bills the tap's estimate
        assert call["settled"] is False
        count = _tap_count(path, expected["protocol"])
        assert call["output_tokens_billed"] == count
        assert call["output_tokens_delivered"] == count
        reported = expected.get("input_reported")
        if reported is not None:
            assert call["input_tokens"] == reported["input_tokens"]


# -- v2 usage dimensions end to end --------------------------------------------------------------

NO_USAGE = SSE / "real" / "03_chat_gpt35_toolcalls_no_usage.sse"


def test_an_estimate_without_input_bills_the_gateways_input_count(
    live_server: LiveServer, http: httpx.Client
) -> None:
    """A stream that ends without usage: the tap's estimate leaves the input out, and the
    gateway's own count (``stream.started.input_tokens``) is billed, never 0."""
    request_id, events = replay(
        NO_USAGE,
        protocol="openai.chat_completions",
        api_key_id="k",
        url=live_server.url,
        input_tokens=500,
    )
    assert events[0]["input_tokens"] == 500
    assert events[-1]["source"] == "estimate" and "input_tokens" not in events[-1]
    call = settle_and_get(http, request_id)
    assert call["input_tokens"] == 500
    assert "input_unknown" not in call["anomalies"]
    # without the gateway's count the input is not known: 0, and said so
    request_id, events = replay(
        NO_USAGE, protocol="openai.chat_completions", api_key_id="k", url=live_server.url
    )
    assert "input_tokens" not in events[0]
    call = settle_and_get(http, request_id)
    assert call["input_tokens"] == 0
    assert "input_unknown" in call["anomalies"]


def test_cli_replay_input_tokens(serve: ServeProcess) -> None:
    done = run_cli(
        "replay",
        str(NO_USAGE),
        "--protocol",
        "openai.chat_completions",
        "--api-key-id",
        "key_in",
        "--input-tokens",
        "321",
        "--url",
        serve.url,
    )
    assert done.returncode == 0, done.stderr
    call = json.loads(done.stdout.partition("\n")[2])
    assert call["input_tokens"] == 321
    assert call["events"][0]["input_tokens"] == 321
    bad = run_cli(
        "replay",
        str(NO_USAGE),
        "--protocol",
        "openai.chat_completions",
        "--api-key-id",
        "key_in",
        "--input-tokens",
        "-1",
        "--url",
        serve.url,
    )
    assert bad.returncode != 0 and "--input-tokens" in bad.stderr


def _chat(usage: dict[str, Any]) -> str:
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": "gpt-x", "choices": choices}
        for choices in (
            [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
            [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        )
    ]
    chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("usage", "billed"),
    [
        (
            {
                "prompt_tokens": 300,
                "completion_tokens": 12,
                "prompt_tokens_details": {"cached_tokens": 450},
            },
            {"input_tokens": 0, "cache_read_input_tokens": 300, "output_tokens_billed": 12},
        ),
        (
            {"prompt_tokens": 300, "completion_tokens": -12},
            {"input_tokens": 300, "cache_read_input_tokens": 0, "output_tokens_billed": 0},
        ),
    ],
    ids=["cached-above-prompt", "negative-output"],
)
def test_contradictory_upstream_figures_are_billed_as_far_as_valid_and_flagged(
    usage: dict[str, Any],
    billed: dict[str, int],
    tmp_path: Path,
    live_server: LiveServer,
    http: httpx.Client,
) -> None:
    path = tmp_path / "contradictory.sse"
    path.write_text(_chat(usage))
    request_id, events = replay(
        path, protocol="openai.chat_completions", api_key_id="k", url=live_server.url
    )
    assert events[-1]["source"] == "upstream"
    assert events[-1]["anomalies"] == ["usage_inconsistent"]
    call = settle_and_get(http, request_id)
    assert call["settled"] is True and call["usage_source"] == "upstream"
    assert {key: call[key] for key in billed} == billed
    assert "usage_inconsistent" in call["anomalies"]


def test_compaction_iterations_are_billed_as_their_sum(
    live_server: LiveServer, http: httpx.Client
) -> None:
    """The real compaction transcript: the top-level usage says 612 input and 2819 output
    tokens (the final iteration only); the call bills both iterations."""
    request_id, events = replay(
        SSE / "real" / "26_anthropic_compaction_iterations.sse",
        protocol="anthropic.messages",
        api_key_id="k",
        url=live_server.url,
    )
    usage = events[-1]
    assert (usage["input_tokens"], usage["output_tokens"]) == (60997, 3341)
    call = settle_and_get(http, request_id)
    assert (call["input_tokens"], call["output_tokens_billed"]) == (60997, 3341)
    assert (call["output_tokens_delivered"], call["output_tokens_undelivered"]) == (3341, 0)
