"""Token-length distributions for prompts and outputs, parsed from one short spec.

Specs: ``500`` (fixed), ``uniform:100:900`` (inclusive), ``normal:500:100`` (mean,
std), ``lognormal:500:0.6`` (median, sigma), or an empirical list of observed lengths
(from a dataset: ``empirical:PATH`` draws the input lengths of a dataset file's
prompts for ``--input-tokens``, its output lengths for ``--output-tokens``; word
counts, see ``workload.datasets``; ``empirical:sharegpt`` draws from the shipped token lengths
of ShareGPT V3 as vLLM's benchmark samples it, see ``workload.sharegpt``). Every draw is an int >= 1; draws come from the caller's seeded
``random.Random``, so the same seed gives the same lengths.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from inferlab._errors import UsageError

Kind = Literal["fixed", "uniform", "normal", "lognormal", "empirical"]

_USAGE = "expected N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"

#: The longest length a spec may ask for (at its 99.9th percentile): past every model's
#: context, and a prompt of it is gigabytes of text to build. A larger one is refused, not
#: drawn; the rare draw of a spec within it that lands beyond is cut to it.
MAX_LENGTH_TOKENS = 10_000_000
_Z999 = 3.09  # the standard normal's 99.9th percentile


#: A normal spec whose draws held to >= 1 token would move its mean by more than this
#: share is refused: the lengths sent would not be the ones asked for.
_NORMAL_MEAN_SHIFT = 0.02


def _held_normal_mean(mean: float, std: float) -> float:
    """The mean of max(1, X) for X ~ N(mean, std): what a normal spec's draws average."""
    if std == 0:
        return max(1.0, mean)
    z, unit = (1 - mean) / std, NormalDist()
    return unit.cdf(z) + mean * (1 - unit.cdf(z)) + std * unit.pdf(z)


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts. ``a``/``b`` are the kind's two parameters
    (fixed: ``a``; uniform: low, high; normal: mean, std; lognormal: median, sigma);
    ``values`` holds the observed lengths of an empirical one."""

    kind: Kind
    a: float = 0.0
    b: float = 0.0
    values: tuple[int, ...] = ()
    # an empirical one's source (``empirical:SOURCE``) and its rows' (input, output)
    # lengths where both are known: an input and an output distribution of one source
    # draw a request's two lengths from one row (``sample_pair``), as vLLM's sampler does
    source: str = ""
    pairs: tuple[tuple[int, int], ...] = ()

    @property
    def mean(self) -> float:
        """The distribution's mean (a normal one's before its draws are held to >= 1,
        within 2 % of theirs: ``parse_length`` refuses a spec where it is not)."""
        if self.kind in ("fixed", "normal"):
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return sum(self.values) / len(self.values) if self.values else 0.0

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.kind == "normal":
            return min(MAX_LENGTH_TOKENS, max(1, round(rng.gauss(self.a, self.b))))
        if self.kind == "lognormal":
            return min(MAX_LENGTH_TOKENS, max(1, round(rng.lognormvariate(math.log(self.a), self.b))))
        return rng.choice(self.values)

    def cdf(self) -> Callable[[int], float]:
        """The share of draws of at most ``k`` tokens, drawn as ``sample`` draws them
        (normal and lognormal: rounded to the nearest length, held to 1 ..
        ``MAX_LENGTH_TOKENS``; empirical: its values counted)."""
        if self.kind == "empirical":
            ordered, n = sorted(self.values), len(self.values)
            return lambda k: bisect.bisect_right(ordered, k) / n
        if self.kind == "uniform":
            lo, width = int(self.a), int(self.b) - int(self.a) + 1
            return lambda k: min(1.0, max(0.0, (k - lo + 1) / width))
        if self.kind == "fixed" or self.b == 0:  # (one length)
            only = int(self.a) if self.kind == "fixed" else min(MAX_LENGTH_TOKENS, max(1, round(self.a)))
            return lambda k: 1.0 if k >= only else 0.0
        log = self.kind == "lognormal"
        dist = NormalDist(math.log(self.a), self.b) if log else NormalDist(self.a, self.b)

        def held(k: int) -> float:  # (round(x) <= k where x < k + 0.5)
            if k < 1:
                return 0.0
            return 1.0 if k >= MAX_LENGTH_TOKENS else dist.cdf(math.log(k + 0.5) if log else k + 0.5)
        return held

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "empirical":
            return f"empirical({len(self.values)} values)"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def empirical(values: list[int], flag: str = "lengths", source: str = "",
              pairs: tuple[tuple[int, int], ...] = ()) -> LengthDist:
    if not values:
        raise UsageError(f"{flag}: no lengths to draw from")
    return LengthDist("empirical", values=tuple(values), source=source, pairs=pairs)


def sample_pair(inputs: LengthDist, outputs: LengthDist | None, rng: random.Random) -> tuple[int, int | None]:
    """A request's input and output lengths: from one row of their source when both are
    ``empirical:`` of the same one (its prompt with its own answer's length), else each
    drawn on its own."""
    if outputs is not None and inputs.pairs and inputs.source == outputs.source and inputs.kind == outputs.kind == "empirical":
        return rng.choice(inputs.pairs)
    return inputs.sample(rng), None if outputs is None else outputs.sample(rng)


def parse_length(spec: int | str | LengthDist, flag: str = "--input-tokens") -> LengthDist:
    """Parse a spec; ``UsageError`` naming ``flag`` if it is malformed or not positive."""
    if isinstance(spec, LengthDist):
        return spec
    if isinstance(spec, int):
        if spec < 1:
            raise UsageError(f"{flag} must be at least 1")
        if spec > MAX_LENGTH_TOKENS:
            raise UsageError(f"{flag} {spec}: at most {MAX_LENGTH_TOKENS:,} tokens")
        return LengthDist("fixed", float(spec))
    if spec.strip().lower().startswith("empirical:"):
        source = spec.strip()[len("empirical:"):]
        if source.lower() == "sharegpt":  # the shipped table (a file: ./sharegpt)
            from inferlab.workload.sharegpt import sharegpt_lengths

            ins, outs = sharegpt_lengths()
            pairs = tuple((i, o) for i, o in zip(ins, outs, strict=True) if o > 0)
            inputs, outputs = list(ins), [o for o in outs if o > 0]
        else:
            from inferlab.workload.datasets import (
                dataset_lengths,  # lazy: datasets import this module
            )

            inputs, outputs, pairs = dataset_lengths(source)
        key = "sharegpt" if source.lower() == "sharegpt" else source
        return empirical(outputs if "output" in flag else inputs, f"{flag} {spec}", key, pairs)
    text = spec.strip().lower()
    kind, _, rest = text.partition(":")
    if not rest:
        try:
            return parse_length(int(text), flag)
        except ValueError:
            raise UsageError(f"{flag} {spec!r}: {_USAGE}") from None
    parts = rest.split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise UsageError(f"{flag} {spec!r}: parameters must be numbers ({_USAGE})") from None
    if not all(math.isfinite(n) for n in nums):  # inf, nan, 1e400: no length to draw
        raise UsageError(f"{flag} {spec!r}: parameters must be finite numbers ({_USAGE})")
    if kind not in ("uniform", "normal", "lognormal") or len(nums) != 2:
        raise UsageError(f"{flag} {spec!r}: {_USAGE}")
    a, b = nums
    if kind == "uniform" and not (1 <= a <= b and a == int(a) and b == int(b)):
        raise UsageError(f"{flag} {spec!r}: uniform needs integers 1 <= LO <= HI")
    if kind == "normal" and not (a >= 1 and b >= 0):
        raise UsageError(f"{flag} {spec!r}: normal needs MEAN >= 1 and STD >= 0")
    if kind == "lognormal" and not (a >= 1 and b >= 0):
        raise UsageError(f"{flag} {spec!r}: lognormal needs MEDIAN >= 1 and SIGMA >= 0")
    p999 = {"uniform": b, "normal": a + _Z999 * b, "lognormal": a * math.exp(min(_Z999 * b, 700.0))}[kind]
    if p999 > MAX_LENGTH_TOKENS:
        raise UsageError(f"{flag} {spec!r}: asks for lengths past {MAX_LENGTH_TOKENS:,} tokens "
                         f"(its 99.9th percentile is {p999:,.3g}); no model takes them")
    if kind == "normal" and abs((held := _held_normal_mean(a, b)) - a) > _NORMAL_MEAN_SHIFT * a:
        raise UsageError(f"{flag} {spec!r}: {NormalDist(a, b).cdf(1):.0%} of its draws fall below 1 token and would "
                         f"be held to 1, a mean of {held:,.3g}, not {a:g}; use a smaller STD, or lognormal:MEDIAN:SIGMA "
                         "for lengths skewed to the right")
    return LengthDist(kind, a, b)  # type: ignore[arg-type]  # kind checked just above
