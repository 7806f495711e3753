"""vLLM V1's host CPU per engine step against the running batch, measured on vLLM's own
code: its CPU build (installed once per machine, as the opt-in ``-m vllm`` tests do)
serving the tiny generated model, profiled with py-spy while it decodes.

    python bench/vllm_host_cost.py [--seqs 128,512] [--output-tokens 256] [--out DIR]

For each batch size N: a burst of N requests (16-token prompts, exactly
``--output-tokens`` out, streamed), so that the engine steps with N sequences running;
py-spy samples the engine-core process and the worker process for the whole run
(``pip install py-spy``); vLLM's ``--enable-logging-iteration-details`` lines count the
steps and the sequences scheduled in them. The engine core's host work is the time in
``Scheduler.schedule``, ``Scheduler.update_from_output``, the output thread
(``process_output_sockets``: serialising outputs for the API server) and the input
queue; the worker's host side is input preparation and bookkeeping (``_prepare_inputs``,
``_update_states``, ``_bookkeeping_sync``); the model's forward and the sampler (on a
GPU both are device work) and the waits between the processes are left out. A line
through the runs, ``seconds = a * steps + b * sequence-steps``, gives the cost per step
``a`` and per scheduled sequence ``b``, the simulator's ``cpu_step_s`` and ``per_seq_s``
(``sim/engine/steptime.py``).

What it cannot say: this machine's CPU is not a GPU server's; the CPU build runs the
engine core and the worker as two processes with no asynchronous scheduling, so every
part counted here is serial with the forward, as in vLLM V1 on a GPU without
``--async-scheduling``; py-spy samples (250 a second), so a run of a few seconds gives
each part to a few per cent.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from inferlab.engines.tinymodel import tiny_model
from inferlab.engines.vllm import VllmServer, hf_model, install_vllm
from inferlab.load.run import HttpTarget, RunConfig, run
from inferlab.load.schedules import LoadConfig, OpenLoop
from inferlab.workload.config import WorkloadConfig

RATE_HZ = 250
FLAGS = ["--max-model-len", "1024", "--max-num-seqs", "512", "--max-num-batched-tokens", "8192",
         "--enable-logging-iteration-details", "--dtype", "bfloat16"]
#: The host work counted, by process: a sample belongs to the innermost of these frames
PARTS = {
    "core": ("Scheduler.schedule", "Scheduler.update_from_output", "process_output_sockets", "_process_input_queue"),
    "worker": ("_prepare_inputs", "_update_states", "_bookkeeping_sync"),
}
#: Frames that are not host work of the step (the forward, the sampler, waits between processes)
OTHER = ("forward", "Sampler", "MessageQueue.dequeue", "MessageQueue.enqueue")
_ITERATION = re.compile(r"Iteration\(\d+\): (\d+) context requests, \d+ context tokens, (\d+) generation requests")


@dataclass(frozen=True)
class Run:
    """One batch size: the steps vLLM logged, the sequences scheduled over them, and the
    seconds of host work per part in each process."""

    n: int
    completed: int
    steps: int
    sequence_steps: int
    core: dict[str, float]
    worker: dict[str, float]


def part_seconds(raw: Path, parts: tuple[str, ...]) -> dict[str, float]:
    """Seconds per part from a py-spy raw (collapsed stacks) file: each sample goes to
    the innermost frame named in ``parts`` or ``OTHER``; unnamed ones are left out."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        key = None
        for frame in stack.split(";"):
            name = frame.split(" (")[0]
            key = next((k for k in (*parts, *OTHER) if k in name), key)
        if key in parts:
            out[key] += int(count) / RATE_HZ
    return dict(out)


