"""The client watches itself: loop lag and CPU of every sending process, measured during
a real run, in the summary, with the bottleneck warning when the client is starved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab._clock import WallClock
from inferlab.load.monitor import INTERVAL_S, LoopMonitor
from inferlab.results.clientload import ClientLoad
from inferlab.results.records import RequestRecord
from inferlab.results.summary import Summary
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


def busy(seconds: float) -> None:
    """Hold the CPU (and so the event loop) for ``seconds`` of CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


async def test_a_blocked_loop_shows_as_lag_and_cpu() -> None:
    idle = LoopMonitor(WallClock())
    idle.start()
    await asyncio.sleep(INTERVAL_S * 6)
    quiet = await idle.stop()
    blocked = LoopMonitor(WallClock())
    blocked.start()
    await asyncio.sleep(INTERVAL_S)
    busy(INTERVAL_S * 6)  # six timer periods without the loop
    await asyncio.sleep(INTERVAL_S * 2)
    held = await blocked.stop()
    assert held.loop_lag_ms and quiet.loop_lag_ms
    assert max(held.loop_lag_ms) > max(quiet.loop_lag_ms)
    assert max(held.loop_lag_ms) >= INTERVAL_S * 1000  # at least one timer missed a whole period
    assert held.cpu_s > quiet.cpu_s
    assert held.seconds and quiet.seconds  # the (partial) last second is in the timeline


@pytest.fixture(scope="module")
def sim() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096, api_overhead_s=0.0))) as server:
        yield server


def starve(seconds: float) -> Callable[[RequestRecord], None]:
    def on_record(_: RequestRecord) -> None:
        busy(seconds)

    return on_record


async def test_a_starved_client_says_it_was_the_bottleneck(sim: EmbeddedServer) -> None:
    cfg = BenchConfig(LoadConfig(ClosedLoop(4), num_requests=24), WorkloadConfig(input_tokens=30, output_tokens=16))
    result = await bench_async(cfg, sim.url, on_record=starve(0.05))  # 50 ms of CPU in the loop per record
    client = result.summary.client
    assert isinstance(client, ClientLoad) and client.bottleneck
    assert [p.role for p in client.processes] == ["client"]
    assert any(w.startswith("the client was likely the bottleneck") for w in result.summary.warnings)
    # and in summary.json
    again = Summary.from_json(result.summary.to_json())
    assert isinstance(again.client, ClientLoad) and again.client.bottleneck


async def test_with_workers_every_process_reports(sim: EmbeddedServer) -> None:
    cfg = BenchConfig(LoadConfig(ClosedLoop(4), num_requests=12), WorkloadConfig(input_tokens=30, output_tokens=8), workers=2)
    result = await bench_async(cfg, sim.url)
    client = result.summary.client
    assert isinstance(client, ClientLoad)
    assert [p.role for p in client.processes] == ["parent", "worker 1", "worker 2"]
    assert all(p.loop_lag_ms is not None and p.timeline for p in client.processes)


async def test_a_virtual_time_run_has_no_client_block() -> None:
    from inferlab import RunConfig, SimTarget, run

    result = await run(RunConfig(LoadConfig(ClosedLoop(2), num_requests=4)), SimTarget())
    assert "client" not in result.summary.to_json()


@pytest.mark.parametrize(("sysctl", "cgroup", "applies"), [
    ("1\n", "0::/\n", True),  # cgroup v2, the root cgroup
    ("1\n", "12:cpu,cpuacct:/\n0::/\n", True),  # hybrid, cpu at the root
    ("0\n", "0::/\n", False),  # autogroup off
    ("1\n", "0::/system.slice/docker-abc.scope\n", False),  # a container's cgroup: autogroups do not divide it
    ("1\n", "12:cpu,cpuacct:/kubepods/pod1\n0::/\n", False),
])
def test_autogroup_is_said_to_apply_only_where_it_divides_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sysctl: str, cgroup: str, applies: bool,
) -> None:
    import builtins

    from inferlab.load import monitor

    files = {"/proc/sys/kernel/sched_autogroup_enabled": sysctl, "/proc/self/cgroup": cgroup}
    real_open = builtins.open

    def fake_open(path: str, *args: object, **kwargs: object) -> object:
        if path in files:
            (tmp_path / "f").write_text(files[path])
            return real_open(tmp_path / "f")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", fake_open)
    assert monitor.autogroup_enabled() is applies
