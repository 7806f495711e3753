"""What the simulated model writes, and where a request's stop strings and stop token ids
end it, found before the request reaches the engine (which decides lengths in tokens).

The model writes the tokenizer's output passage, cycled: token ``i`` is
``tokenizer.output_token(i)`` and its text ``output_piece(i)``. The text is periodic, so
where a stop string first appears is a search over one period or two, whatever the
request's token limit.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from inferlab.openai.response import TokenLogprob
from inferlab.workload.text import PASSAGE
from inferlab.workload.tokenizers import Tokenizer


@dataclass(frozen=True)
class Stop:
    """Where a stop ends an answer: after ``tokens`` generated tokens, with the text cut
    at character ``text_chars``; ``reason`` is the stop string or token id (vLLM's
    ``stop_reason``)."""

    tokens: int
    text_chars: int
    reason: str | int


class OutputText:
    """The simulated model's output for one tokenizer (built once per server)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        # Both tokenizers cycle through the passage's tokens (``output_token``).
        self.period = max(1, len(tokenizer.encode(PASSAGE)))
        if any(tokenizer.output_token(i + self.period) != tokenizer.output_token(i) for i in range(self.period)):
            raise ValueError("the tokenizer's output tokens do not cycle through the passage")
        self.pieces = [tokenizer.output_piece(i) for i in range(self.period)]
        self.cycle = "".join(self.pieces)
        #: ``_ends[j]``: characters in the first ``j`` tokens of a period
        self._ends = [0]
        for piece in self.pieces:
            self._ends.append(self._ends[-1] + len(piece))
        self._positions: dict[int, list[int]] = {}
        for i in range(self.period):
            self._positions.setdefault(tokenizer.output_token(i), []).append(i)

    def chars(self, tokens: int) -> int:
        """Characters in the text of the first ``tokens`` tokens."""
        q, r = divmod(tokens, self.period)
        return q * len(self.cycle) + self._ends[r]

    def text(self, start: int, end: int) -> str:
        """Characters ``start`` to ``end`` (exclusive) of the output text."""
        size = len(self.cycle)
        if end <= start or not size:
            return ""
        offset = start % size
        return (self.cycle[offset:] + self.cycle * ((end - start) // size + 1))[: end - start]

    def _tokens_to_reach(self, chars: int) -> int:
        """The fewest tokens whose text holds at least ``chars`` (≥ 1) characters."""
        q = (chars - 1) // len(self.cycle)
        return q * self.period + bisect.bisect_left(self._ends, chars - q * len(self.cycle))

    def _find(self, s: str, start: int) -> int | None:
        """Where ``s`` first occurs at or after character ``start``, or None if never."""
        size = len(self.cycle)
        if not size:
            return None
        # Periodic text: if ``s`` starts nowhere in [start, start + size) it starts nowhere
        # after ``start``; the window holds every such start with ``s`` after it.
        offset = start % size
        window = self.cycle[offset:] + self.cycle * (len(s) // size + 2)
        j = window.find(s)
        return None if j < 0 else start + j

    def stop(self, stops: Sequence[str], stop_token_ids: Sequence[int], min_tokens: int) -> Stop | None:
        """The first stop that ends the output, as vLLM finds it, or None if none ever does.

        After each token past ``min_tokens``, vLLM looks for each stop string, in the
        request's order, in the text that token completed, and cuts the text where the
        first one found begins; a stop token ends the output at once, its own text left
        out (vLLM leaves out a stop token's text, like EOS's). A stop string found at the
        token that is a stop token was completed by it, so the token, whose text vLLM
        never checks, wins."""
        found: Stop | None = None
        floor = self.chars(min_tokens)
        for s in stops:
            start = self._find(s, max(0, floor - len(s) + 1))  # ending after ``floor``
            if start is None:
                continue
            tokens = self._tokens_to_reach(start + len(s))
            if found is None or tokens < found.tokens:
                found = Stop(tokens, start, s)
        q, r = divmod(min_tokens, self.period)
        for token_id in stop_token_ids:
            positions = self._positions.get(token_id)
            if not positions:
                continue
            j = bisect.bisect_left(positions, r)
            index = q * self.period + positions[j] if j < len(positions) else (q + 1) * self.period + positions[0]
            if found is None or index + 1 <= found.tokens:
                found = Stop(index + 1, self.chars(index), token_id)
        return found


class LogprobTable:
    """Deterministic, plausible log-probabilities for the simulated model's tokens.

    The model is greedy: each token is the most likely at its place, with a probability
    between 0.4 and 0.99 fixed by its place in the passage; the other candidates are
    other words of the passage, each with 0.4 of the one before it, so the candidates'
    probabilities sum to less than 1."""

    def __init__(self, output: OutputText, most: int) -> None:
        self._output = output
        self._most = most
        self._table: dict[int, TokenLogprob] = {}

    def token(self, index: int, top: int) -> TokenLogprob:
        """Token ``index``'s text, logprob and its ``top`` (≤ ``most``) most likely tokens."""
        text, logprob, alternatives = self._entry(index % self._output.period)
        return text, logprob, alternatives[:top]

    def _entry(self, position: int) -> TokenLogprob:
        entry = self._table.get(position)
        if entry is None:
            pieces = self._output.pieces
            rng = random.Random(position)
            p = 0.4 + 0.59 * rng.random()
            chosen = pieces[position]
            top = [(chosen, math.log(p))]
            seen = {chosen}
            rest = 0.6 * (1 - p)
            for _ in range(4 * self._most):  # enough draws to find ``most`` distinct words
                if len(top) > self._most:
                    break
                piece = pieces[rng.randrange(len(pieces))]
                if piece not in seen:
                    seen.add(piece)
                    top.append((piece, math.log(rest)))
                    rest *= 0.4
            entry = self._table[position] = (chosen, top[0][1], top)
        return entry
