import json
import random
from typing import Any

import pytest
from splits import random_splits

from inferlab.openai.sse import DONE, DONE_EVENT, SSEParser, encode_event, encode_json

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b'data:{"b": 2}\n\n'
    b"event: message\nid: 7\ndata: line1\ndata: line2\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = ['{"a": 1}', '{"b": 2}', "line1\nline2", "[DONE]"]


def feed_all(parser: SSEParser, pieces: list[bytes]) -> list[str]:
    out: list[str] = []
    for p in pieces:
        out += parser.feed(p)
    return out + parser.close()


def test_whole_stream_in_one_read() -> None:
    assert feed_all(SSEParser(), [STREAM]) == EXPECTED


def test_every_split_point_gives_the_same_events() -> None:
    for cut in range(len(STREAM) + 1):
        assert feed_all(SSEParser(), [STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut


def test_byte_by_byte_and_random_splits() -> None:
    assert feed_all(SSEParser(), [bytes([b]) for b in STREAM]) == EXPECTED
    rng = random.Random(1)
    for _ in range(200):
        assert feed_all(SSEParser(), random_splits(STREAM, rng, cuts=5)) == EXPECTED


def test_crlf_and_cr_line_endings_even_when_split() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    cr = STREAM.replace(b"\n", b"\r")
    for data in (crlf, cr):
        for cut in range(len(data) + 1):
            assert feed_all(SSEParser(), [data[:cut], data[cut:]]) == EXPECTED


def test_event_without_final_blank_line_is_dispatched_at_close() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"x": 1}') == []
    assert p.feed(b"\n") == []
    assert p.close() == ['{"x": 1}']


def test_multibyte_utf8_split_across_reads() -> None:
    data = 'data: {"t": "héllo ✓"}\n\n'.encode()
    split = data.index("✓".encode()) + 1  # inside the 3-byte character
    assert feed_all(SSEParser(), [data[:split], data[split:]]) == ['{"t": "héllo ✓"}']


def test_only_one_leading_space_is_stripped_and_other_fields_ignored() -> None:
    p = SSEParser()
    assert p.feed(b"data:  two spaces\nretry: 10\n\n") == [" two spaces"]
    assert p.feed(b"id: 3\n\n") == []  # an event without data is not dispatched


# --- encoding: SSEParser gives back what encode_event / encode_json wrote ---------------

ROUND_TRIP_DATA = [
    '{"a": 1}',
    "",
    " leading space kept",
    "two\nlines",
    "\n",
    "trailing newline\n",
    "héllo ✓ 🚀",
    ": not a comment inside data",
    "[DONE]",
]


def test_encode_event_round_trips_in_every_split() -> None:
    stream = b"".join(encode_event(d) for d in ROUND_TRIP_DATA)
    for cut in range(len(stream) + 1):
        assert feed_all(SSEParser(), [stream[:cut], stream[cut:]]) == ROUND_TRIP_DATA, cut
    assert feed_all(SSEParser(), [bytes([b]) for b in stream]) == ROUND_TRIP_DATA
    rng = random.Random(2)
    for _ in range(200):
        assert feed_all(SSEParser(), random_splits(stream, rng)) == ROUND_TRIP_DATA


def test_encode_event_frames_one_line_per_data_line() -> None:
    assert encode_event("x") == b"data: x\n\n"
    assert encode_event("a\nb") == b"data: a\ndata: b\n\n"
    assert encode_event("") == b"data: \n\n"


def test_encode_event_refuses_a_carriage_return() -> None:
    with pytest.raises(ValueError, match="carriage return"):
        encode_event("a\rb")


def test_encode_json_is_compact_and_round_trips() -> None:
    objs: list[Any] = [
        {"id": "chatcmpl-1", "choices": [{"delta": {"content": "line\nbreak\r and ✓"}}]},
        {"usage": {"prompt_tokens": 3}, "x": None, "y": [1.5, True]},
        [],
    ]
    assert encode_json(objs[1]) == b'data: {"usage":{"prompt_tokens":3},"x":null,"y":[1.5,true]}\n\n'
    stream = b"".join(encode_json(o) for o in objs) + DONE_EVENT
    rng = random.Random(3)
    for _ in range(200):
        events = feed_all(SSEParser(), random_splits(stream, rng, cuts=6))
        assert [json.loads(e) for e in events[:-1]] == objs
        assert events[-1] == DONE


def test_done_event_is_openais() -> None:
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_plain_says_when_a_reads_bytes_are_exactly_its_events_encoded() -> None:
    # every read of this stream, split anywhere, either is plain (and then is its events,
    # re-encoded, byte for byte: what a relay may pass on as it came) or is not
    stream = b"".join(encode_event(d) for d in ['{"a": 1}', "x y", "", "é ✓", "[DONE]"])
    rng = random.Random(4)
    for _ in range(300):
        parser = SSEParser()
        for piece in random_splits(stream, rng, cuts=4):
            events = parser.feed(piece)
            if parser.plain:
                assert b"".join(encode_event(e) for e in events) == piece
    cases = {
        b'data: {"a": 1}\n\n': True,
        b'data: {"a": 1}\n\ndata: [DONE]\n\n': True,
        b"data:x\n\n": False,  # (no space: re-encoded with one)
        b": ping\n\ndata: x\n\n": False,
        b"data: x\r\n\r\n": False,
        b"event: message\ndata: x\n\n": False,
        b"data: a\ndata: b\n\n": False,
        b"data: \xff\n\n": False,  # (not UTF-8: read with a replacement character)
        b"data: x\n\n\n\n": False,
    }
    for read, plain in cases.items():
        parser = SSEParser()
        events = parser.feed(read)
        assert parser.plain is plain, read
        assert events == feed_all(SSEParser(), [read])  # (the same events either way)
    parser = SSEParser()
    parser.feed(b"data: x")  # (an event left open: the next read completes it, not plain)
    assert parser.feed(b"\n\n") == ["x"] and not parser.plain
