"""Trace replay: the readers, the time window and speed-up, Mooncake's shared blocks,
and replay at the trace's times by bench (over HTTP) and sim run (virtual time)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferlab import BenchConfig, LoadConfig, WorkloadConfig, bench_async
from inferlab._errors import UsageError
from inferlab.load.schedules import Replay
from inferlab.load.virtual import simulate
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.prompts import PromptBuilder
from inferlab.workload.spec import Trace
from inferlab.workload.traces import TraceConfig, read_rows

AZURE_GAPS_S = [0.0, 0.03, 0.13, 0.18, 0.45, 0.62]


def azure_csv(path: Path, times: list[float] = AZURE_GAPS_S) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i, t in enumerate(times):
        sec = 46 + int(t)
        frac = f"{t - int(t):.7f}"[2:]
        lines.append(f"2023-11-16 18:15:{sec:02d}.{frac},{40 + i},{3 + i}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_azure_csv_rows_are_exact_offsets(tmp_path: Path) -> None:
    rows = TraceConfig(str(azure_csv(tmp_path / "az.csv"))).rows()
    assert [r.arrival_s for r in rows] == pytest.approx(AZURE_GAPS_S, abs=1e-9)
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(40 + i, 3 + i) for i in range(6)]


def test_a_byte_order_mark_is_no_part_of_the_header(tmp_path: Path) -> None:
    """A trace saved from a spreadsheet starts with a UTF-8 byte-order mark: still Azure's."""
    plain = azure_csv(tmp_path / "az.csv")
    marked = tmp_path / "bom.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + Path(plain).read_bytes())
    assert TraceConfig(str(marked)).rows() == TraceConfig(str(plain)).rows()


def test_window_and_speedup(tmp_path: Path) -> None:
    path = str(azure_csv(tmp_path / "az.csv"))
    rows = TraceConfig(path, speedup=2.0, start_s=0.1, end_s=0.5).rows()
    # kept: 0.13, 0.18, 0.45 → rebased to 0, 0.05, 0.32 → halved
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 0.025, 0.16])
    assert [r.input_tokens for r in rows] == [42, 43, 44]


def test_burstgpt_skips_failed_rows_and_reads_seconds(tmp_path: Path) -> None:
    p = tmp_path / "burst.csv"
    p.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,100,20,120,Conversation log\n"
        "7.5,ChatGPT,300,0,300,Conversation log\n"
        "9,GPT-4,50,10,60,API log\n"
    )
    with pytest.warns(UserWarning, match="1 row skipped: 0 response tokens"):  # (said, not silently dropped)
        rows = TraceConfig(str(p)).rows()
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in rows] == [(0.0, 100, 20), (4.0, 50, 10)]


def test_a_vllm_results_failed_requests_are_skipped_and_said(tmp_path: Path) -> None:
    """vLLM saves a failed request with no output and a TTFT of 0: it cannot be replayed,
    and the replay says how many it left out."""
    n = 4
    result = {"request_rate": 2.0, "input_lens": [100] * n, "output_lens": [4, 0, 4, 4],
              "ttfts": [0.02, 0.0, 0.02, 0.02], "itls": [[0.01] * 3, [], [0.01] * 3, [0.01] * 3]}
    path = tmp_path / "vllm_result.json"
    path.write_text(json.dumps(result))
    with pytest.warns(UserWarning, match="1 of 4 requests skipped: failed in the source run"):
        assert len(TraceConfig(str(path)).rows()) == 3


