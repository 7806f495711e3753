import random

from inferlab.workload.builtin_prompts import SimPromptBuilder
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.prompts import PromptBuilder


def test_prompts_are_the_ids_of_the_text_prompts() -> None:
    tok = BuiltinTokenizer()
    text, ids = PromptBuilder(), SimPromptBuilder(tok)
    rng = random.Random(5)
    for i in range(300):
        n = rng.choice([0, 1, 2, 17, rng.randint(1, 3000)])
        prompt, count = text.prompt(f"k:{i}", n)
        assert isinstance(prompt, str)
        assert ids.prompt(f"k:{i}", n) == (tok.encode(prompt), count)
        # several segments (shared prefixes, trace hash blocks) join as text does
        segs = [text.segment(f"s:{i}:{j}", rng.randint(0, 40)) for j in range(rng.randint(1, 4))]
        joined, count = text.join(segs)
        assert isinstance(joined, str)
        assert ids.join(segs) == (tok.encode(joined), count)
        assert ids.segment(f"s:{i}:0", 5) == text.segment(f"s:{i}:0", 5)  # segments stay text
