"""``inferlab compare`` passes on what makes a pair of runs unfit to set side by side: a
run's own summary warning its prompts were served from a cache an earlier run filled
(``--fail-if`` refused on it unless allowed), and records that time TTFT from different
points (one side's predate ``connect_wait_ns``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


def inferlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})


@pytest.fixture(scope="module")
def reused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two runs of one seed and salt against one simulated server: the second's prompts
    are in the prefix cache the first filled."""
    d = tmp_path_factory.mktemp("reused")

    def cfg(out: str) -> BenchConfig:
        return BenchConfig(LoadConfig(ClosedLoop(4), num_requests=40, seed=7),
                           WorkloadConfig(input_tokens=400, output_tokens=4, prompt_salt="same"), out_dir=str(d / out))

    async def both() -> None:
        await bench_async(cfg("first"), server.url)
        await bench_async(cfg("again"), server.url)

    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=4096), enable_prompt_tokens_details=True)) as server:
        asyncio.run(both())
    yield d


def test_a_runs_cache_warning_is_carried_into_the_comparison(reused: Path, tmp_path: Path) -> None:
    first, again = str(reused / "first"), str(reused / "again")
    p = inferlab("compare", first, again, "--json")
    assert p.returncode == 0, p.stderr
    runs = json.loads(p.stdout)["runs"]
    assert runs[0]["caveats"] == []
    (caveat,) = runs[1]["caveats"]
    assert "prefix cache" in caveat and "earlier run" in caveat
    assert "again's summary warns" in p.stderr
    p = inferlab("compare", first, again)
    assert "again's summary warns: the server served" in p.stdout and "not the server's alone" in p.stdout
    inferlab("report", first, again, "-o", str(tmp_path / "r.html"))
    assert "again&#x27;s summary warns" in (tmp_path / "r.html").read_text()


def test_fail_if_is_refused_on_a_run_its_summary_calls_unfit_unless_allowed(reused: Path) -> None:
    first, again = str(reused / "first"), str(reused / "again")
    p = inferlab("compare", first, again, "--fail-if", "ttft_p50>+1000%")
    assert p.returncode == 2 and "--allow-unreliable" in p.stderr and "prefix cache" in p.stderr
    p = inferlab("compare", first, again, "--fail-if", "ttft_p50>+1000%", "--allow-unreliable")
    assert p.returncode == 0, p.stderr
    assert inferlab("compare", first, again, "--allow-unreliable").returncode == 2  # (without --fail-if: nothing to allow)


def _strip_connect_wait(run: Path) -> None:
    """``run``'s records as the code before ``connect_wait_ns`` wrote them: no such key."""
    path = run / "requests.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in lines:
        r.pop("connect_wait_ns", None)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def _open_connections(run: Path, ms: float) -> None:
    """Every other completed record of ``run`` waited ``ms`` for a new connection."""
    path = run / "requests.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in lines[::2]:
        r["connect_wait_ns"] = int(ms * 1e6)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_records_that_predate_connect_wait_are_said_to_time_ttft_from_another_point(reused: Path, tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(reused / "first", old)
    shutil.copytree(reused / "first", new)
    _strip_connect_wait(old)
    _open_connections(new, 3.0)
    for a, b in ((old, new), (new, old)):  # (either way round)
        p = inferlab("compare", str(a), str(b), "--json")
        assert p.returncode == 0, p.stderr
        said = json.loads(p.stdout)["comparisons"][0]["connect_wait_definitions"]
        assert said["without"] == "old" and said["with"] == "new"
        assert said["connect_wait"]["opened_connection"] == said["connect_wait"]["requests"] // 2 + said["connect_wait"]["requests"] % 2
        assert "old's records predate connect_wait_ns and new's have it" in p.stderr
    p = inferlab("compare", str(old), str(new))
    line = next(line for line in p.stdout.splitlines() if "predate connect_wait_ns" in line)
    assert "20 of 40 completed requests (50%) opened one" in line and "p99 3.00 ms" in line
    # runs that both record it (or both predate it) time TTFT alike: nothing said
    p = inferlab("compare", str(reused / "first"), str(new), "--json")
    assert json.loads(p.stdout)["comparisons"][0]["connect_wait_definitions"] is None and "predate" not in p.stderr


def test_a_gateway_access_log_is_not_said_to_predate_connect_wait(reused: Path, tmp_path: Path) -> None:
    # inferlab gateway's access log has no connect_wait_ns because its send_ns is a
    # request's arrival on its client's connection, not because it is old: set beside a
    # bench run, compare said "gw's records predate connect_wait_ns"
    gw, new = tmp_path / "gw", tmp_path / "new"
    shutil.copytree(reused / "first", gw)
    shutil.copytree(reused / "first", new)
    _strip_connect_wait(gw)
    (gw / "summary.json").unlink()  # (the gateway writes none)
    (gw / "config.json").write_text(json.dumps({"gateway": {"upstreams": ["127.0.0.1:8000"], "admission": "tokens", "keys": []}}))
    _open_connections(new, 3.0)
    for a, b in ((gw, new), (new, gw)):
        p = inferlab("compare", str(a), str(b), "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["comparisons"][0]["connect_wait_definitions"] is None and "predate" not in p.stderr
