"""What is sent: request specs, with nothing about timing.

A workload is any iterable of ``RequestSpec``; ``bench`` and ``sim run`` consume the
same objects. This module holds the built-in ones: synthetic prompts with drawn lengths, shared-prefix
groups, and a fixed prompt (the default quick check). Traces live in ``_traces``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from inferlab._errors import UsageError
from inferlab._lengths import LengthDist
from inferlab._prompts import PromptBuilder

Api = Literal["chat", "completions"]

DEFAULT_PROMPT = "Explain RAG in about 30 characters."


@dataclass(frozen=True)
class RequestSpec:
    """One request's content. ``prompt`` is text (or token ids for the completions API).

    ``max_tokens`` None lets the server decide when to stop. ``exact_output`` asks the
    server to generate exactly ``max_tokens`` (``ignore_eos`` and ``min_tokens``), where
    it supports that. ``input_tokens`` is the length the workload aimed for, if any.
    ``context`` holds earlier ``(role, content)`` messages (a dataset's conversation, a
    session's previous turns) between the system prompt and ``prompt``, the new user
    message. ``session``/``turn`` identify a multi-turn session's request.
    """

    prompt: str | list[int]
    max_tokens: int | None = None
    exact_output: bool = False
    input_tokens: int | None = None
    system: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    context: tuple[tuple[str, str], ...] = ()
    session: int | None = None
    turn: int | None = None

    def messages(self) -> list[dict[str, str]]:
        if not isinstance(self.prompt, str):
            raise TypeError("token-id prompts can only be sent to the completions API")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs += [{"role": r, "content": c} for r, c in self.context]
        return [*msgs, {"role": "user", "content": self.prompt}]

    def completion_prompt(self) -> str | list[int]:
        """The prompt for the completions API: with a system prompt or context, the
        messages' contents joined by blank lines (no template)."""
        if not isinstance(self.prompt, str) or (not self.system and not self.context):
            return self.prompt
        return "\n\n".join(m["content"] for m in self.messages())


@dataclass(frozen=True)
class SyntheticWorkload:
    """Random prompts with lengths from ``input_tokens``, asking for ``output_tokens``
    (``None``: the server decides). Lengths are exact with a tokenizer in ``builder``
    or against the simulator; about right for BPE tokenizers otherwise."""

    input_tokens: LengthDist
    output_tokens: LengthDist | None
    seed: int = 0
    exact_output: bool = True
    builder: PromptBuilder = field(default_factory=PromptBuilder, compare=False)

    def __iter__(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        for i in itertools.count():
            n = self.input_tokens.sample(rng)
            out = None if self.output_tokens is None else self.output_tokens.sample(rng)
            prompt, _ = self.builder.prompt(f"synthetic:{self.seed}:{i}", n)
            yield RequestSpec(prompt, out, self.exact_output and out is not None, n)


def zipf_weights(n: int, a: float) -> list[float]:
    """Popularity of ``n`` items ranked 1..n under Zipf with exponent ``a`` (0 = uniform)."""
    return [1.0 / (k ** a) for k in range(1, n + 1)]


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """``groups`` shared prefixes of ``prefix_tokens`` tokens, each request one group's
    prefix plus its own ``suffix_tokens``. Group popularity is uniform (``zipf_a`` 0) or
    Zipf with exponent ``zipf_a``: how prefix/KV caching is measured."""

    groups: int
    prefix_tokens: int
    suffix_tokens: LengthDist
    output_tokens: LengthDist | None
    zipf_a: float = 0.0
    seed: int = 0
    exact_output: bool = True
    builder: PromptBuilder = field(default_factory=PromptBuilder, compare=False)

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise UsageError("--prefix-groups must be at least 1")
        if self.prefix_tokens < 1:
            raise UsageError("--prefix-tokens must be at least 1")
        if self.zipf_a < 0:
            raise UsageError("the Zipf exponent cannot be negative")

    def __iter__(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        weights = zipf_weights(self.groups, self.zipf_a)
        groups = range(self.groups)
        for i in itertools.count():
            g = rng.choices(groups, weights)[0]
            s = self.suffix_tokens.sample(rng)
            out = None if self.output_tokens is None else self.output_tokens.sample(rng)
            segs = [
                self.builder.segment(f"prefix:{self.seed}:{g}", self.prefix_tokens),
                self.builder.segment(f"suffix:{self.seed}:{i}", s),
            ]
            prompt, n = self.builder.join(segs)
            yield RequestSpec(prompt, out, self.exact_output and out is not None, n)


@dataclass(frozen=True)
class FixedPromptWorkload:
    """The same prompt every time (the default is the classic RAG quick check)."""

    prompt: str = DEFAULT_PROMPT
    output_tokens: LengthDist | None = None
    exact_output: bool = True
    seed: int = 0

    def __iter__(self) -> Iterator[RequestSpec]:
        rng = random.Random(self.seed)
        while True:
            out = None if self.output_tokens is None else self.output_tokens.sample(rng)
            yield RequestSpec(self.prompt, out, self.exact_output and out is not None)


@dataclass(frozen=True)
class Measured:
    """What a trace says one request measured on a real server (ms; None: not given)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class TimedSpec:
    """A request with a fixed arrival time, in seconds from the run's start (traces);
    ``measured`` holds the trace's own latencies for it, when the trace has them."""

    arrival_s: float
    spec: RequestSpec
    measured: Measured | None = None
