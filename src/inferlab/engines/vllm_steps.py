"""The simulator's scheduler against vLLM's, step by step: three workloads that force
preemption in a small KV cache, the engine flags both sides run with, and the per-step
records compared.

The setup is the one checked against vLLM 0.32's CPU build: 24 KV blocks of 128 tokens
(``--num-gpu-blocks-override 24``: 23 hold tokens, one is vLLM's null block), a
512-token budget per step, 16 sequences, prefix caching on. The workloads (``SCENARIOS``):

- ``closed-loop``: 8 users, 32 requests of 384 tokens in and 384 out: their sequences
  outgrow the cache, running requests are preempted;
- ``shared-prefix-burst``: 16 requests at once sharing a 1,024-token prefix (each with
  its own 128 tokens, 256 out): prefix-cache hits, and preemptions;
- ``burst-512``: 16 requests at once of 512 tokens in and 512 out, where vLLM 0.32's
  full-sequence admission and free-queue order decide when preempted requests come back.

Two runs of the simulator are compared on ``StepKey``: tokens scheduled (prefill and
decode), the running and waiting counts after it, preemptions in it, and the prefix-cache
hits of first admissions (vLLM's counters leave out what a re-admission finds). vLLM
logs less per step (``--enable-logging-iteration-details``: context and generation
requests and tokens, where a request counts as generation once it has an output token,
also while it recomputes after a preemption, and KV usage): the simulator is compared
with it on the tokens scheduled and the KV usage after every step (``TokenStep``), and
on the totals of vLLM's ``/metrics`` (preemptions, prefix-cache hits).

``python -m inferlab.engines.vllm_steps [SCENARIO ...]`` runs the check on a real vLLM
(``engines.vllm``: its CPU build, installed once per machine, serving the tiny model):
for each workload a fresh server whose scheduler logs the step at which it received
each request (``engines.vllm_arrivals``), ``bench`` against it, then the simulator on
the same requests twice. The check: each request placed at the step where vLLM received
it (when a request reaches the engine is input to the scheduler, set by HTTP and the API
server, which the simulator does not time), every step and both totals equal. Reported
beside it: a replay of the bench run's requests.jsonl as it was sent (a closed loop's
users again; ``replay_engine_config``), which has no record of those arrival steps. It prints what matched and
writes every file under ``--out``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop
from inferlab.sim.engine.config import EngineConfig
from inferlab.workload.config import WorkloadConfig

#: vLLM's CPU KV block size, and the cache of the check: 24 blocks, 23 usable
BLOCK_SIZE = 128
NUM_GPU_BLOCKS = 24
MAX_NUM_BATCHED_TOKENS = 512
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class Scenario:
    """One workload of the check: what ``sim run`` or ``bench`` sends, and how."""

    name: str
    load: LoadConfig
    workload: WorkloadConfig
    about: str

    def cli_flags(self) -> list[str]:
        """The same workload as ``inferlab sim run`` / ``bench`` flags."""
        s, w = self.load.schedule, self.workload
        flags = ["-n", str(self.load.num_requests)]
        if isinstance(s, ClosedLoop):
            flags += ["-c", str(s.concurrency)]
        else:
            flags += ["--rate", "inf"]
        if w.prefix_tokens is not None:
            flags += ["--prefix-groups", str(w.prefix_groups or 1), "--prefix-tokens", str(w.prefix_tokens),
                      "--suffix-tokens", str(w.suffix_tokens)]
        else:
            flags += ["--input-tokens", str(w.input_tokens)]
        return [*flags, "--output-tokens", str(w.output_tokens)]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("closed-loop", LoadConfig(ClosedLoop(8), num_requests=32),
                 WorkloadConfig(input_tokens=384, output_tokens=384),
                 "8 users, 384 in / 384 out: running sequences outgrow the cache"),
        Scenario("shared-prefix-burst", LoadConfig(OpenLoop(float("inf")), num_requests=16),
                 WorkloadConfig(output_tokens=256, prefix_groups=1, prefix_tokens=1024, suffix_tokens=128),
                 "16 at once sharing a 1,024-token prefix: cache hits and preemptions"),
        Scenario("burst-512", LoadConfig(OpenLoop(float("inf")), num_requests=16),
                 WorkloadConfig(input_tokens=512, output_tokens=512),
                 "16 at once, 512 in / 512 out: re-admissions decided by full-sequence admission"),
    )
}


#: The host of ``replay_engine_config``: a thousand times the typical one, so that the API
#: front end's CPU costs take microseconds, short of any step, and still come in order.
REPLAY_HOST_SPEED = 1e3


def engine_config(model: str = "Llama-3.2-1B", **flags: Any) -> EngineConfig:
    """The simulated engine of the check (vLLM V1 rules, vLLM 0.32's switches unless
    ``flags`` say otherwise, but no async scheduling: vLLM's CPU build schedules each step
    after the previous one ended); no API cost (no latency, and an infinitely fast host: no
    front-end CPU queue), so that a request is schedulable when sent."""
    base: dict[str, Any] = {
        "model": model, "block_size": BLOCK_SIZE, "num_gpu_blocks_override": NUM_GPU_BLOCKS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN, "enable_prefix_caching": True, "api_overhead_s": 0.0,
        "host_speed": float("inf"), "overlap_schedule": False,
    }
    return EngineConfig(**{**base, **flags})


def replay_engine_config(**flags: Any) -> EngineConfig:
    """``engine_config`` for replaying a bench run's requests.jsonl as it was sent: with
    the API front end's costs in their order but negligible (``REPLAY_HOST_SPEED``), as
    vLLM's API server hands requests to the engine core one at a time (requests sent
    together: an idle engine starts its first step on the first alone) and streams a
    step's tokens after the step (a closed loop's next request arrives while the next
    step runs, and is seen by the one after)."""
    return engine_config(**{"host_speed": REPLAY_HOST_SPEED, **flags})


@dataclass(frozen=True)
class StepKey:
    """What a step is compared on."""

    prefill_tokens: int
    decode_tokens: int
    num_running: int
    num_waiting: int
    preemptions: int
    prefix_hit_tokens: int


def sim_steps(lines: Iterable[Mapping[str, Any]]) -> list[StepKey]:
    """``sim run --step-log`` lines as compared steps (idle steps, with no tokens, left out)."""
    keys = []
    for d in lines:
        if d["prefill_tokens"] + d["decode_tokens"] == 0:
            continue
        keys.append(StepKey(d["prefill_tokens"], d["decode_tokens"], d["num_running"], d["num_waiting"],
                            d["preemptions"], d["prefix_hit_tokens"]))
    return keys


_K = TypeVar("_K")


def first_difference(a: Sequence[_K], b: Sequence[_K]) -> int | None:
    """The index of the first step where ``a`` and ``b`` differ (a length counts); None
    when they are the same."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class TokenStep:
    """A step as both sides log it: the tokens it scheduled, and the share of KV blocks
    held after it, in percent to one decimal as vLLM prints it."""

    tokens: int
    kv_usage_pct: float


