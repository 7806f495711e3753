"""The API front end as its own CPU resource, apart from the engine core.

A serving engine's API server (vLLM V1's ``AsyncLLM`` process, SGLang's tokenizer and
detokenizer managers) does two kinds of CPU work on one event loop: **intake** (HTTP,
validation, chat template, tokenization: a fixed cost plus a cost per prompt token) and
**streaming** (taking each engine step's outputs, then detokenizing every generated
token and writing its SSE chunk: a cost per step plus a cost per streamed token). Both
queue for the same CPU, first come first served, so a burst waits at the door and many
streams slow every stream's delivery, while the engine core keeps stepping at GPU speed. ``--api-server-count N`` runs N such servers; requests go to the
first free one and streaming work is shared evenly (the per-step cost is paid by each
server that streams some of the step's tokens: every server, unless a step emits fewer
tokens than there are servers). ``--host-speed F`` divides every CPU
cost by F (1.0: the typical host the family's costs are for; 2.0: a host twice as fast). A fixed latency per request (``api_overhead_s``: IPC and HTTP round
trips, not CPU on this queue) comes on top.

``FrontEnd`` is a clock, not a process: ``admit`` says when a request arriving at
``now_s`` reaches the engine, ``deliver`` when the tokens a step emits at ``end_s``
reach the client. Each server's CPU is a list of busy intervals, and each piece of work
takes the first idle stretch long enough for it from the time it is released: the calls
do not come in time order (a step's streaming is booked when the step starts, for when
it ends, before the requests that arrive while it runs), and a request that arrives
while a step runs is taken in at once when the server is idle then, not after the
streaming booked for the step's end. No piece of work moves one booked before it.
``forget_before(t)`` drops what ended before ``t``, the earliest time any later call can
name (the engine calls it with each step's start); work released earlier than that is
taken as released then.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FrontEndCosts:
    """Seconds of API-server CPU (at host speed 1.0) and the fixed latency per request."""

    latency_s: float  # per request, not on the CPU queue (HTTP, IPC round trips)
    intake_s: float  # CPU per request accepted (HTTP parse, validation, chat template)
    intake_per_token_s: float  # CPU per prompt token (tokenization)
    stream_per_token_s: float  # CPU per streamed token (detokenize, SSE chunk); 0: on the engine step
    # CPU per engine step that emits tokens, on every API server that streams some of them
    # (it takes the step's outputs as one message before streaming any)
    stream_per_step_s: float = 0.0

    @property
    def queues(self) -> bool:
        """Whether any cost takes CPU on the front end's queue."""
        return bool(self.intake_s or self.intake_per_token_s or self.stream_per_token_s or self.stream_per_step_s)


NO_FRONT_END = FrontEndCosts(0.0, 0.0, 0.0, 0.0)  # offline: no API server


class FrontEnd:
    """``servers`` API processes of ``costs`` on a host ``host_speed`` times the typical one."""

    def __init__(self, costs: FrontEndCosts, servers: int = 1, host_speed: float = 1.0) -> None:
        if servers < 1:
            raise ValueError("api_server_count must be at least 1")
        if not host_speed > 0:
            raise ValueError("host_speed must be positive")
        self.costs = costs
        self.servers = servers
        self.host_speed = host_speed
        self._cpus = [_BusyIntervals() for _ in range(servers)]
        self.busy_s = 0.0  # CPU seconds of work taken so far, all servers together

    def intake_cost_s(self, prompt_tokens: int) -> float:
        c = self.costs
        return (c.intake_s + c.intake_per_token_s * prompt_tokens) / self.host_speed

    def admit(self, now_s: float, prompt_tokens: int) -> float:
        """When a request of ``prompt_tokens`` arriving at ``now_s`` can be scheduled."""
        cost = self.intake_cost_s(prompt_tokens)
        if cost:
            # the server that is done with it first (the first of those, on a tie)
            cpu = min(self._cpus, key=lambda c: c.start_s(now_s, cost))
            now_s = cpu.book(now_s, cost)
            self.busy_s += cost
        return now_s + self.costs.latency_s

    def deliver(self, end_s: float, tokens: int) -> float:
        """When the ``tokens`` a step emitted at ``end_s`` have all reached their clients."""
        per_token, per_step = self.costs.stream_per_token_s, self.costs.stream_per_step_s
        if not (per_token or per_step) or tokens <= 0:
            return end_s
        # the tokens shared evenly; each server with a stream among them takes the step's
        # outputs for its streams (vLLM sends a step's outputs only to those): with fewer
        # tokens than servers, that many servers' per-step cost, shared evenly too
        share = (tokens * per_token + min(tokens, self.servers) * per_step) / self.servers / self.host_speed
        self.busy_s += share * self.servers
        return max(cpu.book(end_s, share) for cpu in self._cpus)

    def forget_before(self, t_s: float) -> None:
        """Drop the work that ended before ``t_s``: no later call names an earlier time."""
        for cpu in self._cpus:
            cpu.forget_before(t_s)


class _BusyIntervals:
    """One API server's CPU: the work booked on it as disjoint, time-ordered intervals
    (touching ones merged), and a horizon before which nothing is known any more."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._horizon_s = -math.inf

    def start_s(self, release_s: float, cost_s: float) -> float:
        """When work of ``cost_s`` released at ``release_s`` would start: at the first idle
        stretch of at least ``cost_s`` from then on."""
        return self._fit(release_s, cost_s)[0]

    def book(self, release_s: float, cost_s: float) -> float:
        """Book work of ``cost_s`` released at ``release_s``; returns when it is done."""
        start, i = self._fit(release_s, cost_s)
        end = start + cost_s
        starts, ends = self._starts, self._ends
        joins_before = i > 0 and ends[i - 1] >= start - _TOUCH_S
        joins_after = i < len(starts) and starts[i] <= end + _TOUCH_S
        if joins_before and joins_after:  # fills a gap exactly: one interval of three
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_before:
            ends[i - 1] = end
        elif joins_after:
            starts[i] = start
        else:
            starts.insert(i, start)
            ends.insert(i, end)
        return end

    def _fit(self, release_s: float, cost_s: float) -> tuple[float, int]:
        """The start of the first idle stretch of ``cost_s`` from ``release_s`` on, and the
        index of the first interval after it."""
        start = max(release_s, self._horizon_s)
        starts, ends = self._starts, self._ends
        i = bisect.bisect_right(ends, start)  # the first interval still busy after ``start``
        while i < len(starts) and starts[i] < start + cost_s:
            start = max(start, ends[i])
            i += 1
        return start, i

    def forget_before(self, t_s: float) -> None:
        k = bisect.bisect_left(self._ends, t_s)
        if k:
            del self._starts[:k], self._ends[:k]
        self._horizon_s = max(self._horizon_s, t_s)


_TOUCH_S = 1e-12  # intervals this close are one
