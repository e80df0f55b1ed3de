"""The taps' echo path (``Tap.feed``): an event that repeats the previous plain text delta's
bytes around another text is counted without reading its JSON. Whatever the stream, a tap with
the echo path reads exactly as one without it, event after event."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.taps import Tap, open_tap
from tests.taps.helpers import state

pytestmark = pytest.mark.nodb

PROTOCOL = "openai.chat_completions"


def _reading(tap: Tap) -> tuple[Any, ...]:
    """Everything a tap reports (``state``), with its tier, units and event counts."""
    return (*state(tap), tap.service_tier, tap.units, tap._events, tap._deltas_total, tap._done)


def _taps() -> tuple[Tap, Tap]:
    echoing, reading = open_tap(PROTOCOL), open_tap(PROTOCOL)
    reading._TEXT_KEY = None  # type: ignore[misc]  # this one reads every event
    return echoing, reading


def _chunk(
    text: str,
    *,
    model: str = "gpt-x",
    role: bool = False,
    finish: str | None = None,
    tier: str | None = None,
    usage: dict[str, Any] | None = None,
    spaced: bool = False,
    raw: bytes | None = None,
) -> bytes:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    delta["content"] = text
    data: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if tier is not None:
        data["service_tier"] = tier
    if usage is not None:
        data["usage"] = usage
    body = json.dumps(data, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
    encoded = body.encode()
    if raw is not None:  # the text's bytes replaced as they are (maybe not valid JSON any more)
        marker = json.dumps(text, ensure_ascii=False).encode()
        encoded = encoded.replace(marker, b'"' + raw + b'"', 1)
    return b"data: " + encoded + b"\n\n"


def test_the_echo_counts_each_text_delta_once_as_reading_would() -> None:
    echoing, reading = _taps()
    chunks = [_chunk("", role=True), *(_chunk(f" t{i}") for i in range(5)), _chunk("")]
    chunks += [_chunk("", finish="stop"), _chunk("", usage={"prompt_tokens": 9})]
    for chunk in chunks:
        echoing.feed(chunk)
        reading.feed(chunk)
        assert _reading(echoing) == _reading(reading)
    assert echoing.output_tokens == 5
    assert echoing._events == 9


def test_the_echo_is_kept_only_after_a_plain_text_delta() -> None:
    tap = open_tap(PROTOCOL)
    tap.feed(_chunk(" a"))
    assert tap._echo is not None
    tap.feed(_chunk(" b", model="gpt-y"))  # another model: read, and an echo of it
    assert tap.model == "gpt-y"
    tap.feed(_chunk(" c", finish="stop"))
    assert tap._echo is None and tap.stop_reason == "stop"
    tap.feed(_chunk(' "quoted"'))  # an escaped text: read, never echoed
    assert tap._echo is None
    assert tap.output_tokens == 4


@pytest.mark.parametrize(
    "raw",
    [b"\xff", b"\xc3", b"a\x01b", b'a"b', b"a\\b", b"\\u00e9", b"\\n", b"\xed\xa0\x80", b""],
)
def test_a_text_not_written_as_its_plain_bytes_is_read(raw: bytes) -> None:
    echoing, reading = _taps()
    for chunk in (_chunk(" a"), _chunk("x", raw=raw), _chunk(" b")):
        echoing.feed(chunk)
        reading.feed(chunk)
        assert _reading(echoing) == _reading(reading)


def test_an_event_with_its_text_key_twice_is_never_echoed() -> None:
    echoing, reading = _taps()
    twice = b'data: {"model":"m","choices":[{"delta":{"content":"%s","content":"a"}}]}\n\n'
    for chunk in (twice % b"a", twice % b"", twice % b"", twice % b"b"):
        echoing.feed(chunk)
        reading.feed(chunk)
        assert _reading(echoing) == _reading(reading)
    assert echoing.output_tokens == 4
    assert echoing._echo is None


def test_an_event_of_several_data_lines_is_never_echoed() -> None:
    echoing, reading = _taps()
    lines = b'data: {"model":"m",\ndata: "choices":[{"delta":{"content":"a"}}]}\n\n'
    one = b'data: {"model":"m",\n"choices":[{"delta":{"content":"b"}}]}\n\n'
    for chunk in (lines, one, lines):
        echoing.feed(chunk)
        reading.feed(chunk)
        assert _reading(echoing) == _reading(reading)
    assert echoing._echo is None
    assert (echoing.output_tokens, echoing.malformed_events) == (2, 1)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        # the delta's key written with an escape, a literal "content" elsewhere
        (
            b'data: {"content":"a","choices":[{"delta":{"cont\\u0065nt":"a"}}]}\n\n',
            b'data: {"content":"","choices":[{"delta":{"cont\\u0065nt":"a"}}]}\n\n',
        ),
        # a key whose escaped quote puts "content" in the bytes
        (
            b'data: {"x\\"content":"a","choices":[{"delta":{"cont\\u0065nt":"a"}}]}\n\n',
            b'data: {"x\\"content":"","choices":[{"delta":{"cont\\u0065nt":"a"}}]}\n\n',
        ),
        # the key twice, the escaped one last (the one read)
        (
            b'data: {"choices":[{"delta":{"content":"a","cont\\u0065nt":"a"}}]}\n\n',
            b'data: {"choices":[{"delta":{"content":"","cont\\u0065nt":"a"}}]}\n\n',
        ),
    ],
)
def test_an_event_with_an_escape_anywhere_is_never_echoed(first: bytes, then: bytes) -> None:
    echoing, reading = _taps()
    for chunk in (_chunk("", role=True), first, then, then):
        echoing.feed(chunk)
        reading.feed(chunk)
        assert _reading(echoing) == _reading(reading)
    assert echoing.output_tokens == 3


_texts = st.one_of(
    st.sampled_from(["", " t", "tok", "é", "日本", '"', "\\", "a\nb", "\x01", "}", '"content":"x']),
    st.text(max_size=6),
)
_raws = st.sampled_from([b"\xff", b"\xc3", b"a\x01b", b'a"b', b"a\\b", b"\\u00e9", b"\xed\xa0\x80"])


@st.composite
def _events(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    text = draw(_texts)
    spaced = draw(st.booleans())
    model = draw(st.sampled_from(["gpt-x", "gpt-x", "gpt-y", ""]))
    tier = draw(st.sampled_from([None, None, "default", "priority"]))
    if kind == 0:
        return _chunk(text, finish="stop", model=model, spaced=spaced)
    if kind == 1:
        usage = {"prompt_tokens": draw(st.integers(0, 50)), "completion_tokens": 3}
        return _chunk(text, usage=usage, spaced=spaced)
    if kind == 2:
        return _chunk(text, raw=draw(_raws), model=model, spaced=spaced)
    if kind == 3:
        return draw(st.sampled_from([b"data: [DONE]\n\n", b"data: \n\n", b": ping\n\n"]))
    if kind == 4:
        return b'data: {"error": {"message": "x"}}\n\n'
    if kind == 5:  # a key repeated: the last one is the value
        return b'data: {"model":"gpt-x","choices":[{"delta":{"content":"","content":"t"}}]}\n\n'
    return _chunk(text, role=kind == 6, model=model, tier=tier, spaced=spaced)


@settings(max_examples=300, deadline=None)
@given(st.lists(_events(), max_size=25), st.booleans())
def test_a_tap_with_the_echo_reads_as_one_without_it(chunks: list[bytes], split: bool) -> None:
    echoing, reading = _taps()
    for chunk in chunks:
        pieces = [chunk[:7], chunk[7:]] if split and len(chunk) > 7 else [chunk]
        for piece in pieces:
            echoing.feed(piece)
            reading.feed(piece)
        assert _reading(echoing) == _reading(reading)
    echoing.close()
    reading.close()
    assert _reading(echoing) == _reading(reading)