def test_inferlab_jsonl_sessions_and_groups_share_prefixes(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    rows = [
        {"arrival_s": 0, "input_tokens": 40, "output_tokens": 2, "session": "a"},
        {"arrival_s": 1, "input_tokens": 90, "output_tokens": 2, "session": "a"},
        {"arrival_s": 2, "input_tokens": 60, "output_tokens": 2, "prefix_group": "g", "prefix_tokens": 50},
        {"arrival_s": 3, "input_tokens": 70, "output_tokens": 2, "prefix_group": "g", "prefix_tokens": 50},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = TraceConfig(str(p)).load(PromptBuilder())
    tok = BuiltinTokenizer()
    ids = [tok.encode(str(s.spec.prompt)) for s in specs]
    assert [len(i) for i in ids] == [40, 90, 60, 70]
    assert ids[1][:40] == ids[0]  # the session's context grows
    assert ids[2][:50] == ids[3][:50]  # the group's prefix
    assert ids[2][50:60] != ids[3][50:60]  # each request's own rest


def test_mooncake_equal_hash_ids_give_identical_blocks(tmp_path: Path) -> None:
    p = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [1, 4]},
        {"timestamp": 3000, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = TraceConfig(str(p)).load(PromptBuilder())
    assert [s.arrival_s for s in specs] == [0.0, 0.5, 2.0]  # ms → s
    tok = BuiltinTokenizer()
    ids = [tok.encode(str(s.spec.prompt)) for s in specs]
    assert [len(i) for i in ids] == [1100, 700, 1000]
    assert ids[0][:512] == ids[1][:512] == ids[2][:512]  # hash id 1
    assert ids[0][512:1000] == ids[2][512:1000]  # hash id 2 (partial in the third)
    assert ids[1][512:600] != ids[0][512:600]  # 4 ≠ 2


@pytest.mark.parametrize(
    ("content", "where", "why"),
    [
        ('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 1}\n{"arrival_s": 1, "input_tokens": "x"}\n', ":2:", "input_tokens"),
        ('{"arrival_s": 0, "input_tokens": 0, "output_tokens": 1}\n', ":1:", "at least 1"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,2\nyesterday,10,2\n", ":3:", "bad timestamp"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,ten,2\n", ":2:", "azure"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10.0,2\n2023-11-16 18:15:47.1,10.7,2\n", ":3:", "'10.7'"),
        ('{"arrival_s": 0, "input_tokens": "10.7", "output_tokens": 1}\n', ":1:", "'10.7'"),
        ("a,b,c\n1,2,3\n", ":1:", "unknown trace header"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": 3}\n', ":1:", "hash_ids"),
        ("{not json\n", ":1:", "JSON"),
    ],
)
def test_bad_trace_names_file_line_and_problem(tmp_path: Path, content: str, where: str, why: str) -> None:
    p = tmp_path / "bad.trace"
    p.write_text(content)
    with pytest.raises(UsageError) as e:
        read_rows(str(p))
    assert str(e.value).startswith(str(p) + where) and why in str(e.value)


def test_the_window_counts_seconds_after_the_first_request_and_says_so(tmp_path: Path) -> None:
    """A trace whose own clock starts at 10 s: the window is measured from its first
    request (1–3 keeps the requests at 11–12.8 s), and an empty window says the span in
    those terms; --help says the same."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    p = tmp_path / "late.jsonl"
    p.write_text("".join(json.dumps({"arrival_s": round(10 + 0.2 * i, 1), "input_tokens": 50, "output_tokens": 5}) + "\n"
                         for i in range(20)))
    rows = TraceConfig(str(p), start_s=1, end_s=3).rows()
    assert len(rows) == 10 and rows[0].arrival_s == 0 and rows[-1].arrival_s == pytest.approx(1.8)
    with pytest.raises(UsageError) as e:
        TraceConfig(str(p), start_s=11, end_s=13).rows()
    assert str(e.value) == (f"{p}: no requests in the time window (11–13 s after the trace's first request): "
                            "the trace spans 0–3.8 s from its first request")
    with pytest.raises(UsageError, match=r"\(from 4 s after the trace's first request\): the trace spans 0–3.8 s"):
        TraceConfig(str(p), start_s=4).rows()
    # an open start, in words ("-inf–0 s" once)
    with pytest.raises(UsageError, match=r"--trace-end 0 keeps no request"):
        TraceConfig(str(p), end_s=0).rows()
    assert len(TraceConfig(str(p), end_s=0.1).rows()) == 1
    helped = CliRunner().invoke(main, ["sim", "run", "--trace", str(p), "--trace-end", "0"])
    assert helped.exit_code == 2 and "-inf" not in helped.output and "--trace-end 0 keeps no request" in helped.output
    helped = " ".join(CliRunner().invoke(main, ["sim", "run", "--help"]).stdout.split())
    assert "--trace-start FLOAT Replay from this many seconds after the trace's first request" in helped
    assert "--trace-end FLOAT Replay up to (not including) this many seconds after the trace's first request" in helped
    assert "into the trace" not in helped


def test_empty_window_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no requests in the time window"):
        TraceConfig(str(azure_csv(tmp_path / "az.csv")), start_s=10).rows()
    with pytest.raises(UsageError, match=r"nope\.csv"):
        read_rows(str(tmp_path / "nope.csv"))


async def test_bench_replays_azure_trace_at_its_times(tmp_path: Path) -> None:
    trace = TraceConfig(str(azure_csv(tmp_path / "az.csv")))
    cfg = BenchConfig(
        load=LoadConfig(Replay()), workload=WorkloadConfig(trace=trace), api="completions",
    )
    with EmbeddedServer(ServerConfig()) as sim:
        result = await bench_async(cfg, sim.url)
    recs = result.records
    assert result.summary.counts.completed == len(AZURE_GAPS_S)
    assert [r.intended_send_ns for r in recs] == [round(t * 1e9) for t in AZURE_GAPS_S]
    assert [r.input_tokens for r in recs] == [40 + i for i in range(6)]
    assert [r.output_tokens for r in recs] == [3 + i for i in range(6)]
    sends = [r.send_ns for r in recs]
    assert all(s is not None for s in sends) and sends == sorted(sends)  # type: ignore[type-var]
    for r in recs:
        assert r.send_ns is not None and r.intended_send_ns is not None
        # never early; late only by scheduling noise (a run that ignored the times
        # would send the last one ~620 ms early)
        assert -1_000_000 <= r.send_ns - r.intended_send_ns < 100_000_000
    assert result.summary.queue_delay_ms.max is not None


def test_sim_run_replays_trace_in_virtual_time(tmp_path: Path) -> None:
    trace = TraceConfig(str(azure_csv(tmp_path / "az.csv")), speedup=2.0)
    wl = WorkloadConfig(trace=trace).build(0, "completions")
    assert isinstance(wl, Trace)
    records = simulate(Engine(EngineConfig()), LoadConfig(Replay()), wl)
    assert [r.intended_send_ns for r in records] == [round(t / 2 * 1e9) for t in AZURE_GAPS_S]
    # the engine admits arrivals at its next step boundary, never before
    assert all(r.send_ns is not None and r.send_ns >= (r.intended_send_ns or 0) for r in records)
    assert [r.input_tokens for r in records] == [40 + i for i in range(6)]
    # -n and -d slice the replay
    assert len(simulate(Engine(EngineConfig()), LoadConfig(Replay(), num_requests=2), wl)) == 2
    assert len(simulate(Engine(EngineConfig()), LoadConfig(Replay(), duration_s=0.1), wl)) == 4  # 0, 15, 65, 90 ms


def test_cli_trace_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,-2\n")
    cmd = [sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(bad)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"inferlab: error: {bad}:2: token counts must be at least 1"]
    p = subprocess.run([*cmd[:-1], str(azure_csv(tmp_path / "az.csv")), "--rate", "5"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--trace" in p.stderr


def test_cli_sim_run_trace_json(tmp_path: Path) -> None:
    az = azure_csv(tmp_path / "az.csv")
    cmd = [sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(az), "--speedup", "10", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["counts"]["completed"] == 6
    assert s["input_tokens"] == sum(40 + i for i in range(6))


def test_vllm_result_replay_reproduces_its_own_measurements(tmp_path: Path) -> None:
    """Round trip: a run's per-request results written in vLLM's --save-detailed layout
    (start times, lengths, TTFTs and ITLs in seconds), replayed through `sim run --trace`
    on the same engine, are predicted back with ~0% error; a slower GPU is not."""
    import math as _math

    from inferlab.load.schedules import LoadConfig, OpenLoop
    from inferlab.load.virtual import simulate
    from inferlab.sim.engine.engine import Engine, EngineConfig
    from inferlab.workload.config import WorkloadConfig

    records = simulate(Engine(EngineConfig()), LoadConfig(OpenLoop(8.0), num_requests=24, seed=3), WorkloadConfig("uniform:100:600", "uniform:5:60").build(3))
    s = 1e-9
    result = {
        "request_rate": 8.0,
        "burstiness": 1.0,
        "start_times": [r.send_ns * s for r in records],  # type: ignore[operator]
        "input_lens": [r.input_tokens for r in records],
        "output_lens": [r.output_tokens for r in records],
        "ttfts": [(r.content_ns[0] - r.send_ns) * s for r in records],  # type: ignore[operator]
        "itls": [[(b - a) * s for a, b in zip(r.content_ns, r.content_ns[1:], strict=False)] for r in records],
    }
    path = tmp_path / "vllm_result.json"
    path.write_text(json.dumps(result))

    def replay(*extra: str) -> dict:  # type: ignore[type-arg]
        p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(path), "--json", *extra],
                           capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["trace_comparison"]  # type: ignore[no-any-return]

    same = replay()
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert same[key]["requests"] == 24
        assert _math.isclose(same[key]["predicted_mean"], same[key]["measured_mean"], rel_tol=1e-3, abs_tol=0.05), key
    slower = replay("--gpu", "A100")
    assert slower["tpot_ms"]["error_pct"] > 20  # A100 streams weights ~40% slower than H100


def test_vllm_result_replay_keeps_its_max_concurrency(tmp_path: Path) -> None:
    """A result measured with `vllm bench serve --max-concurrency 2` at rate inf is
    replayed with at most 2 requests in flight (not all at t=0); a flag overrides it."""
    from inferlab.results.runfiles import read_records

    n = 12
    result = {
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 2,
        "input_lens": [300] * n, "output_lens": [20] * n,
        "ttfts": [0.03] * n, "itls": [[0.01] * 19] * n,
    }
    path = tmp_path / "vllm_result.json"
    path.write_text(json.dumps(result))

    def peak(*extra: str) -> int:
        out = tmp_path / f"run{len(extra)}"
        p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(path), "--out", str(out), *extra],
                           capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        records = list(read_records(out / "requests.jsonl"))
        assert len(records) == n
        events = sorted([(r.send_ns, 1) for r in records] + [(r.end_ns, -1) for r in records])  # type: ignore[list-item]
        level = top = 0
        for _, d in events:
            level += d
            top = max(top, level)
        return top

    assert peak() == 2
    assert peak("--max-concurrency", "5") == 5


def test_vllm_result_send_times_are_kept_when_saved(tmp_path: Path) -> None:
    """A result that saved per-request send times (absolute ``start_timestamps``) is
    replayed at those times, rebased to the first, not redrawn from its rate."""
    from inferlab.results.runfiles import read_records

    offsets = [0.0, 0.25, 1.75, 2.0]
    n = len(offsets)
    result = {"request_rate": 100.0, "start_timestamps": [1.7e9 + t for t in offsets],
              "input_lens": [100] * n, "output_lens": [4] * n, "ttfts": [0.02] * n, "itls": [[0.01] * 3] * n}
    path = tmp_path / "vllm_result.json"
    path.write_text(json.dumps(result))
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(path), "--out", str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    sends = sorted(r.send_ns for r in read_records(out / "requests.jsonl"))  # type: ignore[type-var]
    assert [round((t - sends[0]) / 1e9, 6) for t in sends] == offsets  # type: ignore[operator]


def test_vllm_result_replay_runs_the_model_it_measured(tmp_path: Path) -> None:
    """Without --model, a vLLM result's model_id picks the simulated model (said on
    stderr); --model wins; a model without a preset falls back to the default, said so."""
    n = 4
    base = {"request_rate": "inf", "input_lens": [200] * n, "output_lens": [8] * n,
            "ttfts": [0.05] * n, "itls": [[0.01] * 7] * n}

    def engine_model(model_id: str, *extra: str) -> tuple[str, str]:
        path = tmp_path / f"r{len(extra)}{abs(hash(model_id))}.json"
        path.write_text(json.dumps({**base, "model_id": model_id}))
        p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(path), "--json", *extra],
                           capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["config"]["engine"]["model"], p.stderr

    model, err = engine_model("Qwen/Qwen3-8B")
    assert model == "Qwen/Qwen3-8B" and "Qwen/Qwen3-8B" in err
    model, err = engine_model("Qwen/Qwen3-8B", "--model", "Llama-3.2-1B")
    assert model == "Llama-3.2-1B" and "the trace measured a model named Qwen/Qwen3-8B; simulating Llama-3.2-1B" in err  # (a what-if)
    model, err = engine_model("some-lab/NoSuchModel-9B")
    assert model == "Qwen/Qwen2.5-7B-Instruct" and "no preset" in err


def test_a_runs_requests_jsonl_replays_as_a_trace_and_is_compared(tmp_path: Path) -> None:
    """The requests.jsonl a run wrote is a trace: its sends, lengths and measurements.
    Replayed on the same engine it predicts itself back exactly; on a slower GPU not.
    (On an infinitely fast host: the API front end serves requests sent at the same
    instant in the order they were sent, which a trace does not keep.)"""
    first = tmp_path / "first"
    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "-c", "4", "-n", "16", "--warmup", "2",
                        "--input-tokens", "uniform:100:900", "--output-tokens", "uniform:10:60", "--host-speed", "inf",
                        "--out", str(first)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr

    def replay(*extra: str) -> dict:  # type: ignore[type-arg]
        q = subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(first / "requests.jsonl"), "--json",
                            "--host-speed", "inf", *extra],
                           capture_output=True, text=True, timeout=120, check=False)
        assert q.returncode == 0, q.stderr
        return json.loads(q.stdout)  # type: ignore[no-any-return]

    same = replay()
    # the run's warm-ups are replayed as warm-ups: load, neither counted nor compared
    assert (same["counts"]["completed"], same["counts"]["warmup"]) == (16, 2)
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        c = same["trace_comparison"][key]
        assert c["requests"] == 16 and abs(c["error_pct"]) < 0.01, key
    assert replay("--gpu", "A100")["trace_comparison"]["tpot_ms"]["error_pct"] > 20


def test_vllm_result_arrivals_follow_the_seed_and_a_summary_only_result_is_refused(tmp_path: Path) -> None:
    from inferlab._errors import UsageError
    from inferlab.workload.traces import read_rows

    n = 20
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"request_rate": 4.0, "burstiness": 1.0, "input_lens": [100] * n, "output_lens": [10] * n,
                                "ttfts": [0.02] * n, "itls": [[0.01] * 9] * n}))
    a, b = read_rows(str(path), seed=1), read_rows(str(path), seed=2)
    assert [r.arrival_s for r in a] == [r.arrival_s for r in read_rows(str(path), seed=1)]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]
    summary_only = tmp_path / "s.json"
    summary_only.write_text(json.dumps({"completed": 10, "duration": 5.0, "request_throughput": 2.0}, indent=2))
    with pytest.raises(UsageError, match="--save-detailed"):
        read_rows(str(summary_only))


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "not a text file (it holds byte 0x89, which is not UTF-8): expected a trace"),
        (b"\x1f\x8b\x08\x00\x00\x00", "the file is gzip-compressed: decompress it first"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,10,2\n\xff\xfe,1,1\n", "not a text file (it holds byte 0xff"),
        (b"", "the file is empty: no requests to replay"),
        (b"\n  \n\n", "the file is empty: no requests to replay"),
    ],
)
def test_a_binary_or_empty_trace_is_named_in_one_line(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "t.trace"
    p.write_bytes(content)
    with pytest.raises(UsageError) as e:
        read_rows(str(p))
    assert str(e.value).startswith(f"{p}: ") and needle in str(e.value), str(e.value)
    # the command line says the same, once (it reads the file for a vLLM result's cap first)
    cmd = [sys.executable, "-m", "inferlab", "sim", "run", "--trace", str(p)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [f"inferlab: error: {e.value}"]


def test_an_azure_trace_out_of_time_order_replays_in_time_order(tmp_path: Path) -> None:
    # the second row is earliest: its time from the first row is negative (was refused)
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,10,1\n"
                 "2023-11-16 18:15:45.25,20,2\n2023-11-16 18:15:47.0,30,3\n")
    rows = TraceConfig(str(p)).rows()
    assert [(r.arrival_s, r.input_tokens) for r in rows] == [(0.0, 20), (1.25, 10), (1.75, 30)]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"request_rate": -1}, "request_rate -1 must be a positive number or 'inf'"),
        ({"request_rate": "abc"}, "request_rate 'abc' must be a positive number"),
        ({"request_rate": 5, "burstiness": 0}, "burstiness 0 must be a positive number"),  # was read as 1
        ({"request_rate": 5, "start_times": [0, "x"]}, "start_times must be numbers of seconds"),
        ({"request_rate": 5, "start_times": [0]}, "one finite time per request (1 for 2)"),
    ],
)
def test_a_vllm_result_with_a_bad_rate_says_which_and_why(tmp_path: Path, fields: dict[str, object], needle: str) -> None:
    p = tmp_path / "v.json"
    p.write_text(json.dumps({"input_lens": [10, 20], "output_lens": [4, 4], **fields}))
    with pytest.raises(UsageError, match=re.escape(needle)):
        read_rows(str(p))
    p.write_text(json.dumps({"input_lens": [10, 20], "output_lens": [4, 4], "request_rate": -1, "start_times": [0.0, 0.5]}))
    assert [r.arrival_s for r in read_rows(str(p))] == [0.0, 0.5]  # its send times: the rate is not used


def test_a_sessions_runs_requests_jsonl_replays_its_growing_contexts(tmp_path: Path) -> None:
    """A multi-turn run replayed from its requests.jsonl: each turn's prompt starts with the
    session's previous one, so the prefix cache serves the replay as it served the run
    (the turns were replayed as unrelated prompts: nothing cached)."""
    first = tmp_path / "first"
    run = [sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "--json"]
    p = subprocess.run([*run, "--sessions", "4", "--turns", "4", "--input-tokens", "200", "--output-tokens", "50",
                        "--out", str(first)], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    q = subprocess.run([*run, "--trace", str(first / "requests.jsonl")], capture_output=True, text=True, timeout=120,
                       check=False)
    assert q.returncode == 0, q.stderr
    ran, replayed = json.loads(p.stdout), json.loads(q.stdout)
    assert replayed["input_tokens"] == ran["input_tokens"]
    assert ran["cached_tokens"] > 0 and replayed["cached_tokens"] >= ran["cached_tokens"] // 2


def test_azure_times_do_not_depend_on_this_machines_time_zone(tmp_path: Path) -> None:
    """Azure's TIMESTAMP has no zone: rows across a daylight-saving change of the local
    zone are still one hour apart (in New York's local time, where clocks went back at
    2:00, the third row was 3 h after the first)."""
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-05 00:30:00.0,10,2\n2023-11-05 01:30:00.0,10,2\n"
                 "2023-11-05 02:30:00.0,10,2\n")
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        rows = TraceConfig(str(p)).rows()
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
    assert [r.arrival_s for r in rows] == [0.0, 3600.0, 7200.0]


@pytest.mark.parametrize(("fmt", "named"), [("requests", "a requests.jsonl"), ("inferlab", "an inferlab"), ("azure", "an Azure")])
def test_a_vllm_result_read_as_another_format_says_what_it_is(tmp_path: Path, fmt: str, named: str) -> None:
    """A vLLM result (a JSON object over several lines) given --trace-format requests was
    read line by line: 'the last line is cut short', then 'no requests'. It is named."""
    path = tmp_path / "vllm_result.json"
    path.write_text(json.dumps({"request_rate": 2.0, "input_lens": [10, 10], "output_lens": [4, 4],
                                "ttfts": [0.02, 0.02], "itls": [[0.01] * 3] * 2}, indent=1))
    with pytest.raises(UsageError, match=f"a vLLM benchmark result, not {named} trace: give --trace-format vllm"):
        TraceConfig(str(path), fmt).rows()  # type: ignore[arg-type]


_VLLM = {"output_lens": [5, 5], "ttfts": [0.1, 0.2], "itls": [[0.01], [0.01]], "request_rate": 1}


@pytest.mark.parametrize(("name", "text", "needle"), [
    # numbers that overflowed the clocks or built a prompt of 1e300 words (internal errors)
    ("huge.jsonl", '{"arrival_s": 0, "input_tokens": 1e300, "output_tokens": 5}', "at most 10,000,000"),
    ("late.jsonl", '{"arrival_s": 1e300, "input_tokens": 10, "output_tokens": 5}', "at most 1e+12 s"),
    ("prefix.jsonl", '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5, "prefix_group": "a", "prefix_tokens": -3}',
     "prefix_tokens (-3) must be from 0"),
    ("long-prefix.jsonl", '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5, "prefix_group": "a", "prefix_tokens": 50}',
     "prefix_tokens (50) must be from 0"),
    # measured values compared with the prediction as if they were times (+nan %, -1497 %)
    ("nan.jsonl", '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5, "ttft_ms": NaN}', "ttft_ms nan is not a time"),
    ("neg.jsonl", '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5, "e2e_ms": -3}', "neg.jsonl:1: e2e_ms -3.0 is not a time"),
    # vLLM's result file: values of the wrong kind crashed, a negative one was averaged in
    ("bool.json", json.dumps({"input_lens": [100, True], **_VLLM}), "request 2: expected an integer, got a boolean"),
    ("str.json", json.dumps({"input_lens": [100, 200], **_VLLM, "ttfts": ["0.1", 0.2]}), "must be numbers of seconds"),
    ("itl.json", json.dumps({"input_lens": [100, 200], **_VLLM, "itls": [5, [0.01]]}), "must be numbers of seconds"),
    ("negttft.json", json.dumps({"input_lens": [100, 200], **_VLLM, "ttfts": [-0.1, 0.2]}), "ttft_ms -100.0 is not a time"),
    ("negout.json", json.dumps({"input_lens": [100, 200], **_VLLM, "output_lens": [5, -5]}), "token counts must be at least 1"),
])
def test_rows_no_replay_can_send_or_compare_are_refused_naming_the_row(tmp_path: Path, name: str, text: str, needle: str) -> None:
    """Values a trace reader let through to crash later (overflow, a prompt of 1e300
    words) or to compare as times (NaN, negative), each refused as the file is read,
    naming the row."""
    path = tmp_path / name
    path.write_text(text + "\n")
    with pytest.raises(UsageError, match=re.escape(needle)):
        read_rows(str(path), "vllm" if name.endswith(".json") else None)


def test_more_requests_than_the_trace_holds_is_refused(tmp_path: Path) -> None:
    """-n above the trace's rows replayed the rows while config.json said -n; refused now
    with the most that can be asked (warm-ups counted); -n up to it runs as asked. So are
    warm-ups that take every row."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i / 10, "input_tokens": 10, "output_tokens": 5}) + "\n" for i in range(3)))
    for args, needle in ((["-n", "10"], "more requests than the trace holds (3): give -n 3 or fewer"),
                         (["-n", "3", "--warmup", "1"], "(3, 1 of them warm-ups): give -n 2 or fewer")):
        res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), *args, "--no-history"])
        assert res.exit_code == 2 and needle in res.output, res.output
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "-n", "2", "--warmup", "1", "--json", "--no-history"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["counts"]["total"] == 2
    # without -n, as many warm-ups as rows (or more) left nothing to measure: "0 completed", exit 0
    for warmup in ("3", "10"):
        res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "--warmup", warmup, "--no-history"])
        assert res.exit_code == 2 and f"the trace holds 3 requests and {warmup} are warm-ups: nothing is left to measure; " \
            "give --warmup 2 or fewer" in res.output, res.output
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "--warmup", "2", "--json", "--no-history"])
    assert res.exit_code == 0 and json.loads(res.stdout)["counts"]["total"] == 1


