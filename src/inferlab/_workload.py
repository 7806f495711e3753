"""What is sent: request specs, with nothing about timing.

A workload is any iterable of ``RequestSpec``; ``bench`` and ``sim run`` consume the
same objects. This module holds the built-in ones: synthetic prompts of a given length,
a fixed prompt, and the default quick check.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from inferlab._errors import UsageError
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
        return [*msgs, {"role": "user", "content": self.prompt}]


def synthetic_text(num_words: int, rng: random.Random) -> str:
    """``num_words`` random built-in words, each with a leading space except the first.

    Each word is one token for the simulator's tokenizer and, for nearly all words, for
    BPE tokenizers; exact lengths with any tokenizer are the tokenizers issue's job.
    """
    return " ".join(rng.choices(WORDS, k=num_words))


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


@dataclass(frozen=True)
class TimedSpec:
    """A request with a fixed arrival time, in seconds from the run's start (traces)."""

    arrival_s: float
    spec: RequestSpec


def read_trace_jsonl(path: str, seed: int = 0, exact_output: bool = True) -> list[TimedSpec]:
    """Our trace format: one JSON object a line with ``arrival_s``, ``input_tokens`` and
    ``output_tokens``. Prompts are synthetic built-in words of that length. A bad line
    raises ``UsageError`` naming the file, line and problem."""
    rng = random.Random(seed)
    out: list[TimedSpec] = []
    try:
        f = open(path)  # noqa: SIM115
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                t = float(row["arrival_s"])
                inp = int(row["input_tokens"])
                outp = int(row["output_tokens"])
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{path}:{n}: expected arrival_s, input_tokens, output_tokens ({e})") from e
            if t < 0 or inp < 1 or outp < 1:
                raise UsageError(f"{path}:{n}: arrival_s must be >= 0 and token counts >= 1")
            spec = RequestSpec(synthetic_text(inp, rng), outp, exact_output, inp)
            out.append(TimedSpec(t, spec))
    if not out:
        raise UsageError(f"{path}: the trace has no requests")
    t0 = min(t.arrival_s for t in out)
    return sorted((TimedSpec(t.arrival_s - t0, t.spec) for t in out), key=lambda t: t.arrival_s)
