"""Prompt text of exact token lengths, built from deterministic word streams.

Every piece of a prompt is a *segment*: ``n`` tokens drawn from the word stream named by
a key. Equal keys give equal text, which is how shared prefixes, Mooncake hash blocks
and growing sessions share tokens. Without a tokenizer one built-in word is one token
(exact for the simulator's tokenizer, close for BPE ones). With one, the text is
adjusted until re-encoding it gives exactly ``n`` ids; with ``token_ids`` the prompt is
sent as those ids (completions API), so lengths and shared blocks are exact.
Against a server without a local tokenizer, ``vocab`` is the subset of words the
server's own ``/tokenize`` counts as one token each (exact lengths), or
``tokens_per_word`` scales word counts from a calibration (approximate lengths).
"""

from __future__ import annotations

import functools
import random
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import repeat
from operator import mod

from inferlab._errors import InferlabError
from inferlab.workload.text import WORDS
from inferlab.workload.tokenizers import Tokenizer

_CACHE_SEGMENTS = 4096
_MAX_ADJUST = 24


@dataclass(frozen=True)
class Segment:
    text: str
    ids: tuple[int, ...] | None  # None: no tokenizer, one word per token
    tokens: int


def words(key: str, n: int, vocab: tuple[str, ...] = WORDS) -> list[str]:
    """The first ``n`` words of ``key``'s stream (a prefix of any longer draw): the words
    ``word_draws`` picks from ``vocab``."""
    return list(map(draw_table(vocab).__getitem__, word_draws(key, n)))  # (in C)


def word_draws(key: str, n: int) -> array[int]:
    """The first ``n`` 16-bit draws of ``key``'s stream; draw ``d`` picks word
    ``draw_table(vocab)[d]``.

    Draws whole 32-bit words of random bytes (so a shorter draw is a prefix of a longer
    one): several times faster than ``random.choices``; the modulo bias of mapping 65,536
    draws onto the vocabulary (under 1% for a few hundred words) is irrelevant for
    filler text."""
    raw = random.Random(key).randbytes(4 * ((2 * n + 3) // 4))
    idx = array("H", raw[: 2 * n])
    if sys.byteorder == "big":
        idx.byteswap()  # the same words on every machine
    return idx


@functools.lru_cache(maxsize=8)
def draw_table(vocab: tuple[str, ...]) -> list[str]:
    """``vocab[d % len(vocab)]`` for every 16-bit draw ``d``: one lookup per word."""
    return [vocab[i] for i in map(mod, range(1 << 16), repeat(len(vocab)))]


class PromptBuilder:
    """Makes segments and joins them into a prompt (text, or token ids).

    Without a tokenizer a segment of ``n`` tokens is ``round(n / tokens_per_word)``
    words of ``vocab``. ``salt`` makes every key's words its own: two builders with
    different salts share no text, so a run's prompts share no prefix with another
    run's (a server's prefix cache would serve them); equal salts give equal prompts."""

    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        token_ids: bool = False,
        *,
        vocab: tuple[str, ...] = WORDS,
        tokens_per_word: float = 1.0,
        salt: str = "",
    ) -> None:
        if not vocab or not tokens_per_word > 0:
            raise ValueError("a prompt vocabulary needs words and a positive tokens_per_word")
        self.tokenizer = tokenizer
        self.token_ids = token_ids and tokenizer is not None
        self.vocab = vocab
        self.tokens_per_word = tokens_per_word
        self.salt = salt
        self._cache: OrderedDict[tuple[str, int], Segment] = OrderedDict()

    def salted(self, key: str) -> str:
        """The key of ``key``'s word stream under this builder's salt."""
        return f"{self.salt}/{key}" if self.salt else key

    def _words(self, key: str, n: int) -> list[str]:
        return words(self.salted(key), n, self.vocab)

    def segment(self, key: str, n: int) -> Segment:
        hit = self._cache.get((key, n))
        if hit is not None:
            self._cache.move_to_end((key, n))
            return hit
        if self.tokenizer is not None:
            seg = self._exact(key, n)
        else:
            k = n if self.tokens_per_word == 1.0 else max(1, round(n / self.tokens_per_word))
            seg = Segment(" ".join(self._words(key, k)), None, n)
        self._cache[(key, n)] = seg
        if len(self._cache) > _CACHE_SEGMENTS:
            self._cache.popitem(last=False)
        return seg

    def _exact(self, key: str, n: int) -> Segment:
        tok = self.tokenizer
        assert tok is not None
        stream = self._words(key, 2 * n + 16)
        used = n
        text = " ".join(stream[:n])
        for _ in range(_MAX_ADJUST):
            ids = tok.encode(text)
            if len(ids) == n:
                return Segment(text, tuple(ids), n)
            if len(ids) > n:
                text = tok.decode(ids[:n])
            else:
                short = n - len(ids)
                if used + short > len(stream):
                    stream = self._words(key, 2 * (used + short))
                text = text + " " + " ".join(stream[used : used + short])
                used += short
        raise InferlabError(f"cannot make text of exactly {n} tokens with this tokenizer")

    def join(self, segments: list[Segment]) -> tuple[str | list[int], int]:
        """The prompt and its token count (exact for ids and for built-in words)."""
        if self.token_ids:
            ids = [i for s in segments for i in (s.ids or ())]
            return ids, len(ids)
        text = ""
        for s in segments:
            if text and s.text and not s.text.startswith(" "):
                text += " "
            text += s.text
        if self.tokenizer is not None and len(segments) > 1:
            return text, len(self.tokenizer.encode(text))
        return text, sum(s.tokens for s in segments)

    def prompt(self, key: str, n: int) -> tuple[str | list[int], int]:
        return self.join([self.segment(key, n)])
