"""Built-in workloads: synthetic prompts with drawn lengths, shared-prefix groups, and a
fixed prompt (the default quick check). Each is an endless iterable of ``RequestSpec``."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from inferlab._errors import UsageError
from inferlab.workload.lengths import LengthDist, sample_pair
from inferlab.workload.prompts import PromptBuilder
from inferlab.workload.spec import DEFAULT_PROMPT, RequestSpec


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
            n, out = sample_pair(self.input_tokens, self.output_tokens, rng)
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
            yield RequestSpec(
                prompt, out, self.exact_output and out is not None, n,
                prefix_group=str(g), prefix_tokens=self.prefix_tokens,
            )


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
            yield RequestSpec(self.prompt, out, self.exact_output and out is not None, prefix_group="fixed")
