"""The simulated model's output text: where stop strings and stop token ids end it, checked
against vLLM's own procedure run token by token, and its log-probabilities."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.sim.server.output import LogprobTable, OutputText, Stop
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer

TOKENIZER = BuiltinTokenizer()
OUTPUT = OutputText(TOKENIZER)
LONG_TEXT = "".join(TOKENIZER.output_piece(i) for i in range(3 * OUTPUT.period))


def vllm_stop(stops: list[str], stop_ids: list[int], min_tokens: int, limit: int) -> Stop | None:
    """vLLM's detokenizer and stop checker, one token at a time: a stop token ends the
    output, its text left out; otherwise, past ``min_tokens``, each stop string in turn
    is looked for in the text the new token could have completed."""
    text = ""
    for k in range(1, limit + 1):
        token = TOKENIZER.output_token(k - 1)
        if token in stop_ids and k > min_tokens:
            return Stop(k, len(text), token)
        checked = len(text)
        text += TOKENIZER.output_piece(k - 1)
        if k <= min_tokens:
            continue
        new_chars = len(text) - checked
        for s in stops:
            at = text.find(s, max(0, len(text) - new_chars - len(s) + 1))
            if at != -1:
                return Stop(k, at, s)
    return None


def test_the_text_is_the_tokens_pieces() -> None:
    assert OUTPUT.text(0, len(LONG_TEXT)) == LONG_TEXT
    assert OUTPUT.text(5, 2000) == LONG_TEXT[5:2000]
    assert OUTPUT.text(7, 7) == ""
    for k in (0, 1, OUTPUT.period - 1, OUTPUT.period, 2 * OUTPUT.period + 3):
        assert OUTPUT.chars(k) == len("".join(TOKENIZER.output_piece(i) for i in range(k)))


def test_a_stop_string_cuts_where_it_starts() -> None:
    first = LONG_TEXT.index(" RAG")
    stop = OUTPUT.stop([" RAG"], [], 0)
    assert stop is not None and stop.text_chars == first and stop.reason == " RAG"
    assert OUTPUT.chars(stop.tokens - 1) < first + 4 <= OUTPUT.chars(stop.tokens)


def test_a_stop_string_that_never_appears_never_stops() -> None:
    assert OUTPUT.stop(["zebra crossing"], [], 0) is None
    assert OUTPUT.stop([LONG_TEXT[:50] + "x"], [], 0) is None


def test_a_stop_string_longer_than_the_passage_is_found_across_periods() -> None:
    s = LONG_TEXT[10 : 10 + OUTPUT.period * 8]  # about 1.6 periods of text
    assert OUTPUT.stop([s], [], 0) == vllm_stop([s], [], 0, 3 * OUTPUT.period)


def test_min_tokens_defers_the_stop_to_a_later_occurrence() -> None:
    early = OUTPUT.stop(["."], [], 0)
    late = OUTPUT.stop(["."], [], 40)
    assert early is not None and late is not None
    assert early.tokens <= 40 < late.tokens and late.text_chars > early.text_chars
    assert late == vllm_stop(["."], [], 40, 3 * OUTPUT.period)


def test_the_first_stop_string_in_the_list_wins_a_tie() -> None:
    # Both complete at the token that writes " RAG": vLLM checks them in the request's order.
    assert OUTPUT.stop(["AG", " RAG"], [], 0) == vllm_stop(["AG", " RAG"], [], 0, 500)
    stop = OUTPUT.stop(["AG", " RAG"], [], 0)
    assert stop is not None and stop.reason == "AG"


def test_a_stop_token_ends_the_text_before_itself() -> None:
    token = TOKENIZER.output_token(9)
    stop = OUTPUT.stop([], [token], 0)
    assert stop == vllm_stop([], [token], 0, 500)
    assert stop is not None and stop.reason == token and stop.text_chars == OUTPUT.chars(stop.tokens - 1)
    assert OUTPUT.stop([], [TOKENIZER.vocab_size + 5], 0) is None  # never generated


# Stop strings drawn from the output text itself (so they occur), across token boundaries,
# and a few random ones.
_SPANS = st.tuples(st.integers(0, len(LONG_TEXT) - 40), st.integers(1, 25)).map(lambda t: LONG_TEXT[t[0] : t[0] + t[1]])
_STOPS = st.lists(st.one_of(_SPANS, st.text("aeiou .,", min_size=1, max_size=4)), max_size=4)
_TOKENS = st.lists(st.sampled_from([TOKENIZER.output_token(i) for i in range(0, OUTPUT.period, 7)]), max_size=3)


@settings(derandomize=True, deadline=None, database=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(stops=_STOPS, stop_ids=_TOKENS, min_tokens=st.integers(0, 2 * OUTPUT.period))
def test_the_stop_is_where_vllm_finds_it(stops: list[str], stop_ids: list[int], min_tokens: int) -> None:
    limit = min_tokens + 2 * OUTPUT.period  # every stop that occurs at all occurs by then
    found = OUTPUT.stop(stops, stop_ids, min_tokens)
    expected = vllm_stop(stops, stop_ids, min_tokens, limit)
    assert found == expected or (expected is None and found is not None and found.tokens > limit)


def test_logprobs_are_deterministic_plausible_and_ordered() -> None:
    table = LogprobTable(OUTPUT, 20)
    again = LogprobTable(OUTPUT, 20)
    for i in (0, 1, 57, OUTPUT.period + 1):
        text, logprob, top = table.token(i, 20)
        assert text == TOKENIZER.output_piece(i)
        assert top[0] == (text, logprob) and math.log(0.4) <= logprob < 0
        assert len(top) == 20 and len({t for t, _ in top}) == 20
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert sum(math.exp(lp) for _, lp in top) <= 1
        assert again.token(i, 20) == (text, logprob, top)
        assert table.token(i, 3) == (text, logprob, top[:3])
        assert table.token(i, 0) == (text, logprob, [])
    assert table.token(1, 0) == table.token(OUTPUT.period + 1, 0)  # the passage's place fixes it


@pytest.mark.parametrize("n", [1, 5])
def test_logprob_alternatives_are_words_of_the_passage(n: int) -> None:
    _, _, top = LogprobTable(OUTPUT, 20).token(3, n)
    assert all(t in OUTPUT.pieces for t, _ in top)
