"""``sim run --admission MODE``: the gateway's admission (its own code) in front of the
simulated engine(s), in virtual time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.cli.main import main
from inferlab.gateway.admission import Admission
from inferlab.gateway.config import AdmissionMode
from inferlab.load.admitted import REFUSED_PREFIX, Admitted
from inferlab.load.policy import OpenLoopPolicy
from inferlab.load.replicas import Replicas
from inferlab.load.virtual import SimulatedServer, serve
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.workload.spec import RequestSpec


def sim_run(*args: str, out: Path | None = None) -> dict[str, Any]:
    extra = ["-o", str(out)] if out is not None else []
    result = CliRunner().invoke(main, ["sim", "run", "--json", "--seed", "1", *extra, *args])
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.output)
    return summary


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def arrivals() -> list[tuple[float, RequestSpec]]:
    """Bursts with idle gaps between them (prompts of different lengths)."""
    out = []
    for burst in range(4):
        for k in range(12):
            n = 200 + 150 * ((burst * 12 + k) % 7)
            out.append((burst * 3.0 + k * 0.01, RequestSpec(list(range(k, k + n)), 30 + 10 * (k % 4))))
    return out


def served(replicas: int, mode: AdmissionMode | None, **budget: int) -> list[RequestRecord]:
    servers = [SimulatedServer(Engine(EngineConfig(max_num_seqs=8))) for _ in range(replicas)]
    target: Any = servers[0] if replicas == 1 else Replicas(servers, "least-outstanding")
    if mode is not None:
        clock = VirtualClock()
        admission = Admission(mode, [budget.get("tokens", 4000)] * replicas, [budget.get("requests", 3)] * replicas,
                              queue_max=1000, queue_timeout_s=600, starvation_s=30, clock=clock)
        target = Admitted(target, admission, clock, default_max_tokens=256)
    return serve(target, OpenLoopPolicy(iter(arrivals()), max_concurrency=None, warmup=0))


def timings(rs: list[RequestRecord]) -> list[tuple[Any, ...]]:
    return [(r.index, r.send_ns, r.ttfb_ns, tuple(r.content_ns), r.end_ns, r.status) for r in rs]


def test_admission_off_changes_no_time_with_one_engine_or_behind_a_router() -> None:
    for replicas in (1, 2):
        plain, off = served(replicas, None), served(replicas, "off")
        assert len(plain) == 48 and all(r.ok for r in plain)
        assert timings(off) == timings(plain)
        assert all((r.server_timeline or {}).get("gateway_queue_ms") == 0.0 for r in off)


def test_no_engine_ever_holds_more_than_its_budget_and_the_budget_binds() -> None:
    def most_at_once(rs: list[RequestRecord]) -> int:
        """The most requests between reaching an engine and their last token."""
        events = []
        for r in rs:
            assert r.send_ns is not None and r.end_ns is not None
            arrive = r.send_ns + round((r.server_timeline or {}).get("gateway_queue_ms", 0.0) * 1e6)
            # (the timeline's times have 4 decimals of ms: a request that went as another
            # ended may seem to arrive up to 50 ns before that end)
            events += [(arrive, 1), (r.end_ns - 100, -1)]
        level = most = 0
        for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # (an end before a start at one time)
            level += step
            most = max(most, level)
        return most

    by_requests = served(2, "requests", requests=3)
    assert all(r.ok for r in by_requests)
    assert most_at_once(served(2, None)) > 6  # (without a gateway the bursts pile up)
    assert most_at_once(by_requests) == 6  # 3 per engine, and both full at some point
    waited = [r.server_timeline["gateway_queue_ms"] for r in by_requests if r.server_timeline]
    assert max(waited) > 0 and min(waited) == 0


def test_a_full_queue_and_a_long_wait_are_refused_with_503_as_the_gateway_answers(tmp_path: Path) -> None:
    s = sim_run("--rate", "inf", "-n", "8", "--input-tokens", "100", "--output-tokens", "500",
                "--admission", "requests", "--max-requests-in-flight", "1", "--queue-max", "2",
                "--queue-timeout-s", "0.5", out=tmp_path)
    assert s["counts"]["completed"] == 1 and s["counts"]["failed"] == 7
    assert s["gateway"]["refused"] == {"queue_full": 5, "queue_timeout": 2} and s["gateway"]["admitted"] == 1
    assert s["config"]["admission"] == {"mode": "requests", "max_requests_in_flight": 1, "queue_max": 2, "queue_timeout_s": 0.5}
    refused = [r for r in records(tmp_path) if r["status"] == 503]
    assert len(refused) == 7 and all(r["error_kind"] == "http_status" and r["error"].startswith(REFUSED_PREFIX) for r in refused)
    late = [r for r in refused if "within 0.5 s" in r["error"]]
    assert len(late) == 2 and all(r["end_ns"] - r["send_ns"] == NS_PER_S // 2 for r in late)
    full = [r for r in refused if "queue is full (2 requests waiting)" in r["error"]]
    assert len(full) == 5 and all(r["end_ns"] - r["send_ns"] < NS_PER_S // 1000 for r in full)


def test_a_waiter_goes_when_the_request_before_it_ends_and_its_wait_is_in_the_breakdown(tmp_path: Path) -> None:
    s = sim_run("--rate", "inf", "-n", "2", "--input-tokens", "100", "--output-tokens", "50", "--served",
                "--admission", "requests", "--max-requests-in-flight", "1", out=tmp_path)
    first, second = records(tmp_path)
    assert first["server_timeline"]["gateway_queue_ms"] == 0.0
    wait_ms = second["server_timeline"]["gateway_queue_ms"]
    # sent on once the first one's stream has ended (at or after its last token); the
    # wait is recorded to 4 decimals of a ms, so it is compared at that precision
    assert wait_ms >= round((first["end_ns"] - first["send_ns"]) / 1e6, 4) > 0
    assert (second["content_ns"][0] - second["send_ns"]) / 1e6 > wait_ms  # its TTFT includes the wait
    b = s["latency_breakdown"]
    assert b["gateway_queue_ms"]["mean"] == (wait_ms + 0.0) / 2
    # the engine's own queue is apart from the gateway's: here the engine was idle both times
    assert b["server_queue_ms"]["mean"] < wait_ms / 10


def test_admission_flags_that_would_do_nothing_are_refused() -> None:
    for args, flag in (
        (["--max-tokens-in-flight", "5000"], "--max-tokens-in-flight"),
        (["--admission", "requests", "--starvation-s", "3"], "--starvation-s"),
        (["--admission", "tokens", "--max-requests-in-flight", "3"], "--max-requests-in-flight"),
        (["--admission", "off", "--queue-max", "3"], "--queue-max"),
    ):
        r = CliRunner().invoke(main, ["sim", "run", "-n", "2", *args])
        assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output, r.output
