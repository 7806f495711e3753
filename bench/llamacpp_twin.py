"""A digital twin of llama.cpp on this machine's CPU: calibrate the simulator on
concurrency-1 runs (and one at concurrency 2), then predict concurrency 4 and 8 and
compare with measurements.

    python bench/llamacpp_twin.py [--out DIR] [--threads 1]

What it does, all on loopback:

1. measures the CPU as the simulator's "device": float32 matrix-multiply rate of one
   thread (numpy) and the rate it copies a buffer the size of the model's weights
   (they are re-read every step: from the cache when they fit in it), written as a GPU
   file (``device.json``);
2. writes the tiny generated model's shape as an HF ``config.json`` (the simulator's
   model spec) and starts ``llama-server`` on it (built and cached as the test suite
   does; 8 slots of 2,048 tokens, ``--threads`` compute threads);
3. measures with ``bench`` (completions API, exact lengths): the **fit set** at
   concurrency 1 (a ladder of prompt lengths) plus one decode run at concurrency 2, and
   the **held-out set** at concurrency 4 and 8;
4. ``sim calibrate`` on the fit set only, then predicts the held-out runs and prints
   measured against predicted TTFT p50, TPOT p50, E2E p50 and output tok/s (all four fitted) with the
   error; then the same with the concurrency-1 runs alone, to show what they cannot tell.

Why one run at concurrency 2: at one sequence a cost paid once per step and a cost paid
per sequence in the step look the same, so runs at concurrency 1 cannot say how a batch
shares the work (on one CPU thread llama.cpp's decode shares almost nothing: a batch of
eight costs eight times one). The CPU device also has none of a GPU's fixed per-step
costs (kernel launches, a sampler's device sync, elementwise kernels' floor): they are
set to zero, and the weights' streaming time is the measured one (``weight_stream`` 1),
so the fit is left with the compute rates (``gemm_compute`` for prompt rows,
``decode_compute`` for one-token rows), attention (``attention_compute`` in prefill,
``kv_stream`` for a decode's read of its context), the host's cost per step and the
fixed cost per request (``inferlab.engines.cpu_twin``).

The numbers are this machine's at the time of the run: a busy machine moves them (the
server and the client share its cores). Nothing is fitted on the held-out runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (before numpy: one thread, as the server)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from inferlab.engines.cpu_twin import CPU_FIT, twin_engine, weight_bytes
from inferlab.engines.llamacpp import LlamaServer, build_llama_server
from inferlab.engines.tinymodel import TinyLlamaConfig, tiny_model
from inferlab.load.run import HttpTarget, RunConfig, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.sim.validation.twin import (
    METRICS,
    Fit,
    calibrate,
    median_abs_error,
    read_run,
    write_efficiencies,
)
from inferlab.workload.config import WorkloadConfig

SLOTS, SLOT_TOKENS = 8, 2048
FIT = [(1, n_in, 32, 6) for n_in in (64, 256, 512, 1024, 1536)]  # (users, prompt, output, requests)
FIT_BATCH = [(2, 16, 128, 8)]  # one decode run at concurrency 2 (see the docstring)
HOLDOUT = [(4, 256, 64, 24), (8, 256, 64, 32), (4, 1024, 32, 16), (8, 512, 32, 32)]


def measure(server: LlamaServer, out: Path, users: int, n_in: int, n_out: int, n: int) -> str:
    folder = out / f"c{users}-in{n_in}-out{n_out}"
    config = RunConfig(LoadConfig(ClosedLoop(users), num_requests=n, warmup=min(users, 4)),
                       WorkloadConfig(input_tokens=n_in, output_tokens=n_out), "completions",
                       out_dir=str(folder), overwrite=True)
    result = asyncio.run(run(config, HttpTarget(server.url, timeout_s=120.0)))
    s = result.summary
    assert s.counts.failed == 0, s.error_examples
    return str(folder)


def report(fit: Fit, title: str) -> dict[str, dict[str, float | None]]:
    print(f"\n{title}: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.constants.items()) + f" ({fit.evaluations} evaluations)")
    print(f"{'run':<26} {'metric':<13} {'measured':>10} {'prediction':>11} {'error':>8}")
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        for r in rows:
            for m in METRICS:
                if m in r["measured"]:
                    err = r["error"][m]
                    pred = r["predicted"][m]
                    print(f"{label + ' ' + Path(r['run']).name:<26} {m:<13} {r['measured'][m]:>10.2f} "
                          f"{pred if pred is not None else float('nan'):>11.2f} {err if err is not None else float('nan'):>+8.1%}")
    medians = {}
    for label, rows in (("fit", fit.fit_runs), ("held out", fit.holdout_runs)):
        medians[label] = {m: median_abs_error(rows, m) for m in METRICS}
        print(f"median |error| {label}: " + ", ".join(f"{m} {v:.1%}" for m, v in medians[label].items() if v is not None))
    return medians


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="twin-llamacpp")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = TinyLlamaConfig()
    engine, rates = twin_engine(out, shape, slots=SLOTS, slot_tokens=SLOT_TOKENS)
    print(f"device: one thread {rates['gflops']:.1f} GFLOP/s (float32 GEMM), copy of the weights' "
          f"{weight_bytes(shape) / 2**20:.1f} MiB {rates['gb_s']:.1f} GB/s")
    model = tiny_model()
    binary = build_llama_server(log=sys.stderr)
    with LlamaServer(binary, model.gguf, ctx_tokens=SLOTS * SLOT_TOKENS, slots=SLOTS, threads=args.threads,
                     log_path=out / "server.log") as server:
        fit_dirs = [measure(server, out / "fit", *row) for row in FIT]
        batch_dirs = [measure(server, out / "fit", *row) for row in FIT_BATCH]
        hold_dirs = [measure(server, out / "holdout", *row) for row in HOLDOUT]
    held = [read_run(d) for d in hold_dirs]
    fit = calibrate(engine, [read_run(d) for d in fit_dirs + batch_dirs], held, CPU_FIT)
    write_efficiencies(str(out / "efficiencies.json"), engine, fit)
    medians = report(fit, f"fitted on {len(fit_dirs)} concurrency-1 runs and {len(batch_dirs)} at concurrency 2")
    alone = calibrate(engine, [read_run(d) for d in fit_dirs], held, CPU_FIT)
    medians_alone = report(alone, f"for comparison, fitted on the {len(fit_dirs)} concurrency-1 runs alone")
    (out / "twin.json").write_text(json.dumps({
        **fit.to_json(), "engine": dataclasses.asdict(engine), "device": rates, "medians": medians,
        "concurrency_1_alone": {**alone.to_json(), "medians": medians_alone},
    }, indent=2, default=str) + "\n")
    print(f"\nefficiencies: {out / 'efficiencies.json'}; report: {out / 'twin.json'}")
    print(f"what-if with the twin: inferlab sim run --model {out}/model/config.json --gpu {out}/device.json "
          f"--max-num-seqs {SLOTS} --max-model-len {SLOT_TOKENS} --max-num-batched-tokens 2048 "
          f"--num-gpu-blocks-override {SLOTS * SLOT_TOKENS // 16} --enforce-eager --efficiencies {out}/efficiencies.json ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
