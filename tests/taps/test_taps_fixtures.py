"""Every recorded transcript gives its expected.json values, however the bytes are split."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from billing.taps import Tap, open_tap
from tests.taps.helpers import state

pytestmark = pytest.mark.nodb

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sse"
SMALL = 4096
RANDOM_OFFSETS = 500


def _cases() -> list[tuple[Path, dict[str, Any]]]:
    cases = []
    for folder in (FIXTURES, FIXTURES / "real"):
        expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
        for path in sorted(folder.glob("*.sse")):
            assert path.name in expected, f"{path} has no entry in expected.json"
            cases.append((path, expected[path.name]))
    return cases


CASES = _cases()
IDS = [path.name for path, _ in CASES]


def run(protocol: str, chunks: Iterable[bytes]) -> Tap:
    tap = open_tap(protocol)
    for chunk in chunks:
        tap.feed(chunk)
    tap.close()
    return tap


#: v2 dimensions an expected.json entry may leave out, with the value that means "none".
V2_DEFAULTS: dict[str, Any] = {
    "service_tier": None,
    "units": {},
    "other_models": [],
    "anomalies": [],
}


def check(tap: Tap, expected: dict[str, Any]) -> None:
    payload = tap.usage_payload()
    if expected["usage"] is None:
        assert tap.usage is None
        assert payload["source"] == "estimate"
    else:
        assert tap.usage is not None
        tokens = {"cache_creation_1h_input_tokens": 0, **expected["usage"]}
        assert tap.usage.as_dict() == tokens
        assert payload["source"] == "upstream"
        assert {k: payload.get(k, 0) for k in tokens} == tokens
    for key, none in V2_DEFAULTS.items():
        assert payload.get(key, none) == expected.get(key, none), key
    assert tap.service_tier == expected.get("service_tier")
    if "input_reported" in expected:
        assert tap.input_reported is not None
        reported = {"cache_creation_1h_input_tokens": 0, **expected["input_reported"]}
        assert tap.input_reported.as_dict() == reported
        for key, value in expected["input_reported"].items():
            assert payload[key] == value
    assert tap.stop_reason == expected["stop_reason"]
    if expected["error"] is None:
        assert tap.error is None
        assert tap.failed_payload() is None
    else:
        assert tap.error is not None
        assert {k: tap.error.get(k) for k in expected["error"]} == expected["error"]
        assert isinstance(tap.error["type"], str)
        assert isinstance(tap.error["message"], str)
        failed = tap.failed_payload()
        assert failed is not None
        assert failed["error_type"] == expected["error"]["type"]
        assert failed["output_tokens_generated"] == tap.output_tokens
    # the recorded transcripts are well-formed
    assert tap.malformed_events == 0
    if expected["usage"] is None:
        # billed on estimates, never 0 when content was generated, never the placeholder
        assert tap.output_tokens == tap.content_deltas


@pytest.mark.parametrize(("path", "expected"), CASES, ids=IDS)
def test_whole(path: Path, expected: dict[str, Any]) -> None:
    check(run(expected["protocol"], [path.read_bytes()]), expected)


@pytest.mark.parametrize(("path", "expected"), CASES, ids=IDS)
def test_one_byte_pieces(path: Path, expected: dict[str, Any]) -> None:
    raw = path.read_bytes()
    tap = run(expected["protocol"], (raw[i : i + 1] for i in range(len(raw))))
    check(tap, expected)
    assert state(tap) == state(run(expected["protocol"], [raw]))


@pytest.mark.slow
@pytest.mark.parametrize(("path", "expected"), CASES, ids=IDS)
def test_split_in_two(path: Path, expected: dict[str, Any]) -> None:
    raw = path.read_bytes()
    if len(raw) <= SMALL:
        offsets: Iterable[int] = range(len(raw) + 1)
    else:
        offsets = random.Random(f"taps:{path.name}").sample(range(len(raw) + 1), RANDOM_OFFSETS)
    whole = state(run(expected["protocol"], [raw]))
    for offset in offsets:
        tap = run(expected["protocol"], [raw[:offset], raw[offset:]])
        check(tap, expected)
        assert state(tap) == whole, f"split at {offset}"


@pytest.mark.parametrize(("path", "expected"), CASES, ids=IDS)
def test_crlf_line_ends_give_the_same_result(path: Path, expected: dict[str, Any]) -> None:
    raw = path.read_bytes()
    for ending in (b"\r\n", b"\r"):
        converted = raw.replace(b"\n", ending)
        check(run(expected["protocol"], [converted]), expected)
        pieces = [converted[i : i + 7] for i in range(0, len(converted), 7)]
        check(run(expected["protocol"], pieces), expected)
