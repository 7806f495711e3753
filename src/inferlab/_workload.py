"""What is sent: request specs, with nothing about timing.

A workload is any iterable of ``RequestSpec``; ``bench`` and ``sim run`` consume the
same objects. This module holds the built-in ones: synthetic prompts of a given length,
a fixed prompt, and the default quick check.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from inferlab._text import WORDS

Api = Literal["chat", "completions"]

DEFAULT_PROMPT = "Explain RAG in about 30 characters."


@dataclass(frozen=True)
class RequestSpec:
    """One request's content. ``prompt`` is text (or token ids for the completions API).

    ``max_tokens`` None lets the server decide when to stop. ``exact_output`` asks the
    server to generate exactly ``max_tokens`` (``ignore_eos`` and ``min_tokens``), where
    it supports that. ``input_tokens`` is the length the workload aimed for, if any.
    """

    prompt: str | list[int]
    max_tokens: int | None = None
    exact_output: bool = False
    input_tokens: int | None = None
    system: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, str]]:
        if not isinstance(self.prompt, str):
            raise TypeError("token-id prompts can only be sent to the completions API")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.prompt}]


def synthetic_text(num_words: int, rng: random.Random) -> str:
    """``num_words`` random built-in words, each with a leading space except the first.

    Each word is one token for the simulator's tokenizer and, for nearly all words, for
    BPE tokenizers; exact lengths with any tokenizer are the tokenizers issue's job.
    """
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


@dataclass(frozen=True)
class SyntheticWorkload:
    """Random prompts of ``input_tokens`` words, asking for ``output_tokens`` tokens."""

    input_tokens: int
    output_tokens: int | None
    seed: int = 0
    exact_output: bool = True

    def __iter__(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        while True:
            yield RequestSpec(
                prompt=synthetic_text(self.input_tokens, rng),
                max_tokens=self.output_tokens,
                exact_output=self.exact_output and self.output_tokens is not None,
                input_tokens=self.input_tokens,
            )


@dataclass(frozen=True)
class FixedPromptWorkload:
    """The same prompt every time (the default is the classic RAG quick check)."""

    prompt: str = DEFAULT_PROMPT
    output_tokens: int | None = None
    exact_output: bool = True

    def __iter__(self) -> Iterator[RequestSpec]:
        spec = RequestSpec(
            prompt=self.prompt,
            max_tokens=self.output_tokens,
            exact_output=self.exact_output and self.output_tokens is not None,
        )
        while True:
            yield spec
