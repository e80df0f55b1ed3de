"""``billing replay FILE.json``: a non-streaming response body played as a gateway would post it
(CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)")."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from billing.replay import ReplayError, replay
from tests.conftest import LiveServer
from tests.test_replay import run_cli, serve, settle_and_get  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "A wooden boardwalk.", "refusal": None},
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 1117,
        "completion_tokens": 46,
        "total_tokens": 1163,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 0},
    },
    "service_tier": "default",
}
MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "Hello."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 25,
        "output_tokens": 12,
        "server_tool_use": {"web_fetch_requests": 1},
    },
}


def test_a_json_response_is_started_counted_and_billed(
    live_server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    path = tmp_path / "completion.json"
    path.write_text(json.dumps(COMPLETION))
    request_id, events = replay(
        path, protocol="openai.chat_completions", api_key_id="key_j", url=live_server.url
    )
    assert [e["type"] for e in events] == ["stream.started", "stream.tokens", "stream.usage"]
    assert events[0]["model"] == "gpt-4o-2024-08-06"
    assert (events[1]["output_tokens_generated"], events[1]["output_tokens_delivered"]) == (46, 46)
    usage = events[2]
    assert (usage["source"], usage["input_tokens"], usage["cache_read_input_tokens"]) == (
        "upstream",
        93,
        1024,
    )
    call = settle_and_get(http, request_id)
    assert (call["output_tokens_billed"], call["output_tokens_delivered"]) == (46, 46)
    assert call["cache_read_input_tokens"] == 1024 and call["api_key_id"] == "key_j"


def test_a_json_response_with_a_disconnect_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "completion.json"
    path.write_text(json.dumps(COMPLETION))
    with pytest.raises(ReplayError, match="--disconnect-after applies to a stream"):
        replay(
            path,
            protocol="openai.chat_completions",
            api_key_id="k",
            url="http://127.0.0.1:9",
            disconnect_after=3,
        )


def test_cli_replay_of_a_json_message(serve: object, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "message.json"
    path.write_text(json.dumps(MESSAGE))
    done = run_cli(
        "replay",
        str(path),
        "--protocol",
        "anthropic.messages",
        "--api-key-id",
        "key_cli",
        "--url",
        serve.url,  # type: ignore[attr-defined]
    )
    assert done.returncode == 0, done.stderr
    request_id, _, rest = done.stdout.partition("\n")
    call = json.loads(rest)
    assert call["request_id"] == request_id
    assert (call["input_tokens"], call["output_tokens_billed"]) == (25, 12)
    [usage] = [e for e in call["events"] if e["type"] == "stream.usage"]
    assert (usage["source"], usage["counters"]) == ("upstream", {"web_fetch_requests": 1})
    assert "units" not in usage
