"""bench against sim serve, and sim run, where prompt + max_tokens exceeds the context:
the two agree by release (vLLM 0.32 on lowers max_tokens to what the context leaves;
before it, a 400), and bench still refuses, before sending, exact lengths the context
cannot hold (it could not measure what it asks)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.load.virtual import simulate
from inferlab.results.summary import LENGTH_CUT
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.config import WorkloadConfig

CONTEXT = 512
# 400-token prompts asking up to 200 tokens on a 512-token context: each fits alone and
# not with its answer
LOAD = ("-n", "4", "-c", "1", "--input-tokens", "400", "--output-tokens", "200", "--seed", "3")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180)


def outcome(run_dir: Path) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Each request's (prompt tokens, status, output tokens, finish reason), in order, and
    the summary's warnings."""
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    got = [(r["input_tokens"], r["status"], r.get("output_tokens"), r.get("finish_reason")) for r in rows if not r.get("warmup")]
    return got, json.loads((run_dir / "summary.json").read_text())["warnings"]


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("release", [None, "0.31"])
def test_sim_run_answers_as_sim_serve_does(tmp_path: Path, release: str | None, api: str) -> None:
    named = [] if release is None else ["--engine-version", release]
    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=CONTEXT, engine_version=release))) as server:
        served = cli("bench", "--url", server.url, *LOAD, "--api", api, "--no-exact-output", "--out", str(tmp_path / "served"))
    ran = cli("sim", "run", "--max-model-len", str(CONTEXT), *named, *LOAD, "--api", api, "--no-exact-output",
              "--out", str(tmp_path / "ran"))
    (bench, bench_warnings), (sim, sim_warnings) = outcome(tmp_path / "served"), outcome(tmp_path / "ran")
    # (a refused request's prompt is not counted by bench: no usage came back)
    assert [r[1:] for r in bench] == [r[1:] for r in sim] and len(bench) == 4
    prompts = {r[0] for r in sim}
    assert len(prompts) == 1 and {r[0] for r in bench} - {None} <= prompts
    prompt = prompts.pop()
    assert prompt + 200 > CONTEXT > prompt
    if release is None:  # answered, each within what the context leaves; cut there, it says so
        assert served.returncode == ran.returncode == 0, (served.stderr, ran.stderr)
        assert bench == sim and all(s == 200 and out <= CONTEXT - n for n, s, out, _ in bench)
        cut = [r for r in bench if r[3] == "length"]
        assert cut and all(out == CONTEXT - n for n, _, out, _ in cut)
        assert any(LENGTH_CUT in w for w in bench_warnings) and any(LENGTH_CUT in w for w in sim_warnings)
    else:
        assert served.returncode == ran.returncode == 1
        assert all(s == 400 for _, s, _, _ in bench)


def test_bench_refuses_exact_lengths_the_clamping_server_could_not_give(tmp_path: Path) -> None:
    """Asked for exactly 200 tokens after a 400-token prompt, a current vLLM would answer
    at most 112 (ignore_eos) or refuse min_tokens 200 over its lowered max_tokens:
    refused before sending."""
    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=CONTEXT))) as server:
        p = cli("bench", "--url", server.url, *LOAD, "--out", str(tmp_path / "r"))
        with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
            metrics = r.read().decode()
    assert p.returncode == 2 and "every request would fail" in p.stderr and "Traceback" not in p.stderr, p.stderr
    # (its probes' short prompts only: none of the run's 400-token prompts was sent)
    prompt_tokens = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("vllm:prompt_tokens_total")]
    assert len(prompt_tokens) == 1 and prompt_tokens[0] < 400


def test_sim_run_exact_output_over_the_context_fails_as_the_server_answers() -> None:
    """Exact output sends min_tokens: over max_tokens as a current vLLM lowers it, a 400
    in sim run as in sim serve (bench refuses such a run before sending)."""
    records = simulate(Engine(EngineConfig(max_model_len=CONTEXT)), LoadConfig(ClosedLoop(1), num_requests=2),
                       WorkloadConfig(400, 200).build(0))
    for r in records:
        assert r.input_tokens is not None and r.status == 400 and r.error is not None
        assert r.error.endswith(f"min_tokens must be less than or equal to max_tokens={CONTEXT - r.input_tokens}, got 200.")
