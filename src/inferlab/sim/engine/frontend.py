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
reach the client. Calls come in time order (the engine's steps and arrivals).
"""

from __future__ import annotations

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
        self._free_s = [0.0] * servers  # when each server has done all its work so far
        self.busy_s = 0.0  # CPU seconds of work taken so far, all servers together

    def intake_cost_s(self, prompt_tokens: int) -> float:
        c = self.costs
        return (c.intake_s + c.intake_per_token_s * prompt_tokens) / self.host_speed

    def admit(self, now_s: float, prompt_tokens: int) -> float:
        """When a request of ``prompt_tokens`` arriving at ``now_s`` can be scheduled."""
        cost = self.intake_cost_s(prompt_tokens)
        if cost:
            free = self._free_s
            k = min(range(self.servers), key=free.__getitem__)
            done = max(free[k], now_s) + cost
            free[k] = done
            self.busy_s += cost
            now_s = done
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
        free = self._free_s
        for k in range(self.servers):
            free[k] = max(free[k], end_s) + share
        self.busy_s += share * self.servers
        return max(free)
