"""What two runs sent (``results.sentdiff``): their prompt lengths' source, and their
tokens request by request where the runs are of one draw of the workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from record_factory import rec

from inferlab.results.sentdiff import sent_differences
from inferlab.results.sources import Run

#: a trace's asked lengths: short chats and one long prompt
ASKED = [61, 61, 2997, 61, 61, 2997, 61, 61]


def run(sent: list[int], asked: list[int], *, source: str = "exact (server /tokenize)", seed: int = 0,
        out: int = 32) -> Run:
    records = [rec(i, i * 10.0, [i * 10.0 + 1, i * 10.0 + 2], i * 10.0 + 3, out, inp=s, requested_input_tokens=a,
                   requested_output_tokens=32) for i, (s, a) in enumerate(zip(sent, asked, strict=True))]
    summary: dict[str, Any] = {"input_length_source": source}
    return Run(Path("r"), summary, records, {"load": {"seed": seed}})


def test_one_draw_sent_as_another_server_counted_it_is_said() -> None:
    """The reviewer's trace: asked lengths 7 tokens apart (the template's tokens, taken
    off what a request asks, differ by server), the long prompts 6.5 % short."""
    base = run([64, 64, 3000, 64, 64, 3000, 64, 64], [a - 7 for a in ASKED])
    gateway = run([64, 64, 2804, 64, 64, 2804, 64, 64], ASKED, source="approximate (calibrated from usage)")
    got = sent_differences([base], [gateway])
    assert [d.setting for d in got] == ["input_length_source", "sent.input_tokens"]
    assert got[1].text == ("prompt tokens as sent 798.0 vs 749.0 a request (6,384 vs 5,992 in all over the 8 requests both "
                           "completed, -6.1%)")
    assert sent_differences([base], [base]) == []


def test_answers_of_other_lengths_are_said_too() -> None:
    a, b = run([64] * 8, ASKED), run([64] * 8, ASKED, out=20)
    assert [d.text for d in sent_differences([a], [b])] == [
        "answer tokens 32.0 vs 20.0 a request (256 vs 160 in all over the 8 requests both completed, -37.5%)"]


def test_runs_of_different_draws_are_not_compared_by_their_tokens() -> None:
    """Another seed draws other lengths: their tokens differ by design (the length
    sources are compared all the same)."""
    other = [61, 2997, 61, 61, 61, 61, 61, 61]
    a, b = run([64] * 8, ASKED), run([640] * 8, other, source="exact (local tokenizer)")
    assert [d.setting for d in sent_differences([a], [b])] == ["input_length_source"]
    # records that do not say what was asked (sim run): one draw where the seeds are one
    unsaid = [None] * 8
    assert [d.setting for d in sent_differences([run([64] * 8, unsaid)], [run([70] * 8, unsaid)])] == ["sent.input_tokens"]
    assert sent_differences([run([64] * 8, unsaid)], [run([70] * 8, unsaid, seed=1)]) == []
    # repeats (several runs a side) are draws of their own
    assert sent_differences([a, a], [run([70] * 8, ASKED)] * 2) == []
    # the configs differ in workload: the length source alone
    assert sent_differences([a], [run([70] * 8, ASKED)], tokens=False) == []
