"""Built-in prompts as the simulator's own token ids, for ``sim run``'s completions API.

``sim run`` counts a text prompt with ``BuiltinTokenizer``: one token per built-in word.
For a prompt of drawn words the ids follow from the draws alone, so the text (10 million
words for 10,000 prompts of 1,000 tokens) need not be built only to be split again.
"""

from __future__ import annotations

from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.prompts import PromptBuilder, Segment, draw_table, word_draws


class SimPromptBuilder(PromptBuilder):
    """A ``PromptBuilder`` of built-in words (no tokenizer) whose prompts come back as
    the ids ``tokenizer.encode`` gives for the text the base class would make.

    A one-segment prompt (``prompt``: synthetic workloads) goes from its draws straight
    to ids; a prompt of several segments (``join``: shared prefixes, traces) is joined as
    text and encoded. Segments stay text (sessions send them as text)."""

    def __init__(self, tokenizer: BuiltinTokenizer, salt: str = "") -> None:
        super().__init__(salt=salt)
        self._tokenizer = tokenizer
        vocab = set(self.vocab)
        first = {w: _single_id(tokenizer, w) for w in vocab}
        after_space = {w: _single_id(tokenizer, " " + w) for w in vocab}
        # by draw: the id of its word at the start of the text, and after a space
        self._first_ids = [first[w] for w in draw_table(self.vocab)]
        self._ids = [after_space[w] for w in draw_table(self.vocab)]

    def prompt(self, key: str, n: int) -> tuple[str | list[int], int]:
        draws, by_draw = word_draws(self.salted(key), n), self._ids
        ids = [by_draw[d] for d in draws]  # (faster than map with __getitem__ here)
        if ids:
            ids[0] = self._first_ids[draws[0]]
        return ids, n

    def join(self, segments: list[Segment]) -> tuple[str | list[int], int]:
        text, n = super().join(segments)
        assert isinstance(text, str)  # (no tokenizer in the base: text)
        return self._tokenizer.encode(text), n


def _single_id(tokenizer: BuiltinTokenizer, piece: str) -> int:
    ids = tokenizer.encode(piece)
    if len(ids) != 1:  # the built-in vocabulary holds every word, bare and after a space
        raise AssertionError(f"{piece!r} is {len(ids)} built-in tokens, not one")
    return ids[0]
