"""bench against the simulated server over real loopback HTTP, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, OpenLoop, WorkloadConfig, bench_async
from inferlab.results.metrics import DISTRIBUTION_KEYS
from inferlab.results.runfiles import read_records
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

SUMMARY_KEYS = {
    "schema", "config", "counts", "request_throughput_rps", "output_token_throughput_tps",
    "total_token_throughput_tps", "output_tpm", "total_tpm", "goodput_rps",
    "ttft_ms", "ttfb_ms", "e2e_ms", "tpot_ms", "itl_ms", "queue_delay_ms", "decode_tps",
}


@pytest.fixture(scope="module")
def sim() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=8192))) as server:
        yield server


async def test_closed_loop_against_sim_writes_the_contract(sim: EmbeddedServer, tmp_path: Path) -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(4), num_requests=12, warmup=2),
        workload=WorkloadConfig(input_tokens=64, output_tokens=16),
        api="completions",
        out_dir=str(tmp_path),
    )
    result = await bench_async(cfg, sim.url)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s) >= SUMMARY_KEYS
    for key in ("ttft_ms", "ttfb_ms", "e2e_ms", "tpot_ms", "itl_ms", "queue_delay_ms", "decode_tps"):
        assert set(s[key]) == set(DISTRIBUTION_KEYS)
    assert s["counts"]["completed"] == 12 and s["counts"]["failed"] == 0 and s["counts"]["warmup"] == 2
    # the completions API with built-in words: exact prompt and output lengths
    records = list(read_records(tmp_path / "requests.jsonl"))
    assert len(records) == 14
    assert all(r.input_tokens == 64 and r.output_tokens == 16 for r in records)
    assert s["output_tokens"] == 12 * 16 and s["token_source"] == "server usage"
    # every measured request streamed one content chunk per token, in order
    for r in result.records:
        assert len(r.content_ns) == 16
        assert r.send_ns is not None and r.ttfb_ns is not None and r.end_ns is not None
        assert r.send_ns <= r.ttfb_ns <= r.content_ns[0] <= r.content_ns[-1] <= r.end_ns
    # the server's timeline came back and the client's TTFT is never below the server's
    sv = s["server_timeline"]
    assert sv["requests"] == 12
    assert sv["ttft_error_ms"]["min"] > 0


async def test_open_loop_keeps_intended_send_times(sim: EmbeddedServer) -> None:
    cfg = BenchConfig(
        load=LoadConfig(OpenLoop(40.0, "constant"), num_requests=10),
        workload=WorkloadConfig(input_tokens=32, output_tokens=4),
    )
    result = await bench_async(cfg, sim.url)
    intended = [r.intended_send_ns for r in result.records]
    assert intended == [round(i * 1e9 / 40) for i in range(10)]
    assert result.summary.counts.completed == 10
    assert result.summary.queue_delay_ms is not None


async def test_longer_prompts_take_longer_to_first_token(sim: EmbeddedServer) -> None:
    async def server_ttft(input_tokens: int) -> float:
        cfg = BenchConfig(
            load=LoadConfig(ClosedLoop(1), num_requests=3),
            workload=WorkloadConfig(input_tokens=input_tokens, output_tokens=2),
            api="completions",
        )
        s = (await bench_async(cfg, sim.url)).summary
        return float(s.server_timeline.server_ttft_ms.p50)

    assert await server_ttft(4000) > 1.5 * await server_ttft(100)


async def test_non_streaming_reports_e2e_only(sim: EmbeddedServer) -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(2), num_requests=4),
        workload=WorkloadConfig(input_tokens=16, output_tokens=8),
        stream=False,
    )
    s = (await bench_async(cfg, sim.url)).summary
    assert s.counts.completed == 4
    assert s.e2e_ms is not None and s.ttft_ms is None and s.tpot_ms is None
    assert s.output_tokens == 32


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_bench_on_embedded_default_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_cli("bench", "--num-requests", "40", "--concurrency", "8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["counts"]["completed"] == 40
    assert len((out / "requests.jsonl").read_text().splitlines()) == 40
    assert "TTFT" in p.stdout and "TPOT" in p.stdout and "TPM" in p.stdout


def test_cli_bench_spreads_a_model_too_big_for_one_gpu_over_as_few_as_hold_it() -> None:
    """Mixtral-8x7B's 87 GiB of bf16 weights do not fit one 80 GB card: the embedded
    server runs it with tensor parallelism 2, says so, and the run completes."""
    p = run_cli("bench", "--model", "mistralai/Mixtral-8x7B-Instruct-v0.1", "-n", "4", "--json")
    assert p.returncode == 0, p.stderr
    assert "on 2x H100" in p.stderr
    assert json.loads(p.stdout)["counts"]["completed"] == 4


def test_cli_bench_says_when_eight_gpus_cannot_hold_the_model() -> None:
    p = run_cli("bench", "--model", "meta-llama/Llama-3.1-405B-Instruct", "-n", "2")
    assert p.returncode == 2
    assert "8x H100" in p.stderr and "--url" in p.stderr and "Traceback" not in p.stderr


def test_cli_bench_serves_a_short_context_model_within_its_context() -> None:
    """TinyLlama's context is 2,048 tokens, under the embedded server's 4,096 default:
    the server takes the model's length instead of refusing to start."""
    p = run_cli("bench", "--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "-n", "4", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["counts"]["completed"] == 4


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["bench", "--concurrency", "0"], 2, "--concurrency must be at least 1"),
        (["bench", "--rate", "fast"], 2, "not a number"),
        (["bench", "-c", "2", "--rate", "3"], 2, "exclusive"),
        (["bench", "--url", "http://127.0.0.1:9", "-n", "2"], 1, "cannot reach"),
        (["bench", "--url", "ftp://x"], 2, "not an http"),
        (["bench", "--url", "https://127.0.0.1:9", "--http-client", "httptools", "-n", "1"], 2, "plain http:// only"),
        (["sim", "serve", "--model", "no-such-model"], 2, "no-such-model"),
        (["sim", "serve", "--port", "99999"], 2, "--port"),
        (["bench", "--timeout", "-1"], 2, "--timeout"),
        (["bench", "--sessions", "0"], 2, "--sessions"),
        (["bench", "--bogus"], 2, "No such option"),
        (["bench", "--tokenizer", "/nonexistent/tok"], 2, "--tokenizer"),
        (["bench", "--model", "no-such-model", "-n", "1"], 2, "unknown model"),
        (["bench", "--input-tokens", "uniform:100:10"], 2, "--input-tokens"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], code: int, needle: str) -> None:
    p = run_cli(*args, timeout=60)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert needle in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr  # one line, no banner first