def test_azures_2024_timestamps_with_a_zone_after_the_fraction_are_read(tmp_path: Path) -> None:
    """Azure's 2024 trace writes "2024-05-10 00:00:00.009930+00:00" (refused at line 2),
    some rows with no fraction; an ISO time with T and Z reads too; a header spaced after
    its commas is the same header."""
    p = tmp_path / "az24.csv"
    p.write_text("TIMESTAMP, ContextTokens, GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,2162,5\n"
                 "2024-05-10 02:00:00.017335+02:00,2399,6\n"  # (the same day at UTC+2: 0.017335 s UTC)
                 "2024-05-10 00:00:01+00:00,100,3\n"
                 "2024-05-10T00:00:01.5Z,120,4\n")
    rows = TraceConfig(str(p)).rows()
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 0.017335 - 0.00993, 1 - 0.00993, 1.5 - 0.00993], abs=1e-9)
    assert [r.input_tokens for r in rows] == [2162, 2399, 100, 120]


@pytest.mark.parametrize(("name", "text"), [
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,0\n2,10,2\n3,0,2\n4,10,2\n"),
    ("moon.jsonl", "".join(json.dumps({"timestamp": t * 1000, "input_length": i, "output_length": o, "hash_ids": []}) + "\n"
                           for t, i, o in ((0, 10, 0), (2, 10, 2), (3, 0, 2), (4, 10, 2)))),
])
def test_rows_with_no_tokens_are_skipped_and_said_and_the_window_counts_from_the_first_row(
    tmp_path: Path, name: str, text: str,
) -> None:
    """A row of 0 prompt or answer tokens stopped the whole import; it is skipped, with a
    warning that counts it, and the window still counts from the trace's first row (at
    0 s here: --trace-start 2 keeps the rows at 2 and 4 s, not those 2 s after the first
    row replayed)."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.warns(UserWarning, match="2 rows skipped: 0 prompt or answer tokens"):
        rows = TraceConfig(str(p), start_s=2).rows()
    assert [(r.arrival_s, r.input_tokens) for r in rows] == [(0.0, 10), (2.0, 10)]


def test_the_window_counts_from_a_failed_first_request_too(tmp_path: Path) -> None:
    """BurstGPT's failed request first (0 response tokens, at 0 s): --trace-start 10
    means 10 s after it, as the help says, not 10 s after the first one replayed."""
    p = tmp_path / "burst.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "0,ChatGPT,10,0,10,Conversation log\n10,ChatGPT,11,5,16,Conversation log\n"
                 "20,ChatGPT,12,5,17,Conversation log\n")
    with pytest.warns(UserWarning, match="1 row skipped"):
        rows = TraceConfig(str(p), start_s=10).rows()
    assert [(r.arrival_s, r.input_tokens) for r in rows] == [(0.0, 11), (10.0, 12)]
    # a vLLM result whose first request failed: the same
    result = {"start_times": [100.0, 101.0, 102.5], "input_lens": [10, 11, 12], "output_lens": [0, 4, 4],
              "ttfts": [0.0, 0.02, 0.02], "itls": [[], [0.01] * 3, [0.01] * 3]}
    v = tmp_path / "v.json"
    v.write_text(json.dumps(result))
    with pytest.warns(UserWarning, match="1 of 3 requests skipped"):
        assert [r.arrival_s for r in TraceConfig(str(v), start_s=1.5).rows()] == [0.0]
    with pytest.raises(UsageError, match="the trace has no requests to replay"), pytest.warns(UserWarning):
        read_rows(str(p.with_name("failed.csv").write_text(p.read_text().replace(",5,", ",0,")) and p.with_name("failed.csv")))


def test_a_vllm_result_of_a_ramp_up_replays_the_ramp(tmp_path: Path) -> None:
    """vllm bench serve --ramp-up-strategy saves request_rate inf and the ramp: the
    replay sent every request at 0 s. Each gap is drawn at the rate the ramp has reached
    at that request (constant gaps here, burstiness inf: a linear ramp from 1 to 4 req/s
    over 4 requests gives the 2nd, 3rd and 4th 1/2, 1/3 and 1/4 s after the one before)."""
    base = {"request_rate": "inf", "burstiness": "inf", "input_lens": [10] * 4, "output_lens": [4] * 4,
            "ttfts": [0.02] * 4, "itls": [[0.01] * 3] * 4, "ramp_up_start_rps": 1, "ramp_up_end_rps": 4}
    p = tmp_path / "ramp.json"
    p.write_text(json.dumps({**base, "ramp_up_strategy": "linear"}))
    assert [r.arrival_s for r in read_rows(str(p))] == pytest.approx([0, 1 / 2, 1 / 2 + 1 / 3, 1 / 2 + 1 / 3 + 1 / 4])
    p.write_text(json.dumps({**base, "ramp_up_strategy": "exponential"}))  # 1, 4^(1/3), 4^(2/3), 4 req/s
    assert [r.arrival_s for r in read_rows(str(p))] == pytest.approx(
        [0, 4 ** (-1 / 3), 4 ** (-1 / 3) + 4 ** (-2 / 3), 4 ** (-1 / 3) + 4 ** (-2 / 3) + 1 / 4])
    p.write_text(json.dumps({**base, "ramp_up_strategy": "sideways"}))
    with pytest.raises(UsageError, match=r"ramp_up_strategy 'sideways'.*'linear' or 'exponential'"):
        read_rows(str(p))


def test_a_file_of_appended_vllm_results_says_what_it_is(tmp_path: Path) -> None:
    """vllm bench serve --append-result writes one result a line: "unknown JSONL trace"
    or "not valid JSON (Extra data)" did not say so."""
    one = json.dumps({"request_rate": 2.0, "input_lens": [10], "output_lens": [4], "ttfts": [0.02], "itls": [[0.01] * 3]})
    p = tmp_path / "appended.json"
    p.write_text(one + "\n" + one + "\n")
    for fmt in (None, "vllm"):
        with pytest.raises(UsageError, match="several vLLM benchmark results, one a line"):
            read_rows(str(p), fmt)


def test_a_json_document_that_is_not_a_trace_says_so_and_broken_json_says_it_is_broken(tmp_path: Path) -> None:
    """A run's summary.json is valid JSON written over several lines: no trace, not bad JSON."""
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"schema": "inferlab.summary/1", "counts": {"completed": 3}}, indent=2))
    with pytest.raises(UsageError, match=r"summary\.json: not a trace: a JSON document over several lines") as e:
        read_rows(str(summary))
    assert "not valid JSON" not in str(e.value)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"arrival_s": 0,\n')
    with pytest.raises(UsageError, match=r"broken\.jsonl:1: not valid JSON"):
        read_rows(str(broken))


