"""Unit tests of the incremental WHATWG SSE decoder (billing.taps.sse)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.taps.sse import SSEDecoder, SSEEvent, iter_sse_events

pytestmark = pytest.mark.nodb


def decode(*chunks: bytes) -> list[SSEEvent]:
    return list(iter_sse_events(chunks))


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def test_basic_event_with_name() -> None:
    assert decode(b"event: ping\ndata: {}\n\n") == [SSEEvent("ping", "{}")]


def test_event_name_absent_is_none() -> None:
    assert decode(b'data: {"type":"x"}\n\n') == [SSEEvent(None, '{"type":"x"}')]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_line_ends(end: bytes) -> None:
    raw = b"event: a" + end + b"data: 1" + end + end + b"data: 2" + end + end
    assert decode(raw) == [SSEEvent("a", "1"), SSEEvent(None, "2")]


def test_cr_lf_split_across_chunks_is_one_line_end() -> None:
    # CR ends a chunk, LF starts the next: one line end, not an extra blank line.
    events = decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")
    assert events == [SSEEvent(None, "a\nb")]


def test_lone_cr_then_data_in_next_chunk() -> None:
    events = decode(b"data: a\r", b"data: b\r", b"\r")
    assert events == [SSEEvent(None, "a\nb")]


def test_multi_line_data_joined_with_newline() -> None:
    assert decode(b"data: one\ndata:two\ndata:  three\ndata\n\n") == [
        SSEEvent(None, "one\ntwo\n three\n")
    ]


def test_data_without_space() -> None:
    assert decode(b'data:{"a":1}\n\n') == [SSEEvent(None, '{"a":1}')]


def test_leading_bom_dropped_even_when_split() -> None:
    raw = "\ufeffdata: x\n\n".encode()
    assert decode(raw) == [SSEEvent(None, "x")]
    assert decode(raw[:1], raw[1:2], raw[2:]) == [SSEEvent(None, "x")]


def test_only_one_bom_dropped() -> None:
    raw = "\ufeff\ufeffdata: x\n\n".encode()
    # the second BOM is part of the first line's field name, which is then unknown
    assert decode(raw) == []


def test_comments_ignored() -> None:
    raw = b": keepalive\n:\n: OPENROUTER PROCESSING\n\ndata: x\n: inside\n\n"
    assert decode(raw) == [SSEEvent(None, "x")]


def test_id_and_retry_only_blocks_dispatch_nothing() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"retry: 3000\n\nid: 7\n\nevent: ping\n\n") == []
    assert dec.retry == 3000
    assert dec.last_event_id == "7"
    assert dec.feed(b"data: x\n\n") == [SSEEvent(None, "x", "7")]


def test_invalid_retry_ignored() -> None:
    dec = SSEDecoder()
    dec.feed(b"retry: 3s\n\nretry: 12\n\nretry: x1\n\n")
    assert dec.retry == 12


def test_id_with_nul_ignored() -> None:
    dec = SSEDecoder()
    dec.feed(b"id: a\0b\ndata: x\n\n")
    assert dec.last_event_id is None


def test_empty_data_line_dispatches_empty_data() -> None:
    assert decode(b"data:\n\n") == [SSEEvent(None, "")]


def test_field_without_colon() -> None:
    assert decode(b"data\ndata\n\n") == [SSEEvent(None, "\n")]


def test_unknown_field_ignored() -> None:
    assert decode(b"foo: bar\ndata: x\n\n") == [SSEEvent(None, "x")]


def test_utf8_split_inside_multibyte_character() -> None:
    raw = 'data: {"text":"¡Hola! 😀 ñ"}\n\n'.encode()
    expected = decode(raw)
    assert expected == [SSEEvent(None, '{"text":"¡Hola! 😀 ñ"}')]
    for i in range(len(raw) + 1):
        assert decode(raw[:i], raw[i:]) == expected
    assert decode(*[raw[i : i + 1] for i in range(len(raw))]) == expected


def test_invalid_utf8_replaced_not_raised() -> None:
    assert decode(b"data: \xff\xfe\n\n") == [SSEEvent(None, "\ufffd\ufffd")]


def test_pending_block_dispatched_at_close() -> None:
    assert decode(b"data: a\n\ndata: b\n") == [SSEEvent(None, "a"), SSEEvent(None, "b")]
    assert decode(b"data: a\n\ndata: b") == [SSEEvent(None, "a"), SSEEvent(None, "b")]


def test_truncated_multibyte_at_close_is_replaced() -> None:
    assert decode(b"data: \xc3") == [SSEEvent(None, "\ufffd")]


def test_feed_after_close_ignored() -> None:
    dec = SSEDecoder()
    assert dec.close() == []
    assert dec.closed
    assert dec.feed(b"data: x\n\n") == []
    assert dec.close() == []


_TOKENS = [
    b"data:",
    b"data: ",
    b"event:",
    b"event: ping",
    b"id:",
    b"id: 1",
    b"retry:",
    b"retry: 10",
    b":",
    b": keepalive",
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"x",
    b"[DONE]",
    b'{"type":"a"}',
    "é".encode(),
    "😀".encode(),
    b"\xef\xbb\xbf",
    b"\xff",
    b"\x00",
]

_streams = st.one_of(
    st.lists(st.sampled_from(_TOKENS), max_size=40).map(b"".join),
    st.binary(max_size=200),
)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), raw=_streams)
def test_any_chunking_gives_the_same_events(data: st.DataObject, raw: bytes) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=12))
    whole = decode(raw)
    assert decode(*pieces(raw, cuts)) == whole
    dec = SSEDecoder()
    assert dec.retry is None
    bytewise: list[SSEEvent] = []
    for i in range(len(raw)):
        bytewise.extend(dec.feed(raw[i : i + 1]))
    bytewise.extend(dec.close())
    assert bytewise == whole


def test_whole_block_reads_the_usual_chunk_as_feed_raw_would() -> None:
    dec = SSEDecoder()
    assert dec.whole_block(b'data: {"a":1}\n\n') is None  # the first chunk (a BOM may start it)
    assert dec.feed_raw(b'data: {"a":1}\n\n') == [(None, b'{"a":1}', None)]
    assert dec.whole_block(b'data: {"b":2}\n\n') == b'{"b":2}'
    assert dec.feed_raw(b"id: 7\n\n") == []
    assert dec.whole_block(b"data: [DONE]\n\n") == b"[DONE]"  # (the event's id would be "7")
    for other in (
        b"data: x\r\n\r\n",  # CR line ends
        b"data: x\ndata: y\n\n",  # two data lines
        b"event: e\ndata: x\n\n",  # a named event
        b"data: x\n",  # half a block
        bytearray(b"data: x\n\n"),  # not bytes
    ):
        assert dec.whole_block(other) is None
    assert dec.feed_raw(b"data: par") == []  # a pending line: the next chunk is not whole
    assert dec.whole_block(b"tial\n\n") is None
    assert dec.feed_raw(b"tial\n\n") == [(None, b"partial", "7")]
    assert dec.whole_block(b"data: z\n\n") == b"z"
    dec.close_raw()
    assert dec.whole_block(b"data: z\n\n") is None