_ITERATION = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, .*?KV cache usage: ([\d.]+)%"
)


def vllm_iterations(log_text: str) -> list[TokenStep]:
    """The steps of vLLM's ``--enable-logging-iteration-details`` lines in a server log,
    in order (steps with no tokens left out, as in ``sim_token_steps``)."""
    steps = []
    for m in _ITERATION.finditer(log_text):
        n = int(m.group(3)) + int(m.group(5))
        if n:
            steps.append(TokenStep(n, float(m.group(6))))
    return steps


def sim_token_steps(lines: Iterable[Mapping[str, Any]]) -> list[TokenStep]:
    """``sim run --step-log`` lines as vLLM logs steps."""
    return [TokenStep(d["prefill_tokens"] + d["decode_tokens"], float(f"{d['kv_usage'] * 100:.1f}")) for d in lines
            if d["prefill_tokens"] + d["decode_tokens"]]


def prometheus_value(text: str, name: str) -> float | None:
    """The sum of a Prometheus metric's samples (any labels) in ``/metrics`` text; None
    when it is not there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


# --- the check against a real vLLM ----------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """One workload on vLLM and on the simulator, twice: ``sim_*`` with every request
    arriving at the step where vLLM's scheduler received it (``vllm_arrivals``: the
    strict comparison), ``replay_*`` replaying the bench run's requests.jsonl as it was
    sent (a closed loop's users again, each request the moment its predecessor ends)."""

    scenario: str
    vllm_steps: list[TokenStep]
    sim_steps: list[TokenStep]
    vllm_preemptions: float | None
    sim_preemptions: int
    vllm_prefix_hits: float | None
    sim_prefix_hits: int
    completed: int
    replay_steps: list[TokenStep] = dataclasses.field(default_factory=list)
    replay_preemptions: int = 0
    replay_prefix_hits: int = 0
    #: the bench run's own verdict (``summary.client``): a client late to send moves the
    #: steps at which a closed loop's requests arrive, which the replay cannot know
    client_bottleneck: bool = False

    @property
    def first_difference(self) -> int | None:
        return first_difference(self.vllm_steps, self.sim_steps)

    @property
    def matches(self) -> bool:
        """Every step and both totals equal, each request arriving at vLLM's step."""
        return (self.first_difference is None and self.vllm_preemptions == self.sim_preemptions
                and self.vllm_prefix_hits == self.sim_prefix_hits)

    @property
    def replay_first_difference(self) -> int | None:
        return first_difference(self.vllm_steps, self.replay_steps)

    def line(self) -> str:
        return (f"{self.scenario}: {self.completed} requests; at vLLM's arrival steps "
                f"{_steps(self.first_difference, self.vllm_steps, self.sim_steps)}; preemptions vLLM "
                f"{_n(self.vllm_preemptions)} / simulator {self.sim_preemptions}; prefix-cache hits vLLM "
                f"{_n(self.vllm_prefix_hits)} / simulator {self.sim_prefix_hits:,} tokens. "
                f"Replay of requests.jsonl: {_steps(self.replay_first_difference, self.vllm_steps, self.replay_steps)}, "
                f"{self.replay_preemptions} preemptions, {self.replay_prefix_hits:,} prefix-cache hit tokens")


def _steps(d: int | None, vllm: Sequence[TokenStep], sim: Sequence[TokenStep]) -> str:
    return (f"all {len(vllm):,} steps match" if d is None else
            f"steps differ from step {d:,} (vLLM {len(vllm):,} steps, simulator {len(sim):,})")


def _n(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def vllm_flags() -> list[str]:
    """vLLM's flags for the check's engine (``engine_config``'s sizes)."""
    return ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS), "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS),
            "--block-size", str(BLOCK_SIZE), "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--enable-logging-iteration-details", "--dtype", "bfloat16"]


