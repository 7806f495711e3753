"""The relay's read of a stream's usual chunk by its template (``ResponseReader.
wire_event``) passes on and observes exactly what the parser and reader would have."""

from __future__ import annotations

import json
from typing import Any

import pytest

import inferlab.openai.response as response
from inferlab._clock import VirtualClock
from inferlab.gateway.metrics import Bins
from inferlab.gateway.relay import Observed, StreamRelay
from inferlab.openai.sse import DONE_EVENT, encode_event
from inferlab.results.records import RequestRecord


def chunk(content: str | None, finish: str | None = None, **top: Any) -> bytes:
    delta = {} if content is None else {"content": content}
    return encode_event(json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **top},
                                   ensure_ascii=False))


USAGE = encode_event(json.dumps({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 7}}))

READS = [
    chunk(""), chunk(" the"), chunk(" sea"), chunk(" wörld"), chunk(""),
    chunk('a", "role": "x'.replace('"', '\\"')),  # escaped quotes: the decoder's
    chunk(" tab\there"),  # an escape in the JSON as written
    chunk(" two") + chunk(" reads"),  # two events in one read
    chunk(" split")[:20], chunk(" split")[20:],  # one event over two reads
    b": keep-alive\n\n" + chunk(" after"),
    chunk(" more"), chunk(None, "length"), USAGE, DONE_EVENT,
]


def relay(learn: bool, drop_usage: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    monkeypatch.setattr(response, "_LEARN_TRIES", 4 if learn else 0)
    grown: list[int] = []
    itl = Bins((0.001, 0.01, 0.1))
    r = StreamRelay(VirtualClock(), Observed(RequestRecord(0), 0, 0), chat=True, drop_usage=drop_usage, keep=False,
                    itl=itl, reserved_output=3, grow=grown.append)
    out = [r.feed(data, 1_000_000 * i) for i, data in enumerate(READS)]
    return out, r.obs.content_ns, itl.counts, grown, r.usage, r.reader.output_chars, r.reader.finish_reason, r.reader.done


@pytest.mark.parametrize("drop_usage", [False, True])
def test_the_relay_passes_and_observes_the_same_with_templates(drop_usage: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    with_templates = relay(True, drop_usage, monkeypatch)
    assert with_templates == relay(False, drop_usage, monkeypatch)
    out = with_templates[0]
    assert out[1:5] == READS[1:5]  # (the usual chunks went on as they came)
    assert len(with_templates[1]) == 10  # (every content chunk but the empty ones, once)
    assert (USAGE in out) != drop_usage


def test_the_template_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = response.ResponseReader.wire_event

    def spy(self: response.ResponseReader, data: bytes) -> int | None:
        got = real(self, data)
        if got is not None:
            calls.append(data)
        return got

    monkeypatch.setattr(response.ResponseReader, "wire_event", spy)
    relay(True, False, monkeypatch)
    assert READS[2] in calls and READS[3] in calls and READS[-4] in calls
