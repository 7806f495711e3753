"""``sim calibrate`` on llama.cpp: a twin fitted on runs at one and two users predicts
runs at four and eight it never saw better than the simulator it started from, and
fitting decode attention's cost per context token (``kv_stream``) is what lets it follow
llama.cpp's decode as the context grows, in sample (``inferlab.engines.cpu_twin``; ``bench/llamacpp_twin.py``
prints the errors). Orderings only: the machine's speed is in every number."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from inferlab.engines.cpu_twin import CPU_FIT, twin_engine
from inferlab.engines.llamacpp import LlamaServer
from inferlab.engines.tinymodel import TinyLlamaConfig
from inferlab.load.run import HttpTarget, RunConfig, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.sim.validation.twin import Fit, calibrate, median_abs_error, read_run
from inferlab.workload.config import WorkloadConfig

pytestmark = [pytest.mark.engines, pytest.mark.slow]

SLOTS, SLOT_TOKENS = 8, 2048  # (the ``llama`` fixture's server: conftest's CTX_TOKENS over its slots)

FIT = [(1, 64, 32, 6), (1, 256, 32, 6), (1, 512, 32, 6), (1, 1024, 32, 6), (1, 1536, 32, 6), (2, 16, 128, 8)]  # (users, prompt, output, requests)
HOLDOUT = [(4, 256, 64, 24), (8, 512, 32, 32)]
#: Cores that other processes may keep busy, on average, while the runs are measured: past
#: it the runs time the machine's scheduler as much as llama.cpp (its one compute thread
#: and the client took turns with them in slices longer than a decode step), and the test
#: says so and skips. Not a bound on any result: 0.00 on an idle machine, 1.3 beside two
#: busy loops.
OTHERS_CORES = 0.25


def _cpu_s(pid: str) -> float:
    """CPU (user + system, s) of a live process and of the children it has waited for."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _busy_s() -> tuple[float, float] | None:
    """(CPU the whole machine used, CPU this process and its children used), both in
    seconds since boot; None where there is no /proc (the test then runs unchecked)."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        me = str(os.getpid())
        children = [d for d in os.listdir("/proc") if d.isdigit() and _parent(d) == me]
        ours = _cpu_s(me) + sum(_cpu_s(c) for c in children)
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), ours


def _parent(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except OSError:  # (it ended meanwhile)
        return None


def others_cores(since: tuple[float, tuple[float, float] | None]) -> float | None:
    """Cores that processes other than this one and its children (the server, the device
    measurement) kept busy on average since ``since`` (``time.monotonic()``, ``_busy_s()``)."""
    start_s, start = since
    now = _busy_s()
    if start is None or now is None:
        return None
    return max(0.0, (now[0] - start[0]) - (now[1] - start[1])) / (time.monotonic() - start_s)


def measure(server: LlamaServer, out: Path, users: int, n_in: int, n_out: int, n: int) -> str:
    folder = out / f"c{users}-in{n_in}-out{n_out}"
    config = RunConfig(LoadConfig(ClosedLoop(users), num_requests=n, warmup=min(users, 4)),
                       WorkloadConfig(input_tokens=n_in, output_tokens=n_out), "completions", out_dir=str(folder))
    result = asyncio.run(run(config, HttpTarget(server.url, timeout_s=120.0)))
    assert result.summary.counts.failed == 0, result.summary.error_examples
    return str(folder)


def test_a_twin_fitted_at_one_and_two_users_predicts_four_and_eight(llama: LlamaServer, tmp_path: Path) -> None:
    since = time.monotonic(), _busy_s()
    engine, _ = twin_engine(tmp_path / "twin", TinyLlamaConfig(), slots=SLOTS, slot_tokens=SLOT_TOKENS)
    fit_runs = [read_run(measure(llama, tmp_path / "fit", *row)) for row in FIT]
    held = [read_run(measure(llama, tmp_path / "held", *row)) for row in HOLDOUT]
    others = others_cores(since)
    if others is not None and others > OTHERS_CORES:
        # (beside two busy loops on two cores the twin came out 0.48 off on held-out TTFT
        # against its starting constants' 0.22 in one suite run, 0.13 on E2E against 0.036
        # in the next: the orderings below are llama.cpp's only where it had its core)
        pytest.skip(f"the machine was busy: other processes kept {others:.2f} cores busy while llama.cpp "
                    f"was measured (more than {OTHERS_CORES}), so its timings are not its own")
    twin = calibrate(engine, fit_runs, held, CPU_FIT, max_evaluations=400)
    start = calibrate(engine, fit_runs, held, CPU_FIT, max_evaluations=1)  # (the constants it starts from)
    without = calibrate(engine, fit_runs, held, tuple(n for n in CPU_FIT if n != "kv_stream"), max_evaluations=400)

    def err(fit: Fit, side: str, metric: str) -> float:
        value = median_abs_error(getattr(fit, side), metric)
        assert value is not None, metric
        return value

    # Held out, TTFT and E2E each. In ten sets of this test's measurements taken by hand
    # on 2026-12-05 (bench/README.md, "llamacpp_twin.py"), the twin was 0.06-0.26 off on
    # TTFT where its starting constants were 0.40-0.84, and 0.08-0.22 on E2E against
    # 0.43-0.61. Throughput is not asserted: 0.10-0.30 against 0.26-0.34, worse in one
    # of the ten, where the simulated closed loop keeps its users' prefills together and
    # llama.cpp's come apart (docs/validation.md, "Known misses").
    for metric in ("ttft_p50_ms", "e2e_p50_ms"):
        assert err(twin, "holdout_runs", metric) < err(start, "holdout_runs", metric), metric
    # llama.cpp's TPOT at one user grows with the context (a decode reads all of it):
    # 1.9-2.5x from 64 to 1,536 tokens in those ten. Without kv_stream the fit cannot
    # follow it: it predicted 33-46 % less growth than measured, the twin 2-17 % less.
    def growth(fit: Fit) -> float:
        rows = fit.fit_runs
        short, long = rows[FIT.index((1, 64, 32, 6))], rows[FIT.index((1, 1536, 32, 6))]
        ratio = {k: long[k]["tpot_p50_ms"] / short[k]["tpot_p50_ms"] for k in ("measured", "predicted")}
        return abs(float(ratio["predicted"]) / float(ratio["measured"]) - 1)

    assert growth(twin) < growth(without)


def test_the_device_is_measured_on_one_blas_thread_whatever_this_process_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server computes on one thread, so the device's GEMM rate is one thread's: the
    measurement runs in a fresh interpreter with its BLAS held to one thread (numpy reads
    the thread count once, at import, so setting it in a process that imported numpy
    already does nothing), and its rates are what the GPU file says."""
    import subprocess

    import inferlab.engines.cpu_twin as cpu_twin

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    seen: dict[str, str] = {}

    def run(cmd: list[str], *, env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"flops": 1.25e11, "bandwidth": 4.0e10}\n', stderr="")

    monkeypatch.setattr(cpu_twin.subprocess, "run", run)
    rates = cpu_twin.measure_device(tmp_path / "device.json", 10 * 2**20)
    assert all(seen[k] == "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"))
    spec = json.loads((tmp_path / "device.json").read_text())
    assert spec["bf16_dense_tflops"] == pytest.approx(0.125) and spec["hbm_bw_tbs"] == pytest.approx(0.04)
    assert rates == {"gflops": pytest.approx(125.0), "gb_s": pytest.approx(40.0)}


