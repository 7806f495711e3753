"""``sim run --replicas N --router POLICY``: several simulated engines in parallel behind
the gateway's routing policies, in virtual time."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.load.policy import OpenLoopPolicy
from inferlab.load.replicas import Replicas
from inferlab.load.virtual import SimulatedServer, serve
from inferlab.results.summary import summarize
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.workload.spec import RequestSpec


def sim_run(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["sim", "run", "--json", "--seed", "1", *args])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def test_replicas_run_in_parallel_and_round_robin_shares_the_requests_evenly() -> None:
    specs = [(0.0, RequestSpec(list(range(i * 7 % 50, i * 7 % 50 + 300)), 40)) for i in range(64)]

    def served(n: int) -> tuple[list[int], float]:
        servers = [SimulatedServer(Engine(EngineConfig(max_num_seqs=8))) for _ in range(n)]
        target: Any = servers[0] if n == 1 else Replicas(servers, "round-robin")
        records = serve(target, OpenLoopPolicy(iter(specs), max_concurrency=None, warmup=0))
        assert all(r.ok for r in records) and len(records) == 64
        sent = target.sent if n > 1 else [64]
        return sent, summarize(records).duration_s

    _, one_s = served(1)
    four_sent, four_s = served(4)
    assert four_sent == [16, 16, 16, 16]
    assert one_s > 3 * four_s  # a batch of 8 at a time: four engines finish nearly 4x sooner


def test_prefix_affinity_beats_round_robin_on_cache_hits_and_ttft_over_4_replicas() -> None:
    # 128 groups sharing 2,000-token prefixes: more than one L40S's prefix cache holds
    # when every replica sees every group (round robin), not when each sees a quarter
    workload = ["--gpu", "L40S", "--replicas", "4", "--prefix-groups", "128", "--prefix-tokens", "2000",
                "--suffix-tokens", "100", "--output-tokens", "50", "--rate", "12", "-n", "500"]
    rr = sim_run(*workload, "--router", "round-robin")
    pa = sim_run(*workload, "--router", "prefix-affinity")
    hit = {name: s["cached_tokens"] / s["input_tokens"] for name, s in (("rr", rr), ("pa", pa))}
    assert hit["pa"] > 1.5 * hit["rr"]
    assert pa["ttft_ms"]["mean"] < rr["ttft_ms"]["mean"] and pa["ttft_ms"]["p50"] < rr["ttft_ms"]["p50"]
    assert pa["counts"]["completed"] == rr["counts"]["completed"] == 500
    assert pa["config"]["replicas"] == {"count": 4, "router": "prefix-affinity"}


def test_router_without_replicas_and_step_log_with_replicas_are_refused(tmp_path: Any) -> None:
    r = CliRunner().invoke(main, ["sim", "run", "-n", "5", "--router", "prefix-affinity"])
    assert r.exit_code == 2 and "--replicas" in r.output
    r = CliRunner().invoke(main, ["sim", "run", "-n", "5", "--replicas", "2", "--step-log", str(tmp_path / "s.jsonl")])
    assert r.exit_code == 2 and "--step-log" in r.output
