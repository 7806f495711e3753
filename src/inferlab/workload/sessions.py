"""Multi-turn sessions: each turn's prompt is the conversation so far plus a new user
message, so the context grows with every answer (how prefix/KV caching is measured).

A session of ``turns`` turns sends its next turn ``think_time_s`` after the previous
answer ends. Closed loop: ``users`` users each run sessions back to back until all
``sessions`` are done. Open loop: sessions start at the schedule's arrival times. With
``context_window_tokens`` a sliding window keeps the system prompt and the most recent
history (whole user/answer pairs) within that many tokens, so its effect on TTFT can be
measured. ``bench`` answers with the server's text; ``sim run`` with simulated tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferlab._errors import UsageError
from inferlab.workload.lengths import LengthDist, sample_pair
from inferlab.workload.prompts import PromptBuilder
from inferlab.workload.spec import RequestSpec

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    pass


@dataclass(frozen=True)
class SessionConfig:
    """``sessions`` conversations of ``turns`` turns; each new user message has
    ``input_tokens`` tokens; an optional shared system prompt of ``system_tokens``."""

    sessions: int
    turns: int
    input_tokens: LengthDist
    output_tokens: LengthDist | None
    think_time_s: float = 0.0
    system_tokens: int = 0
    context_window_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise UsageError("--sessions and --turns must be at least 1")
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):  # (nan: no turn is ever due)
            raise UsageError(f"--think-time-s must be a finite number of seconds, 0 or more (got {self.think_time_s:g})")
        if self.system_tokens < 0:
            raise UsageError("--system-tokens cannot be negative")
        if self.context_window_tokens is not None and self.context_window_tokens < 0:
            raise UsageError("--context-window-tokens cannot be negative")
        if self.context_window_tokens is not None and self.turns > 1:
            # the window holds past exchanges (a user message and its answer), never part of one
            exchange = self.input_tokens.mean + (self.output_tokens.mean if self.output_tokens is not None else 0)
            if self.context_window_tokens < exchange:
                raise UsageError(
                    f"--context-window-tokens {self.context_window_tokens:,} holds no earlier exchange of these sessions "
                    f"(a user message and its answer: {exchange:,.0f} tokens on average), so every turn would be sent "
                    "without its history; give a window of at least that, or no window"
                )


@dataclass
class SessionWorkload:
    """The sessions of one run; ``session(i)`` starts conversation ``i``."""

    config: SessionConfig
    builder: PromptBuilder
    seed: int = 0
    exact_output: bool = True

    def session(self, index: int) -> Session:
        return Session(self, index)


@dataclass
class Session:
    """One conversation's state: history as ``(role, content, tokens)``."""

    workload: SessionWorkload
    index: int
    turn: int = 0
    history: list[tuple[str, str, int]] = field(default_factory=list)
    _pending: tuple[str, int] = ("", 0)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"session:{self.workload.seed}:{self.index}")

    @property
    def done(self) -> bool:
        return self.turn >= self.workload.config.turns

    def next_spec(self) -> RequestSpec:
        w, cfg = self.workload, self.workload.config
        n, out = sample_pair(cfg.input_tokens, cfg.output_tokens, self._rng)
        text = w.builder.segment(f"session:{w.seed}:{self.index}:{self.turn}", n).text
        system = w.builder.segment(f"system:{w.seed}", cfg.system_tokens).text if cfg.system_tokens else None
        self._pending = (text, n)
        return RequestSpec(
            text, out, w.exact_output and out is not None, n, system=system,
            context=tuple((r, c) for r, c, _ in self._window()), session=self.index, turn=self.turn,
        )

    def _window(self) -> list[tuple[str, str, int]]:
        limit = self.workload.config.context_window_tokens
        kept = self.history
        if limit is not None:
            while kept and sum(t for _, _, t in kept) > limit:
                kept = kept[2:]  # the oldest user message and its answer
        return kept

    def answer(self, text: str, tokens: int) -> None:
        """Record the answer to the turn just sent; the session moves to its next turn."""
        prompt, n = self._pending
        self.history += [("user", prompt, n), ("assistant", text, tokens)]
        self.turn += 1
