"""The API front end as its own CPU resource, apart from the engine core.

A serving engine's API server (vLLM V1's ``AsyncLLM`` process, SGLang's tokenizer and
detokenizer managers) does two kinds of CPU work on one event loop: **intake** (HTTP,
validation, chat template, tokenization: a fixed cost plus a cost per prompt token) and
**streaming** (taking each engine step's outputs, then detokenizing every generated
token and writing its SSE chunk: a cost per step plus a cost per streamed token). Both
share the same CPU, so a burst waits at the door and many streams slow every stream's
delivery, while the engine core keeps stepping at GPU speed. ``--api-server-count N``
runs N such servers; a request goes to the one that would be done with it first, and
streaming work is shared evenly (the per-step cost is paid by each server that streams
some of the step's tokens: every server, unless a step emits fewer tokens than there
are servers). ``--host-speed F`` divides every CPU cost by F (1.0: the typical host the
family's costs are for; 2.0: a host twice as fast). A fixed latency per request
(``api_overhead_s``: IPC and HTTP round trips, not CPU on this queue) comes on top.

``FrontEnd`` is a clock, not a process: ``admit`` says when a request arriving at
``now_s`` reaches the engine, ``deliver`` when the tokens a step emits at ``end_s``
reach the client. The calls do not come in time order: a step's streaming is booked
when the step starts, for when it ends, before the requests that arrive while it runs.
So each server's CPU is a list of busy intervals, and each piece of work runs in every
idle stretch from its release on until its CPU time is spent, around what was booked
before it (an event loop interleaves a request's intake, which awaits between its
parts, with a step's streaming): a request that arrives while a step runs is taken in
at once, not after the streaming booked for the step's end, and the CPU never idles
while released work waits. What was booked first keeps its times: its tokens' delivery
was already reported. ``forget_before(t)`` drops what ended before ``t``, the earliest
time any later call can name (the engine calls it with each step's start); work
released earlier than that is taken as released then.
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
            cpu = min(self._cpus, key=lambda c: c.finish_s(now_s, cost))
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
    (touching ones merged), and a horizon before which nothing is known any more. Work
    runs in every idle stretch from its release on until its CPU time is spent, around
    the work booked before it: an event loop interleaving a request's intake with a
    step's streaming, which awaits between its parts."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._horizon_s = -math.inf

    def finish_s(self, release_s: float, cost_s: float) -> float:
        """When work of ``cost_s`` released at ``release_s`` would be done."""
        t = max(release_s, self._horizon_s)
        if not self._ends or t >= self._ends[-1]:  # after everything booked: at once
            return t + cost_s
        return self._pieces(release_s, cost_s)[0]

    def book(self, release_s: float, cost_s: float) -> float:
        """Book work of ``cost_s`` released at ``release_s``; returns when it is done."""
        starts, ends = self._starts, self._ends
        t = max(release_s, self._horizon_s)
        if not ends or t >= ends[-1]:  # after everything booked (the common case)
            if ends and t <= ends[-1] + _TOUCH_S:
                ends[-1] = t + cost_s
            else:
                starts.append(t)
                ends.append(t + cost_s)
            return t + cost_s
        end, first, last, pieces = self._pieces(release_s, cost_s)
        # the pieces and the intervals between them, with a touching neighbour each side,
        # merged into one run of intervals in place of those they cover
        lo, hi = first, last
        if lo > 0 and pieces and ends[lo - 1] >= pieces[0][0] - _TOUCH_S:
            lo -= 1
        if hi < len(starts) and pieces and starts[hi] <= pieces[-1][1] + _TOUCH_S:
            hi += 1
        spans = sorted([*zip(starts[lo:hi], ends[lo:hi], strict=True), *pieces])
        merged: list[list[float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1] + _TOUCH_S:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        starts[lo:hi] = [a for a, _ in merged]
        ends[lo:hi] = [b for _, b in merged]
        return end

    def _pieces(self, release_s: float, cost_s: float) -> tuple[float, int, int, list[tuple[float, float]]]:
        """Where work of ``cost_s`` released at ``release_s`` runs: (its end, the index of
        the first interval after its release, the index of the first after its end, the
        idle stretches it takes)."""
        t = max(release_s, self._horizon_s)
        starts, ends = self._starts, self._ends
        first = k = bisect.bisect_right(ends, t)  # the first interval still busy after ``t``
        pieces: list[tuple[float, float]] = []
        left = cost_s
        while left > _TOUCH_S:  # (a rounding residue of a gap filled exactly is no work)
            if k < len(starts) and starts[k] <= t + _TOUCH_S:  # busy: wait for it
                t = max(t, ends[k])
                k += 1
                continue
            use = min(left, (starts[k] if k < len(starts) else math.inf) - t)
            pieces.append((t, t + use))
            left -= use
            t += use
        return t, first, k, pieces

    def forget_before(self, t_s: float) -> None:
        k = bisect.bisect_left(self._ends, t_s)
        if k:
            del self._starts[:k], self._ends[:k]
        self._horizon_s = max(self._horizon_s, t_s)


_TOUCH_S = 1e-9  # intervals this close are one (a nanosecond: above float spacing for months of run)
