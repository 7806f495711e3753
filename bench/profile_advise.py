"""How close ``profile`` and ``advise`` come to what the simulator says, over real HTTP.

1. ``inferlab profile`` (prefill and decode only) against ``sim serve`` started with
   every setting given; the same engine run in virtual time (``sim run``) at the same
   prompt lengths: the prefill rate (a line through TTFT against prompt tokens) and the
   TPOT at concurrency 1, each side by side with their ratio.
2. A workload mixing 8,000-token prompts with short chats, benched against ``sim serve``
   at its default budget; ``inferlab advise`` predicts (virtual time) what a smaller
   ``--max-num-batched-tokens`` does to the short requests' stalls; the same workload is
   then benched against a server with that budget: predicted vs measured change.

    python bench/profile_advise.py [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import tempfile
from pathlib import Path

from inferlab.analysis.advise import advise
from inferlab.analysis.fits import linear_fit
from inferlab.analysis.profile import ProfileConfig, profile, read_profile
from inferlab.load.run import HttpTarget, RunConfig, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig, Replay
from inferlab.results.metrics import request_metrics
from inferlab.results.runfiles import read_records
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.traces import TraceConfig

SERVE = ["--max-model-len", "4096", "--max-num-batched-tokens", "8192", "--enforce-eager", "--gpu", "H100"]


def profile_check(tmp: Path) -> tuple[float, float, float, float]:
    out = tmp / "profile"
    with ChildServer(SERVE) as server:
        asyncio.run(profile(ProfileConfig(str(out), budget_s=300, factors=("prefill", "decode"), max_concurrency=1), server.url))
    p = read_profile(out)
    assert p.engine is not None
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"gpu", "offline"}
    engine = EngineConfig(**{k: v for k, v in p.engine.items() if k in fields})
    pf, dec = p.factor("prefill"), p.factor("decode")
    assert pf is not None and dec is not None
    lengths = sorted({r.requested_input_tokens for name in pf.runs for r in read_records(out / name / "requests.jsonl") if r.requested_input_tokens})
    pts = []
    for n in lengths:
        s = asyncio.run(run(RunConfig(LoadConfig(ClosedLoop(1), num_requests=3), WorkloadConfig(input_tokens=n, output_tokens=1)), SimTarget(engine))).summary
        assert s.ttft_ms is not None and s.input_tokens is not None
        pts.append((s.input_tokens / 3, s.ttft_ms.p50))
    predicted_tps = 1000 / linear_fit([x for x, _ in pts], [y for _, y in pts])[1]
    s = asyncio.run(run(RunConfig(LoadConfig(ClosedLoop(1), num_requests=3), WorkloadConfig(input_tokens=128, output_tokens=dec.data["output_tokens"])), SimTarget(engine))).summary
    assert s.tpot_ms is not None
    return pf.data["fit"]["prefill_tps"], predicted_tps, dec.data["tpot_ms_at_1"], s.tpot_ms.p50


def short_itl_p99(records: list) -> float:  # type: ignore[type-arg]
    gaps = sorted(g for r in records if r.ok and not r.warmup and (r.input_tokens or 0) <= 512 for g in request_metrics(r).itl_ms)
    k = (len(gaps) - 1) * 0.99
    lo = int(k)
    return gaps[lo] + (gaps[min(lo + 1, len(gaps) - 1)] - gaps[lo]) * (k - lo)


def hol_check(tmp: Path) -> tuple[int, float, float]:
    trace = tmp / "mixed.jsonl"
    rng = random.Random(1)
    t = 0.0
    with trace.open("w") as f:
        for i in range(40):
            t += rng.expovariate(6.0)
            f.write(json.dumps({"arrival_s": round(t, 4), "input_tokens": 8000 if i % 4 == 1 else 100, "output_tokens": 16 if i % 4 == 1 else 32}) + "\n")
    serve = ["--max-model-len", "16384", "--enforce-eager", "--max-num-batched-tokens", "8192"]

    def bench(url: str, out: Path | None):  # type: ignore[no-untyped-def]
        cfg = RunConfig(LoadConfig(Replay()), WorkloadConfig(trace=TraceConfig(str(trace))), out_dir=None if out is None else str(out))
        return asyncio.run(run(cfg, HttpTarget(url)))

    with ChildServer(serve) as server:
        observed = bench(server.url, tmp / "observed")
    rec = next(r for r in advise(tmp / "observed").recommendations if r.rule == "head_of_line")
    budget = int(rec.change.split("--max-num-batched-tokens ")[1].split()[0])
    with ChildServer([*serve[:-1], str(budget)]) as server:
        changed = bench(server.url, None)
    return budget, rec.gains[0].delta, short_itl_p99(changed.records) - short_itl_p99(observed.records)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    for i in range(a.repeat):
        with tempfile.TemporaryDirectory() as d:
            m_tps, p_tps, m_tpot, p_tpot = profile_check(Path(d))
            print(f"[{i}] prefill rate: profile {m_tps:,.0f} tok/s, sim run {p_tps:,.0f} tok/s, ratio {m_tps / p_tps:.3f}")
            print(f"[{i}] TPOT at 1:    profile {m_tpot:.3f} ms, sim run {p_tpot:.3f} ms, ratio {m_tpot / p_tpot:.3f}")
        with tempfile.TemporaryDirectory() as d:
            budget, predicted, measured = hol_check(Path(d))
            print(f"[{i}] head-of-line, --max-num-batched-tokens 8192 -> {budget}: short requests' p99 inter-token gap "
                  f"change predicted {predicted:+.1f} ms, measured {measured:+.1f} ms, ratio {predicted / measured:.3f}")


if __name__ == "__main__":
    main()