def processes(pgid: int) -> dict[str, int]:
    """This server's engine-core and worker processes (of its process group ``pgid``), by
    the names vLLM gives them."""
    names = {"VLLM::EngineCor": "core", "VLLM::Worker": "worker"}
    listing = subprocess.run(["ps", "-eo", "pid,pgid,comm"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in listing.splitlines()[1:]:
        pid, group, comm = line.split(None, 2)
        if comm.strip() in names and int(group) == pgid:
            found[names[comm.strip()]] = int(pid)
    return found


def measure(server: VllmServer, spy: str, log: Path, out: Path, n: int, output_tokens: int, tokenizer: str) -> Run:
    assert server.pid is not None
    pids = processes(server.pid)  # (the server leads its process group)
    if set(pids) != {"core", "worker"}:
        raise SystemExit(f"vLLM's engine core and worker processes not found (found {pids})")
    start = log.stat().st_size
    spies = [subprocess.Popen([spy, "record", "-p", str(pid), "-r", str(RATE_HZ), "-d", "600", "-f", "raw",
                               "-o", str(out / f"spy-{name}-{n}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, pid in pids.items()]
    t0 = time.monotonic()
    time.sleep(1.5)  # py-spy attached
    workload = WorkloadConfig(input_tokens=16, output_tokens=output_tokens, tokenizer=tokenizer)
    result = asyncio.run(run(RunConfig(LoadConfig(OpenLoop(float("inf")), num_requests=n), workload, "completions",
                                       out_dir=str(out / f"bench-{n}"), overwrite=True),
                             HttpTarget(server.url, "tiny", preflight=False, workers=1)))
    for s in spies:
        s.send_signal(signal.SIGINT)
    spied_s = time.monotonic() - t0
    for s in spies:
        s.wait(60)
    steps = [(int(c), int(g)) for c, g in _ITERATION.findall(log.read_text(errors="replace")[start:])]
    run_ = Run(n, result.summary.counts.completed, len(steps), sum(c + g for c, g in steps),
               part_seconds(out / f"spy-core-{n}.txt", PARTS["core"]),
               part_seconds(out / f"spy-worker-{n}.txt", PARTS["worker"]))
    if "Scheduler.schedule" not in run_.core:
        raise SystemExit("py-spy's frames name no Scheduler.schedule: this py-spy does not print qualified names "
                         "(class.method); install a newer one")
    # a sampler that fell behind counts every part short; each process's main thread is
    # never idle (it spins while it waits for the other), so a full count is at least
    # one sample a tick
    for name in pids:
        kept = samples(out / f"spy-{name}-{n}.txt") / (RATE_HZ * spied_s)
        if kept < 0.9:
            print(f"warning: py-spy kept {kept:.0%} of its samples of the {name} at {n} sequences: "
                  "its parts are that much short", file=sys.stderr)
    return run_


def samples(raw: Path) -> int:
    """The samples in a py-spy raw file, every thread of the process together."""
    return sum(int(line.rpartition(" ")[2]) for line in raw.read_text().splitlines())


def line_through(runs: list[Run], process: str) -> tuple[float, float]:
    """(seconds per step, per sequence-step) of a least-squares line through the runs."""
    rows = [(float(r.steps), float(r.sequence_steps), sum(getattr(r, process).values())) for r in runs]
    sxx = sum(s * s for s, _, _ in rows)
    sxy = sum(s * q for s, q, _ in rows)
    syy = sum(q * q for _, q, _ in rows)
    bx = sum(s * t for s, _, t in rows)
    by = sum(q * t for _, q, t in rows)
    det = sxx * syy - sxy * sxy
    return (bx * syy - by * sxy) / det, (by * sxx - bx * sxy) / det


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="128,512", help="batch sizes, comma-separated (two or more)")
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--out", default="vllm-host-cost")
    args = p.parse_args()
    sizes = [int(x) for x in args.seqs.split(",")]
    if len(sizes) < 2 or min(sizes) < 1 or max(sizes) > 512:
        p.error("--seqs: two or more batch sizes from 1 to 512")
    beside = Path(sys.executable).parent / "py-spy"  # a virtual environment's, not on PATH
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None:
        print("bench/vllm_host_cost.py: needs py-spy (pip install py-spy)", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = tiny_model()
    log = out / "vllm.log"
    runs = []
    with VllmServer(install_vllm(), hf_model(tiny), name="tiny", flags=FLAGS, log_path=log, kv_cache_gib=2) as server:
        for n in sizes:
            r = measure(server, spy, log, out, n, args.output_tokens, str(tiny.tokenizer))
            runs.append(r)
            per = {k: f"{v * 1e3 / r.steps:.2f}" for k, v in {**r.core, **r.worker}.items()}
            print(f"{n} sequences: {r.completed} completed, {r.steps} steps, {r.sequence_steps:,} sequence-steps; "
                  f"ms per step: {per}", flush=True)
    (out / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
    for process, label in (("core", "engine core (schedule, update, output, input)"),
                           ("worker", "worker host side (input preparation, bookkeeping)")):
        a, b = line_through(runs, process)
        print(f"{label}: {a * 1e3:.2f} ms per step + {b * 1e6:.1f} us per scheduled sequence")
    print("the simulator's vLLM V1: cpu_step_s 0.7 ms per step + per_seq_s 5 us per sequence (sim/engine/steptime.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