def test_a_replay_of_a_sessions_run_keeps_its_sessions_and_turns_in_its_own_records(tmp_path: Path) -> None:
    """The replay reproduced the growing contexts but recorded ``session: null``: a replay
    of the replay shared nothing. Its records now name each turn's session and turn."""
    run = [sys.executable, "-m", "inferlab", "sim", "run", "--no-history", "--json"]
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    p = subprocess.run([*run, "--sessions", "3", "--turns", "3", "--input-tokens", "200", "--output-tokens", "50",
                        "--out", str(first)], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    for source, out in ((first, second), (second, third)):
        q = subprocess.run([*run, "--trace", str(source / "requests.jsonl"), "--out", str(out)], capture_output=True,
                           text=True, timeout=120, check=False)
        assert q.returncode == 0, q.stderr

    def turns(d: Path) -> list[tuple[int, int, int]]:
        recs = [json.loads(line) for line in (d / "requests.jsonl").read_text().splitlines()]
        return sorted((r["session"], r["turn"], r["input_tokens"]) for r in recs)

    assert turns(first) == turns(second) == turns(third)
    assert len({s for s, _, _ in turns(first)}) == 3
    cached = [json.loads(subprocess.run([*run, "--trace", str(d / "requests.jsonl")], capture_output=True, text=True,
                                        timeout=120, check=True).stdout)["cached_tokens"] for d in (second, third)]
    assert cached[0] > 0 and cached[1] >= cached[0] // 2  # (the replay of the replay shares its contexts too)


async def test_trace_rows_shorter_than_the_chat_template_are_said(tmp_path: Path) -> None:
    """A row asking for fewer prompt tokens than the template adds went out longer than
    the trace's (1 token of text + the template), silently."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.01 * k, "input_tokens": n, "output_tokens": 3}) + "\n"
                             for k, n in enumerate((10, 12, 400))))
    cfg = BenchConfig(load=LoadConfig(Replay()), workload=WorkloadConfig(trace=TraceConfig(str(trace))))
    with EmbeddedServer(ServerConfig()) as sim:
        result = await bench_async(cfg, sim.url)
    template = result.summary.prompt_overhead_tokens
    assert template is not None and template > 12
    sent = sorted(r.input_tokens or 0 for r in result.records)
    assert sent[:2] == [1 + template] * 2  # (what the server counted)
    said = [w for w in result.summary.warnings if "fewer prompt tokens than the chat template" in w]
    assert said == [f"2 trace rows asked for fewer prompt tokens than the chat template (or BOS) adds ({template}): sent "
                    f"with 1 token of text, {1 + template} tokens in all each, {2 * (1 + template) - 22} more than the "
                    "trace's in all"], result.summary.warnings