def test_a_device_measurement_that_fails_says_why_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measuring subprocess that dies (numpy missing, killed) is a runtime failure with
    its last line of stderr, not a traceback from deep inside subprocess."""
    import subprocess

    import inferlab.engines.cpu_twin as cpu_twin
    from inferlab._errors import RunFailedError

    def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        raise subprocess.CalledProcessError(1, cmd, output="", stderr="Traceback ...\nModuleNotFoundError: No module named 'numpy'\n")

    monkeypatch.setattr(cpu_twin.subprocess, "run", run)
    with pytest.raises(RunFailedError, match="No module named 'numpy'"):
        cpu_twin.measure_device(tmp_path / "device.json", 1024)
    for failure in (subprocess.CalledProcessError(-9, "python", output="", stderr="\n"),
                    subprocess.TimeoutExpired("python", 300, stderr=b"partial")):
        def dies(cmd: list[str], failure: Exception = failure, **kw: object) -> subprocess.CompletedProcess[str]:
            raise failure

        monkeypatch.setattr(cpu_twin.subprocess, "run", dies)
        with pytest.raises(RunFailedError, match=r"\(exit -9\): no message|longer than 300 s"):
            cpu_twin.measure_device(tmp_path / "device.json", 1024)
    assert not (tmp_path / "device.json").exists()