def check(name: str, out_dir: str, python: str | None = None) -> CheckResult:
    """Run workload ``name`` on a fresh vLLM server that logs when its scheduler received
    each request (``vllm_arrivals``), then the simulator twice on the bench run's
    requests: placed at those steps, and replayed from its requests.jsonl; compare. Its
    log, the bench run, the arrivals, both step logs and the result line (check.txt) go
    under ``out_dir``/``name``.
    ``EngineUnavailable`` where vLLM cannot be installed or started."""
    import asyncio
    import json
    from pathlib import Path

    from inferlab.engines.tinymodel import tiny_model
    from inferlab.engines.vllm import VllmServer, hf_model, install_vllm
    from inferlab.engines.vllm_arrivals import (
        PLUGIN_DIR,
        arrival_flags,
        placed_rows,
        replay_placed,
        vllm_arrivals,
    )
    from inferlab.load.run import HttpTarget, RunConfig, SimTarget, run
    from inferlab.load.schedules import Replay
    from inferlab.results.clientload import ClientLoad
    from inferlab.workload.traces import TraceConfig
    from inferlab.workload.traces.requests import read_requests

    sc = SCENARIOS[name]
    out = Path(out_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    py = Path(python) if python else install_vllm()
    tiny = tiny_model()
    model = hf_model(tiny)
    log = out / "vllm.log"
    workload = dataclasses.replace(sc.workload, tokenizer=str(tiny.tokenizer))
    with VllmServer(py, model, name="tiny", flags=[*vllm_flags(), *arrival_flags()], log_path=log,
                    pythonpath=[PLUGIN_DIR]) as server:
        start = log.stat().st_size
        bench = asyncio.run(run(RunConfig(sc.load, workload, "completions", out_dir=str(out / "bench"), overwrite=True),
                                HttpTarget(server.url, "tiny", preflight=False, workers=1)))
        metrics = server.metrics()
    text = log.read_text(errors="replace")[start:]
    requests = out / "bench" / "requests.jsonl"
    arrivals = vllm_arrivals(text)
    (out / "arrivals.jsonl").write_text("".join(json.dumps(dataclasses.asdict(a)) + "\n" for a in arrivals))
    placed_path = out / "sim-placed-steps.jsonl"
    with open(placed_path, "w") as f:
        replay_placed(placed_rows(read_requests(str(requests)), arrivals), engine_config(), f)
    placed = [json.loads(x) for x in placed_path.read_text().splitlines()]
    steps_path = out / "sim-steps.jsonl"
    trace = WorkloadConfig(trace=TraceConfig(str(requests)))
    asyncio.run(run(RunConfig(LoadConfig(Replay()), trace, "completions", out_dir=str(out / "sim"), overwrite=True),
                    SimTarget(replay_engine_config(), step_log=str(steps_path))))
    replayed = [json.loads(x) for x in steps_path.read_text().splitlines()]
    result = CheckResult(
        name, vllm_iterations(text), sim_token_steps(placed),
        prometheus_value(metrics, "vllm:num_preemptions_total"), sum(d["preemptions"] for d in placed),
        prometheus_value(metrics, "vllm:prefix_cache_hits_total"), sum(d["prefix_hit_tokens"] for d in placed),
        bench.summary.counts.completed,
        sim_token_steps(replayed), sum(d["preemptions"] for d in replayed), sum(d["prefix_hit_tokens"] for d in replayed),
        isinstance(bench.summary.client, ClientLoad) and bench.summary.client.bottleneck is True,
    )
    (out / "check.txt").write_text(result.line() + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m inferlab.engines.vllm_steps``: the check on a real vLLM."""
    import argparse
    import sys

    from inferlab.engines.llamacpp import EngineUnavailable

    p = argparse.ArgumentParser(description="Compare the simulator's scheduler with vLLM's, step by step, on three preempting workloads.")
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all three)")
    p.add_argument("--out", default="vllm-check", help="folder for vLLM's logs, the bench runs and the replays")
    p.add_argument("--python", help="the python of an environment with vLLM (default: install its CPU build once)")
    args = p.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    failed = False
    for name in args.scenarios or list(SCENARIOS):
        try:
            result = check(name, args.out, args.python)
        except EngineUnavailable as e:
            print(f"inferlab: {e}", file=sys.stderr)
            return 1
        print(result.line(), flush=True)
        failed |= not result.matches
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
