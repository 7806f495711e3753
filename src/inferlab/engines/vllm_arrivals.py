"""When each request reached vLLM, counted in its engine steps, and a replay in the
simulator that places every request at that step.

Which step first sees a request is input to a scheduler, not output: over HTTP a
request reaches vLLM's engine core some time after it was sent (the API server parses,
tokenizes and hands it over while the engine core keeps stepping), so a closed loop's
next request may miss the step right after its predecessor ended, and a burst may be
split over the first steps. vLLM logs no such thing (its API server's "Added request"
lines and the Iteration lines come from another process than the engine core's steps,
with timestamps to the second). ``vllm_plugin/inferlab_arrivals.py``, vLLM's own
scheduler subclassed to log only (``--scheduler-cls``, ``arrival_flags``), writes
``Arrivals before Iteration(N): ID:PROMPT:MAX_TOKENS ...`` before each step with tokens;
``vllm_arrivals`` reads those lines.

``placed_rows`` gives the bench run's requests (its ``requests.jsonl``) those arrivals,
in order; ``replay_placed`` replays them in virtual time with every step taking
``STEP_S``, so that step N starts at ``N * STEP_S`` and a request placed at step N
arrives during step N - 1: the simulator's step N is the first to see it, as vLLM's was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from inferlab.load.schedules import LoadConfig, Replay
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.config import EngineConfig
from inferlab.workload.traces import MOONCAKE_BLOCK_TOKENS, TraceRow

#: The folder put on vLLM's ``PYTHONPATH`` and the scheduler class it holds
PLUGIN_DIR = Path(__file__).parent / "vllm_plugin"
SCHEDULER_CLS = "inferlab_arrivals.ArrivalLoggingScheduler"
#: Virtual seconds every step of a placed replay takes (any positive constant would do)
STEP_S = 1.0


def arrival_flags() -> list[str]:
    """vLLM's flags for a server that logs arrivals (with ``PLUGIN_DIR`` on its path)."""
    return ["--scheduler-cls", SCHEDULER_CLS]


@dataclass(frozen=True)
class Arrival:
    """A request vLLM's scheduler received: ``iteration`` is the first step (its
    ``Iteration(N)`` index) that could schedule it."""

    request_id: str
    iteration: int
    prompt_tokens: int
    max_tokens: int


_ARRIVALS = re.compile(r"Arrivals before Iteration\((\d+)\): (.+)$", re.MULTILINE)


def vllm_arrivals(log_text: str) -> list[Arrival]:
    """The arrivals that ``inferlab_arrivals`` logged in a server log, in the order the
    scheduler received them. ``ValueError`` for a malformed entry."""
    out = []
    for m in _ARRIVALS.finditer(log_text):
        for entry in m.group(2).split():
            rid, prompt, max_tokens = entry.rsplit(":", 2)
            out.append(Arrival(rid, int(m.group(1)), int(prompt), int(max_tokens)))
    return out


def arrival_s(iteration: int) -> float:
    """When a request first seen by step ``iteration`` arrives in a placed replay: during
    the step before (steps ``STEP_S`` long, back to back from 0), at 0 for the first."""
    return 0.0 if iteration == 0 else (iteration - 0.5) * STEP_S


def placed_rows(rows: Sequence[TraceRow], arrivals: Sequence[Arrival]) -> list[TraceRow]:
    """The bench run's ``rows`` (in send order, as ``read_requests`` gives them) at the
    steps vLLM received them: the k-th row sent is matched with the k-th request vLLM
    received, which must have its prompt and output lengths (alike requests sent at once
    may reach vLLM in another order; unlike ones must not). Open loop (no closed-loop
    user): each arrives at ``arrival_s`` of its step. ``ValueError`` when counts or
    lengths differ."""
    if len(rows) != len(arrivals):
        raise ValueError(f"{len(rows)} requests sent but {len(arrivals)} received by vLLM's scheduler")
    out = []
    for k, (row, a) in enumerate(zip(rows, arrivals, strict=True)):
        if (row.input_tokens, row.output_tokens) != (a.prompt_tokens, a.max_tokens):
            raise ValueError(
                f"request {k} sent {row.input_tokens} in / {row.output_tokens} out, but the {k}-th vLLM "
                f"received ({a.request_id}) has {a.prompt_tokens} / {a.max_tokens}"
            )
        out.append(replace(row, arrival_s=arrival_s(a.iteration), user=None))
    return out


class StepsOfStepS:
    """A step-time model in which every step takes ``STEP_S``: virtual time counts steps."""

    def step_time_s(self, seqs: Sequence[tuple[int, int]], emitting: int) -> float:
        return STEP_S


def replay_placed(rows: Sequence[TraceRow], engine: EngineConfig, step_log: IO[str]) -> list[RequestRecord]:
    """Replay ``placed_rows`` on ``engine`` in virtual time, every step ``STEP_S`` long,
    writing each step to ``step_log`` (as ``sim run --step-log``); prompts are built as
    ``sim run`` builds a trace's (the simulator's own token ids; prefix groups shared)."""
    from inferlab.load.virtual import simulate
    from inferlab.sim.engine.engine import Engine
    from inferlab.workload.builtin_prompts import SimPromptBuilder
    from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
    from inferlab.workload.spec import Trace
    from inferlab.workload.traces import to_specs

    builder = SimPromptBuilder(BuiltinTokenizer())
    trace = Trace(tuple(to_specs(list(rows), builder, 0, True, MOONCAKE_BLOCK_TOKENS)))
    return simulate(Engine(engine, StepsOfStepS()), LoadConfig(Replay()), trace, step_log=step_log)
