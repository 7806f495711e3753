import random

from inferlab.openai.sse import SSEParser

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
        cuts = sorted(rng.sample(range(1, len(STREAM)), 5))
        pieces = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
        assert feed_all(SSEParser(), pieces) == EXPECTED


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
