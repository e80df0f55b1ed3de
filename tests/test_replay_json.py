"""``billing replay FILE.json``: a non-streaming response body played as a gateway would post it
(CONTRACT "Non-streaming calls, hosted-tool fees, provider-reported cost (v3)")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from billing.replay import ReplayError, replay
from tests.conftest import LiveServer
from tests.taps.test_taps_nonstreaming import CHAT_COMPLETION as COMPLETION
from tests.taps.test_taps_nonstreaming import MESSAGE, RESPONSE
from tests.test_replay import run_cli, serve, settle_and_get  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


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
    assert events[2]["reasoning_tokens"] == 12
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


@pytest.mark.parametrize(
    ("name", "text", "unreadable"),
    [
        ("bad.json", "not json", 1),
        ("empty.json", "", 1),
        ("list.json", "[1, 2]", 1),
        ("other.json", '{"foo": 1}', 0),
        ("garbage.sse", "garbage\n\n", 0),
    ],
)
def test_a_file_with_nothing_of_the_protocol_is_refused_before_any_post(
    tmp_path: Path, name: str, text: str, unreadable: int
) -> None:
    """Nothing is posted (the service's address is a closed port): an unreadable file would
    otherwise bill an `unknown`, unpriced call."""
    path = tmp_path / name
    path.write_text(text)
    what = "response" if name.endswith(".json") else "stream event"
    expected = f"holds no openai.chat_completions {what} that can be read ({unreadable} unreadable)"
    with pytest.raises(ReplayError, match=re.escape(expected)):
        replay(path, protocol="openai.chat_completions", api_key_id="k", url="http://127.0.0.1:9")


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
    assert (call["input_tokens"], call["output_tokens_billed"]) == (2095, 503)
    [usage] = [e for e in call["events"] if e["type"] == "stream.usage"]
    assert (usage["source"], usage["counters"]) == ("upstream", {"web_fetch_requests": 2})
    assert usage["units"] == {"web_search_requests": 1}


def test_a_responses_body_replayed_as_anthropic_is_refused_before_any_post(
    tmp_path: Path,
) -> None:
    """A Responses body is not a Messages body although both carry ``usage.input_tokens`` and
    ``output_tokens``: nothing of it is read (no cost from guessed fields), so nothing is
    posted (the service's address is a closed port)."""
    path = tmp_path / "response.json"
    path.write_text(json.dumps(RESPONSE))
    expected = "holds no anthropic.messages response that can be read (1 unreadable)"
    with pytest.raises(ReplayError, match=re.escape(expected)):
        replay(path, protocol="anthropic.messages", api_key_id="k", url="http://127.0.0.1:9")
