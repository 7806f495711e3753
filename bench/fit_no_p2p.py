"""Fit the all-reduce latency between GPUs without peer-to-peer access, on `fit` rows only.

GeForce cards (the RTX 4090 among the presets) have peer-to-peer access disabled by the
driver: a tensor-parallel all-reduce goes through host memory (NCCL's shared-memory
transport; vLLM's custom all-reduce needs P2P and is off). The step-time model charges
each of the two all-reduces per layer ``allreduce_latency_no_p2p_s · 2(t−1)/t`` on such
cards (``GpuSpec.peer_to_peer``), where NVLink and PCIe cards with P2P pay
``allreduce_latency_s`` (10 µs).

The rule, written before the fit was run: take every `fit` row on a card without P2P at
TP > 1, and of each series (engine, model, card, TP) only its least-loaded row (the
lowest request rate or concurrency), where a step is a few decodes and the latency per
all-reduce is what separates the measured TPOT from the single-card model. For each such
row, find by bisection the latency at which the predicted mean TPOT equals the measured
one; the constant is the median over those rows. Held-out rows are never run.

    python bench/fit_no_p2p.py
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from inferlab.sim.engine import families, hardware
from inferlab.sim.validation.calibration import load_rows, parse_rows
from inferlab.sim.validation.scenario import Scenario
from inferlab.sim.validation.validate import predict_scenario

DATA = Path(__file__).resolve().parent / "data"
LOW, HIGH = 0.0, 400e-6  # the bisection's bracket, seconds per all-reduce before the ring factor
STEPS = 14  # bracket / 2^14: about 0.02 µs


def least_loaded_rows() -> list[Scenario]:
    """The `fit` rows the rule takes: TP > 1 on a card without P2P, the least-loaded row
    of each (engine family, model, card, TP) series that measured a mean TPOT."""
    rows = [r for path in sorted(DATA.glob("*.csv")) for r in load_rows(path) if r.get("split") == "fit"]
    scenarios, _ = parse_rows(rows)
    series: dict[tuple[str, str, str, int], list[Scenario]] = {}
    for sc in scenarios:
        if sc.tp > 1 and not hardware.resolve_gpu(sc.gpu).peer_to_peer and _measured_tpot(sc) is not None:
            series.setdefault((sc.family.value, sc.model, sc.gpu, sc.tp), []).append(sc)
    return [min(group, key=lambda sc: sc.rate_rps or sc.concurrency or 0) for group in series.values()]


def _measured_tpot(sc: Scenario) -> float | None:
    return next((m.value for m in sc.measurements if m.metric == "tpot_ms" and m.stat == "mean"), None)


def _set_latency(seconds: float) -> None:
    """Every family's constant, for this process."""
    for family, rules in list(families.FAMILY_RULES.items()):
        eff = dataclasses.replace(rules.efficiencies, allreduce_latency_no_p2p_s=seconds)
        families.FAMILY_RULES[family] = dataclasses.replace(rules, efficiencies=eff)


def _predicted_tpot(sc: Scenario, seconds: float) -> float:
    _set_latency(seconds)
    return predict_scenario(sc)[0]["tpot_ms"]


def solve(sc: Scenario) -> float | None:
    """The latency at which the predicted mean TPOT meets the measured one; None if no
    latency in the bracket does."""
    target = _measured_tpot(sc)
    assert target is not None
    lo, hi = LOW, HIGH
    if not _predicted_tpot(sc, lo) <= target <= _predicted_tpot(sc, hi):
        return None
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _predicted_tpot(sc, mid) < target else (lo, mid)
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    shipped = families.FAMILY_RULES[families.EngineFamily.VLLM].efficiencies.allreduce_latency_no_p2p_s
    chosen = least_loaded_rows()
    if not chosen:
        print("no fit rows at TP > 1 on a card without peer-to-peer access", file=sys.stderr)
        return 1
    solved: list[float] = []
    print(f"{len(chosen)} fit rows (the least-loaded of each series):")
    for sc in sorted(chosen, key=lambda sc: sc.row_id):
        latency = solve(sc)
        load = f"{sc.rate_rps:g} req/s" if sc.rate_rps else f"concurrency {sc.concurrency}"
        what = f"{sc.row_id} {sc.model} on {sc.tp}x {sc.gpu}, {load}, TPOT {_measured_tpot(sc)} ms"
        if latency is None:
            print(f"  {what}: no latency in {LOW * 1e6:g}-{HIGH * 1e6:g} us meets it (left out)")
            continue
        solved.append(latency)
        print(f"  {what}: {latency * 1e6:.1f} us")
    if not solved:
        return 1
    print(f"median: {statistics.median(solved) * 1e6:.0f} us per all-reduce before the ring factor "
          f"(shipped: {shipped * 1e6:g} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