def test_cli_all_requests_failing_exits_1_and_keeps_summary(tmp_path: Path) -> None:
    # (vLLM before 0.32 refuses prompt + max_tokens over the context; 0.32 answers it cut
    # short: test_bench_context_edge)
    with EmbeddedServer(ServerConfig(engine=EngineConfig(max_model_len=256, engine_version="0.31"))) as server:
        p = run_cli(
            "bench", "--url", server.url, "-n", "3", "-c", "1", "--input-tokens", "200",
            # (a run none of whose requests can fit is refused before sending: a prompt alone
            # over the context, or exact output; without exact output a prompt that fits
            # alone is sent, and this server refuses its max_tokens over what is left)
            "--output-tokens", "100", "--no-exact-output", "--out", str(tmp_path), "--json",
        )
    assert p.returncode == 1
    assert "all 3 requests failed" in p.stderr and "maximum context length" in p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["counts"] == {**s["counts"], "completed": 0, "failed": 3, "errors": {"http_status": 3}}
    assert json.loads(p.stdout)["counts"]["failed"] == 3


def test_cli_sigterm_keeps_what_was_measured(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "run"
    with EmbeddedServer(ServerConfig()) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferlab", "bench", "--url", server.url, "-c", "4", "-n", "400",
             "--input-tokens", "32", "--output-tokens", "200", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        requests = out / "requests.jsonl"
        deadline = time.monotonic() + 60  # bounded wait for the first finished request
        while time.monotonic() < deadline and not (requests.exists() and requests.read_text().strip()):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    s = json.loads((out / "summary.json").read_text())
    lines = requests.read_text().splitlines()
    assert s["interrupted"] is True
    assert 1 <= s["counts"]["completed"] < 400
    assert s["counts"]["completed"] + s["counts"]["cancelled"] == len(lines)
    assert s["counts"]["failed"] == 0


def test_cli_a_web_server_that_is_no_inference_server(tmp_path: Path) -> None:
    import http.server
    import threading
    from functools import partial

    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        no_models = run_cli("bench", "--url", url, "-n", "2", timeout=60)
        post_refused = run_cli("bench", "--url", url, "--model", "m", "-n", "2", "--out", str(tmp_path / "r"), timeout=60)
    finally:
        httpd.shutdown()
    assert no_models.returncode == 1 and "OpenAI-compatible" in no_models.stderr
    assert post_refused.returncode == 1 and "does not answer like an OpenAI-compatible server" in post_refused.stderr
    for p in (no_models, post_refused):
        assert len(p.stderr.strip().splitlines()) == 1 and "<" not in p.stderr, p.stderr


def test_sim_serve_starts_as_the_common_vllm_example() -> None:
    """The embedded default (`sim serve` with no flags) is the issue's example:
    --max-model-len 4096 --max-num-batched-tokens 8192 --enforce-eager on one H100."""
    import urllib.request

    from inferlab.sim.server.launch import ChildServer

    server = ChildServer()
    try:
        with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
            card = json.loads(r.read())["data"][0]
    finally:
        server.close()
    assert card["max_model_len"] == 4096


async def test_overwriting_a_run_leaves_none_of_its_server_metrics(sim: EmbeddedServer, tmp_path: Path) -> None:
    # (the report reads server_metrics.jsonl: the replaced run's pages showed as this run's)
    def cfg(server_metrics: bool) -> BenchConfig:
        return BenchConfig(
            load=LoadConfig(ClosedLoop(2), num_requests=2), workload=WorkloadConfig(input_tokens=8, output_tokens=2),
            out_dir=str(tmp_path), overwrite=True, server_metrics=server_metrics, preflight=False,
        )

    await bench_async(cfg(True), sim.url)
    assert (tmp_path / "server_metrics.jsonl").exists()
    await bench_async(cfg(False), sim.url)
    assert not (tmp_path / "server_metrics.jsonl").exists()
    assert len(list(read_records(tmp_path / "requests.jsonl"))) == 2


async def test_without_a_preflight_the_summary_says_prompt_lengths_are_approximate(sim: EmbeddedServer) -> None:
    # (its prompts are built at one word per token, the template's tokens unknown: the
    # summary said "unknown (no preflight)" and warned of nothing, where a probed run
    # with no exact counts says "prompt lengths are approximate (...)")
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), workload=WorkloadConfig(input_tokens=32,
                      output_tokens=2), preflight=False)
    summary = (await bench_async(cfg, sim.url)).summary
    assert isinstance(summary.input_length_source, str) and summary.input_length_source.startswith("approximate")
    assert f"prompt lengths are {summary.input_length_source}" in summary.warnings
