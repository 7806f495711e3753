"""What is sent: request specs, with nothing about timing.

A workload is any iterable of ``RequestSpec``; ``bench`` and ``sim run`` consume the
same objects. This module holds the built-in ones: synthetic prompts with drawn lengths, shared-prefix
groups, and a fixed prompt (the default quick check). Traces live in ``workload.traces``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
    ``prefix_group`` names the prompts that start alike: those of a group share their
    first ``prefix_tokens`` tokens (None: the whole prompt, the same every time); a run
    records both, so that a replay shares what the run shared. ``hash_ids`` are a
    Mooncake trace row's blocks (each ``MOONCAKE_BLOCK_TOKENS`` tokens; equal ids, equal
    text), recorded for the same reason.
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
    prefix_group: str | None = None
    prefix_tokens: int | None = None
    hash_ids: tuple[int, ...] = ()

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
class Measured:
    """What a trace says one request measured on a real server (ms; None: not given)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class TimedSpec:
    """A request with a fixed arrival time, in seconds from the run's start (traces);
    ``measured`` holds the trace's own latencies for it, when the trace has them.
    ``user``: the closed-loop user that sent it (a run's ``requests.jsonl``): a replay
    sends a user's requests one after another, each when the previous one ends.
    ``warmup``: a warm-up request of the recorded run (replayed as a warm-up)."""

    arrival_s: float
    spec: RequestSpec
    measured: Measured | None = None
    user: int | None = None
    warmup: bool = False


@dataclass(frozen=True)
class Trace:
    """A replayed trace: requests at fixed arrival times, in time order, compressed by
    ``speedup`` (``TraceConfig``'s); ``notes``: what the summary says of how its rows
    were sent."""

    requests: tuple[TimedSpec, ...]
    speedup: float = 1.0
    notes: tuple[str, ...] = ()  # the summary's warnings on how its rows were sent

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TimedSpec]:
        return iter(self.requests)
