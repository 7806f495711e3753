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

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferlab._clock import NS_PER_S, Clock
from inferlab._errors import UsageError
from inferlab._lengths import LengthDist
from inferlab._prompts import PromptBuilder
from inferlab._records import RequestRecord
from inferlab._runner import LoadConfig, RunResult
from inferlab._schedule import OpenLoop
from inferlab._workload import RequestSpec

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    from inferlab._client import Endpoint


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
        if self.think_time_s < 0:
            raise UsageError("--think-time-s cannot be negative")
        if self.system_tokens < 0:
            raise UsageError("--system-tokens cannot be negative")
        if self.context_window_tokens is not None and self.context_window_tokens < 0:
            raise UsageError("--context-window-tokens cannot be negative")


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
        n = cfg.input_tokens.sample(self._rng)
        out = None if cfg.output_tokens is None else cfg.output_tokens.sample(self._rng)
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


OnRecord = Callable[[RequestRecord], None]


async def run_sessions(
    endpoint: Endpoint, load: LoadConfig, workload: SessionWorkload, clock: Clock,
    *, users: int, on_record: OnRecord | None = None, stop: asyncio.Event | None = None,
) -> RunResult:
    """Run the sessions against ``endpoint``: ``users`` closed-loop users, or sessions
    arriving at an ``OpenLoop`` schedule's times. ``load.duration_s`` stops new turns."""
    import aiohttp

    from inferlab._client import Client

    result = RunResult()
    cfg = workload.config
    counter = iter(range(1 << 62))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        result.t0_ns = t0 = clock.now_ns()
        client = Client(endpoint, clock, http, t0)
        deadline = None if load.duration_s is None else t0 + int(load.duration_s * NS_PER_S)

        async def converse(index: int, start_ns: int) -> None:
            s = workload.session(index)
            due = start_ns
            while not s.done and (deadline is None or due < deadline):
                await clock.sleep_until_ns(due)
                spec = s.next_spec()
                record = RequestRecord(index=next(counter), intended_send_ns=due - t0)
                text: list[str] = []
                try:
                    await client.send(spec, record, text)
                finally:
                    result.records.append(record)
                    if on_record is not None:
                        on_record(record)
                if not record.ok:
                    return  # a failed turn ends its session: its context is unknown
                s.answer("".join(text), record.output_tokens or len(record.content_ns))
                due = clock.now_ns() + int(cfg.think_time_s * NS_PER_S)

        body: asyncio.Future[list[None]]
        if isinstance(load.schedule, OpenLoop):
            times = load.schedule.arrival_times_s(load.seed, cfg.sessions, None)
            body = asyncio.gather(*(converse(i, t0 + int(t * NS_PER_S)) for i, t in enumerate(times)))
        else:
            queue = iter(range(cfg.sessions))

            async def user() -> None:
                for i in queue:
                    await converse(i, clock.now_ns())

            body = asyncio.gather(*(user() for _ in range(min(users, cfg.sessions))))
        main: asyncio.Future[Any] = asyncio.ensure_future(body)
        waiter: asyncio.Future[Any] | None = asyncio.ensure_future(stop.wait()) if stop is not None else None
        await asyncio.wait([main, *([waiter] if waiter else [])], return_when="FIRST_COMPLETED")
        if not main.done():
            result.interrupted = True
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
        if waiter is not None:
            waiter.cancel()
    result.records.sort(key=lambda r: r.index)
    return result
