import random

from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.text import WORDS

ODD = ["Hello", "RAG", "x1", "", "  ", "\n", "<|im_end|>", "ünïcode", "end.", "Retrieval"]


def test_fast_path_matches_the_general_path_and_round_trips() -> None:
    tok = BuiltinTokenizer()
    rng = random.Random(0)
    for _ in range(2000):
        text = " ".join(rng.choice([*WORDS[:50], *ODD]) for _ in range(rng.randrange(0, 12)))
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        # a trailing NUL byte forces the general path; it costs exactly one byte token
        assert tok.encode(text + "\x00")[:-1] == ids, text


def test_plain_words_cost_one_token_each() -> None:
    tok = BuiltinTokenizer()
    words = list(WORDS[:300])
    assert len(tok.encode(" ".join(words))) == 300
    assert len(tok.encode("Hello")) > 1  # not a built-in word: byte fallback
