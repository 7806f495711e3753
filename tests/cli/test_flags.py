"""Flags mean what vLLM users expect, and a flag that would be accepted and ignored is
refused (exit 2, one line). Run through ``sim run`` in virtual time: fast, and the
config it writes says what actually ran."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.common import entry
from inferlab.cli.main import main


def sim_run(*args: str) -> tuple[int, str, dict[str, Any] | None]:
    """Exit code, the one-line error (or ''), and the summary JSON on success."""
    res = CliRunner().invoke(main, ["sim", "run", "--input-tokens", "32", "--output-tokens", "4", "--json", *args])
    if res.exit_code != 0:
        return res.exit_code, res.output.strip().splitlines()[-1] if res.output.strip() else "", None
    return 0, "", json.loads(res.stdout)


def schedule(*args: str) -> dict[str, Any]:
    code, err, s = sim_run(*args)
    assert code == 0 and s is not None, err
    return dict(s["config"]["load"]["schedule"])


def test_max_concurrency_alone_caps_requests_in_flight_as_in_vllm() -> None:
    assert schedule("-n", "8", "--max-concurrency", "3") == {"kind": "ClosedLoop", "concurrency": 3}
    assert schedule("-n", "8", "--rate", "5", "--max-concurrency", "3")["max_concurrency"] == 3
    code, err, _ = sim_run("-n", "8", "-c", "4", "--max-concurrency", "3")
    assert code == 2 and "--concurrency and --max-concurrency" in err


def test_burstiness_alone_selects_gamma_arrivals_as_in_vllm() -> None:
    s = schedule("-n", "8", "--rate", "5", "--burstiness", "0.5")
    assert (s["arrival"], s["burstiness"]) == ("gamma", 0.5)
    assert schedule("-n", "8", "--rate", "5")["arrival"] == "poisson"
    code, err, _ = sim_run("-n", "8", "--rate", "5", "--arrival", "poisson", "--burstiness", "0.5")
    assert code == 2 and "--burstiness shapes gamma arrivals" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--burstiness", "0.5"], "give --rate too"),  # a closed loop has no arrivals
        (["--arrival", "constant"], "give --rate too"),
        (["--system-tokens", "100"], "--system-tokens needs --sessions"),
        (["--turns", "3"], "--turns needs --sessions"),
        (["--think-time-s", "1"], "--think-time-s needs --sessions"),
        (["--speedup", "2"], "--speedup needs --trace"),
        (["--trace-start", "5"], "--trace-start needs --trace"),
        (["--trace-in-order"], "--trace-in-order needs --trace"),
        (["--sample", "with-replacement"], "--sample needs --dataset"),
        (["--max-input-tokens", "100"], "--max-input-tokens needs --dataset"),
        (["--prefix-groups", "4"], "--prefix-groups needs --prefix-tokens"),
        (["--prefix-popularity", "zipf"], "--prefix-popularity needs --prefix-tokens"),
        (["--no-token-ids"], "--no-token-ids needs --tokenizer"),
        (["--token-ids"], "--token-ids needs --tokenizer"),
        (["--overwrite"], "--overwrite needs --out"),
        (["--prompt", "  "], "--prompt is empty"),
    ],
)
def test_a_flag_without_what_it_acts_on_is_refused(args: list[str], needle: str) -> None:
    code, err, _ = sim_run("-n", "4", *args)
    assert code == 2 and needle in err, err


def test_a_closed_loop_of_more_users_than_requests_is_refused_or_runs_the_users_it_has() -> None:
    """-c 32 -n 16 would run 16 users labelled 32: refused; the default 32 users with
    -n 4 run 4 users, and config.json says 4."""
    code, err, _ = sim_run("-c", "32", "-n", "16")
    assert code == 2 and "-n 16 sends fewer requests than the closed loop's 32 users" in err, err
    assert sim_run("-c", "32", "-n", "16", "--warmup", "16")[0] == 0  # (32 sent: every user runs)
    assert schedule("-n", "4") == {"kind": "ClosedLoop", "concurrency": 4}
    code, _, s = sim_run("-c", "64")  # (no -n: a request per user at least)
    assert code == 0 and s is not None and s["counts"]["completed"] == 64


@pytest.mark.parametrize("flag", ["--token-ids", "--no-token-ids"])
def test_token_ids_on_the_chat_api_is_refused(tmp_path: Path, flag: str) -> None:
    """The chat API's messages are text: the flag would be accepted and ignored."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["a small corpus for a small tokenizer"] * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    code, err, _ = sim_run("-n", "2", "--tokenizer", str(tmp_path / "tokenizer.json"), "--api", "chat", flag)
    assert code == 2 and f"{flag} chooses the prompt form of --api completions" in err, err
    assert sim_run("-n", "2", "--tokenizer", str(tmp_path / "tokenizer.json"), "--api", "completions", flag)[0] == 0


@pytest.mark.parametrize("flag", ["--trace-start", "--trace-end"])
def test_a_negative_trace_window_is_refused(tmp_path: Path, flag: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2}\n')
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), flag, "-5"])
    assert res.exit_code == 2 and "0 or more" in res.output


def test_out_onto_an_existing_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    assert sim_run("-n", "2", "--out", out)[0] == 0
    code, err, _ = sim_run("-n", "2", "--out", out)
    assert code == 2 and "already holds a run" in err and "--overwrite" in err
    assert sim_run("-n", "3", "--out", out, "--overwrite")[0] == 0
    assert len((tmp_path / "run" / "requests.jsonl").read_text().splitlines()) == 3


def test_rate_inf_writes_json_that_any_parser_reads(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, err, s = sim_run("-n", "4", "--rate", "inf", "--out", str(out))
    assert code == 0 and s is not None, err
    def strict(constant: str) -> None:  # what JSON.parse and jq do with NaN/Infinity
        raise ValueError(f"not JSON: {constant}")

    for name in ("config.json", "summary.json"):
        text = (out / name).read_text()
        assert "Infinity" not in text and "NaN" not in text
        json.loads(text, parse_constant=strict)
    assert json.loads((out / "config.json").read_text())["load"]["schedule"]["rate_rps"] == "inf"
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in s.values())


def test_dataset_length_limits_count_tokens_never_words(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    # "tokenization" is no built-in word: 12 bytes, so 12 tokens for the simulator
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["short one", "tokenization tokenization"]))
    res = CliRunner().invoke(main, ["sim", "run", "-n", "2", "--sample", "with-replacement", "--dataset", str(data),
                                    "--max-input-tokens", "10", "--output-tokens", "2", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["counts"]["completed"] == 2 and s["input_tokens"] == 2 * 2  # only "short one" is kept: 2 tokens
    res = CliRunner().invoke(main, ["bench", "-n", "2", "--dataset", str(data), "--max-input-tokens", "10"])
    assert res.exit_code == 2 and "count tokens: give --tokenizer" in res.output


def test_an_unexpected_exception_is_an_internal_error_not_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (a ValueError from a bug, such as report's "slice step cannot be zero", once exited 2)
    def bug(kw: dict[str, Any]) -> int:
        raise ValueError("slice step cannot be zero\nsecond line")

    monkeypatch.setattr("inferlab.cli.report._report", bug)
    monkeypatch.setattr(sys, "argv", ["inferlab", "report", str(tmp_path)])
    monkeypatch.delenv("INFERLAB_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        entry(main)
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("inferlab: error: internal error, a bug in inferlab (ValueError: slice step")
    assert "INFERLAB_DEBUG=1" in err
    monkeypatch.setenv("INFERLAB_DEBUG", "1")
    with pytest.raises(ValueError, match="slice step"):
        entry(main)


def test_engine_settings_vllm_refuses_stay_usage_errors() -> None:
    code, out, _ = sim_run("--max-num-batched-tokens", "512")
    assert code == 2 and "max_num_batched_tokens (512) must be greater than or equal to max_num_seqs" in out
    code, out, _ = sim_run("--tensor-parallel-size", "3")
    assert code == 2 and "must be divisible by tensor parallel size (3)" in out


@pytest.mark.parametrize("slo", [["--slo-ttft-ms", "100"], ["--goodput", "tpot:50"]])
def test_a_ttft_or_tpot_slo_without_streaming_is_refused(slo: list[str]) -> None:
    # --no-stream measures no TTFT or TPOT: goodput was 0 whatever the server did
    args = ["bench", "--url", "http://127.0.0.1:9", "-n", "2", "--no-stream", "--no-history"]
    res = CliRunner().invoke(main, [*args, *slo])
    assert res.exit_code == 2 and "needs streaming" in res.output.strip().splitlines()[-1]
    # an E2E SLO is measured without streaming: accepted (the closed port fails the run)
    res = CliRunner().invoke(main, [*args, "--slo-e2e-ms", "100"])
    assert res.exit_code == 1 and "needs streaming" not in res.output


@pytest.mark.parametrize("value", ["0", "-1"])
def test_sim_serve_refuses_a_waiting_queue_that_refuses_every_request(value: str) -> None:
    # (with 0 or less every request got HTTP 429: none is ever waiting fewer than 0)
    import subprocess

    p = subprocess.run([sys.executable, "-m", "inferlab", "sim", "serve", "--port", "0", "--max-waiting-requests", value],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2 and "--max-waiting-requests" in p.stderr, p.stderr


def test_headers_from_the_environment_are_one_per_line_and_keep_their_spaces() -> None:
    """INFERLAB_BENCH_HEADER (as -H): one header per line; click splits other lists at
    every space, which cut 'X-Team: search infra' into three bad headers."""
    import http.server
    import threading

    seen: list[tuple[str | None, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append((self.headers.get("X-Team"), self.headers.get("X-Other")))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = CliRunner().invoke(
            main, ["bench", "--url", f"http://127.0.0.1:{server.server_port}", "--model", "m", "-n", "1", "-c", "1",
                   "--no-preflight"],
            env={"INFERLAB_BENCH_HEADER": "X-Team: search infra\nX-Other: a b c\n"},
        )
    finally:
        server.shutdown()
    assert res.exit_code == 1 and "HTTP 500" in res.output  # (the request went, with its headers)
    assert seen == [("search infra", "a b c")]


def test_api_latency_states_the_hosts_front_end_latency() -> None:
    """``--api-latency-ms`` replaces the family's fixed latency (in ms, kept in seconds):
    at a low rate every TTFT moves by the difference; config.json says what ran; an
    offline run (no API server) and a negative latency are refused."""
    code, err, low = sim_run("-n", "20", "--rate", "1", "--api-latency-ms", "3")
    assert code == 0 and low is not None, err
    code, err, stock = sim_run("-n", "20", "--rate", "1")
    assert code == 0 and stock is not None, err
    stock_s = stock["config"]["engine"]["api_overhead_s"]
    assert low["config"]["engine"]["api_overhead_s"] == pytest.approx(0.003) and stock_s > 0.003
    assert stock["ttft_ms"]["p50"] - low["ttft_ms"]["p50"] == pytest.approx(stock_s * 1e3 - 3, abs=0.5)
    code, err, _ = sim_run("-n", "2", "--rate", "inf", "--api-latency-ms", "3")
    assert code == 2 and "offline run has none" in err
    for bad in ("-1", "inf", "nan"):
        code, _, _ = sim_run("-n", "2", "--rate", "1", "--api-latency-ms", bad)
        assert code == 2, bad


def test_a_replay_served_where_the_run_was_offline_takes_no_recorded_front_end(tmp_path: Path) -> None:
    """An offline run records latency 0 (it had no API server): replayed ``--served`` it
    gets the family's front end, and a served run replayed ``--offline`` is not refused
    for the latency it recorded."""
    runs = {}
    for name, load in (("offline", ["--rate", "inf"]), ("served", ["--rate", "4"])):
        res = CliRunner().invoke(main, ["sim", "run", "-n", "6", "--input-tokens", "32", "--output-tokens", "4",
                                        *load, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        runs[name] = json.loads((tmp_path / name / "config.json").read_text())["engine"]
    assert runs["offline"]["api_overhead_s"] == 0.0 and runs["served"]["api_overhead_s"] > 0
    for name, flag in (("offline", "--served"), ("served", "--offline")):
        res = CliRunner().invoke(main, ["sim", "run", "--trace", str(tmp_path / name / "requests.jsonl"), flag, "--json"])
        assert res.exit_code == 0, res.output
        ran = json.loads(res.stdout)["config"]["engine"]["api_overhead_s"]
        assert (ran > 0) == (flag == "--served"), (name, ran)


def test_mixed_batches_put_decodes_beside_prefill_chunks_sglangs_enable_mixed_chunk_too() -> None:
    """SGLang runs prefill steps and decode steps apart unless --enable-mixed-chunk: with
    it, running requests decode in the steps that prefill long prompts, so they wait less
    between tokens; ``--mixed-batches`` is the same flag, and config.json says what ran."""
    load = ("--engine-family", "sglang", "-n", "40", "--rate", "20", "--input-tokens", "2000", "--output-tokens", "100")
    def run(*args: str) -> dict[str, Any]:
        code, err, s = sim_run(*args)
        assert code == 0 and s is not None, err
        return s

    apart, mixed, alias = (run(*load, *flag) for flag in ((), ("--enable-mixed-chunk",), ("--mixed-batches",)))
    assert (apart["config"]["engine"]["mixed_batches"], mixed["config"]["engine"]["mixed_batches"]) == (False, True)
    assert mixed["tpot_ms"]["p50"] < apart["tpot_ms"]["p50"]
    assert alias["tpot_ms"] == mixed["tpot_ms"]
    # and vLLM V1, which always mixes, apart when told
    v1, v1_apart = run(*load[2:]), run(*load[2:], "--no-mixed-batches")
    assert v1_apart["tpot_ms"]["p50"] > v1["tpot_ms"]["p50"]


@pytest.mark.parametrize(("family", "flag"), [("trtllm", "--kv-cache-free-gpu-mem-fraction"), ("lmdeploy", "--cache-max-entry-count")])
def test_the_kv_share_of_trtllm_and_lmdeploy_is_their_own_flag(family: str, flag: str) -> None:
    """TensorRT-LLM and LMDeploy size the KV cache from the memory weights leave: their
    share is taken (a larger one holds more), and --gpu-memory-utilization, which would
    change nothing there, is refused; vLLM refuses their share the same way."""
    tokens = []
    for share in ("0.4", "0.8"):
        code, err, s = sim_run("-n", "2", "--engine-family", family, flag, share)
        assert code == 0 and s is not None, err
        assert s["config"]["engine"]["kv_cache_free_fraction"] == float(share)
        tokens.append(s["config"]["engine"]["kv_cache_tokens"])
    assert tokens[1] > 1.9 * tokens[0]  # (twice the share, twice the blocks, to a block)
    for share in ("0.5", "0.9"):  # (the default's value too: it would size nothing)
        code, err, _ = sim_run("-n", "2", "--engine-family", family, "--gpu-memory-utilization", share)
        assert code == 2 and "give --kv-cache-free-gpu-mem-fraction" in err
    code, err, _ = sim_run("-n", "2", flag, "0.5")
    assert code == 2 and "sizes its KV cache with --gpu-memory-utilization" in err


@pytest.mark.parametrize(("flags", "noted"), [((), True), (("--offline",), False), (("--served",), False),
                                               (("--max-concurrency", "2"), False)])
def test_rate_inf_says_it_runs_offline_where_it_was_not_told(flags: tuple[str, ...], noted: bool) -> None:
    """vllm bench serve's --request-rate inf goes through the API server; sim run's runs the
    offline class unless told, and says so where nothing said which."""
    res = CliRunner().invoke(main, ["sim", "run", "-n", "4", "--input-tokens", "32", "--output-tokens", "4",
                                    "--request-rate", "inf", *flags])
    assert res.exit_code == 0, res.output
    assert ("runs the engine offline (no API server" in res.stderr) == noted


def test_a_replay_on_another_family_does_not_take_the_runs_memory_share(tmp_path: Path) -> None:
    """A vLLM run's --gpu-memory-utilization is no TensorRT-LLM setting, nor the reverse:
    a replay on the other family takes neither (it ran, where it was refused before)."""
    for family, flags, other in (("vllm", ["--gpu-memory-utilization", "0.8"], "trtllm"),
                                 ("trtllm", ["--kv-cache-free-gpu-mem-fraction", "0.5"], "vllm")):
        out = tmp_path / family
        res = CliRunner().invoke(main, ["sim", "run", "-n", "2", "--engine-family", family, *flags, "-o", str(out)])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(main, ["sim", "run", "--trace", str(out / "requests.jsonl"), "--engine-family", other, "--json"])
        assert res.exit_code == 0, res.output
        engine = json.loads(res.stdout)["config"]["engine"]
        assert (engine["gpu_memory_utilization"], engine["kv_cache_free_fraction"]) == (0.9, None)


def test_an_offline_tensorrt_llm_run_is_sized_as_trtllm_bench_sizes_it_unless_told() -> None:
    """As TensorRT-LLM's offline rows ran in validation: the batch the KV cache holds at
    the workload's lengths (far below trtllm-serve's 2,048 for 4,000-token requests on
    one GPU), said; not where a flag gives a size, nor served."""
    def run(*flags: str) -> tuple[dict[str, Any], str]:
        res = CliRunner().invoke(main, ["sim", "run", "--engine-family", "trtllm", "--model", "Llama-3.1-8B", "-n", "8",
                                        "--input-tokens", "3500", "--output-tokens", "500", "--json", *flags])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["config"]["engine"], res.stderr

    engine, err = run("--rate", "inf")
    assert "sized as trtllm-bench sizes it" in err and 64 <= engine["max_num_seqs"] < 2048
    engine, err = run("--rate", "inf", "--max-num-seqs", "48")
    assert "trtllm-bench" not in err and engine["max_num_seqs"] == 48
    engine, err = run("--rate", "inf", "--served")
    assert "trtllm-bench" not in err and engine["max_num_seqs"] == 2048
    # prompts longer than --input-tokens (sessions resend their history after a system
    # prompt): not sized for 3,500 tokens
    engine, err = run("--rate", "inf", "--sessions", "2", "--turns", "4", "--system-tokens", "3000")
    assert "trtllm-bench" not in err and engine["max_num_seqs"] == 2048


def test_a_sweeps_offline_tensorrt_llm_point_runs_as_sim_run_sizes_it(tmp_path: Path) -> None:
    """The same workload at --rate inf: a sweep's point ran trtllm-serve's defaults (2,048
    sequences) where sim run sized it as trtllm-bench; now both run one engine, and the
    sweep says so. Its served point keeps the defaults."""
    common = ["--engine-family", "trtllm", "--model", "Llama-3.1-8B", "-n", "8", "--input-tokens", "3500",
              "--output-tokens", "500"]
    res = CliRunner().invoke(main, ["sim", "run", *common, "--rate", "inf", "--json"])
    assert res.exit_code == 0, res.output
    alone = json.loads(res.stdout)["config"]["engine"]
    res = CliRunner().invoke(main, ["sweep", *common, "--rate", "2,inf", "--no-saturation-stop", "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "sized as trtllm-bench sizes them" in res.stderr
    engines = {}
    for point in json.loads((tmp_path / "s" / "sweep.json").read_text())["points"]:
        engines[point["params"]["rate"]] = json.loads((tmp_path / "s" / point["dir"] / "config.json").read_text())["engine"]
    inf = next(e for r, e in engines.items() if str(r) == "inf")
    served = next(e for r, e in engines.items() if str(r) != "inf")
    assert (inf["max_num_seqs"], inf["max_num_batched_tokens"]) == (alone["max_num_seqs"], alone["max_num_batched_tokens"])
    assert alone["max_num_seqs"] < 2048 and served["max_num_seqs"] == 2048


@pytest.mark.parametrize(("family", "policy", "preempts"), [
    ("vllm", None, True), ("vllm", "guaranteed_no_evict", False),
    ("trtllm", None, False), ("trtllm", "MAX_UTILIZATION", True),
])
def test_the_capacity_scheduler_policy_decides_whether_a_full_cache_preempts(family: str, policy: str | None,
                                                                              preempts: bool) -> None:
    """16 users of 200/400 tokens in 200 KV blocks: TensorRT-LLM's GUARANTEED_NO_EVICT (the
    trtllm family's default) admits only what can finish, MAX_UTILIZATION (vLLM's way)
    preempts when the cache fills; either is taken by any family, and the run records it."""
    flags = ["--engine-family", family, "--num-gpu-blocks-override", "200", "-c", "16", "-n", "48", "--input-tokens", "200",
             "--output-tokens", "400", "--json"]
    res = CliRunner().invoke(main, ["sim", "run", *flags, *(["--capacity-scheduler-policy", policy] if policy else [])])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["prediction"]["preemptions"] > 0) is preempts
    assert out["config"]["engine"]["capacity_scheduler_policy"] == ("MAX_UTILIZATION" if preempts else "GUARANTEED_NO_EVICT")
    # no validated row ran a family with the other policy: the bands say so
    said = " ".join(out["prediction"].get("beyond_validated", []))
    assert ("capacity policy" in said) is (policy is not None), said


def test_a_static_batch_policy_is_refused_with_how_to_run_one() -> None:
    res = CliRunner().invoke(main, ["sim", "run", "--engine-family", "trtllm", "--capacity-scheduler-policy", "STATIC_BATCH"])
    assert res.exit_code == 2 and "--rate inf -n B --max-num-seqs B" in res.output


def test_a_dataset_named_as_vllm_names_it_is_told_what_reads_that() -> None:
    """vllm bench serve's --dataset-name sharegpt, given as --dataset: no such file, and
    how to run ShareGPT's lengths without it."""
    res = CliRunner().invoke(main, ["sim", "run", "--dataset", "sharegpt", "-n", "3"])
    assert res.exit_code == 2 and "--input-tokens empirical:sharegpt" in res.output


# Each engine's own names for the knobs the simulator has (SGLang's launch_server,
# trtllm-serve and trtllm-bench, LMDeploy's api_server), beside the vLLM names they mean.
_NATIVE_NAMES = {
    "sglang": (
        ("--tp-size", "2"), ("--mem-fraction-static", "0.8"), ("--chunked-prefill-size", "1024"),
        ("--max-running-requests", "12"), ("--context-length", "6144"), ("--page-size", "32"),
        ("--disable-radix-cache",), ("--disable-cuda-graph",), ("--disable-overlap-schedule",),
    ),
    "trtllm": (
        ("--tp_size", "2"), ("--max_batch_size", "12"), ("--max_num_tokens", "1024"), ("--max_seq_len", "6144"),
        ("--kv_cache_free_gpu_memory_fraction", "0.5"),
    ),
    "trtllm-bench": (("--kv_cache_free_gpu_mem_fraction", "0.5"), ("--tp_size", "2"), ("--max_batch_size", "12"),
                     ("--max_seq_len", "6144")),
    "lmdeploy": (
        ("--tp", "2"), ("--max-batch-size", "12"), ("--session-len", "6144"), ("--cache-block-seq-len", "32"),
        ("--cache-max-entry-count", "0.5"),
    ),
}
_VLLM_NAMES = {
    "--tp-size": "-tp", "--tp_size": "-tp", "--tp": "-tp", "--mem-fraction-static": "--gpu-memory-utilization",
    "--chunked-prefill-size": "--max-num-batched-tokens", "--max_num_tokens": "--max-num-batched-tokens",
    "--max-running-requests": "--max-num-seqs", "--max_batch_size": "--max-num-seqs", "--max-batch-size": "--max-num-seqs",
    "--context-length": "--max-model-len", "--max_seq_len": "--max-model-len", "--session-len": "--max-model-len",
    "--page-size": "--block-size", "--cache-block-seq-len": "--block-size",
    "--disable-radix-cache": "--no-enable-prefix-caching", "--disable-cuda-graph": "--enforce-eager",
    "--disable-overlap-schedule": "--no-overlap-schedule",
    "--kv_cache_free_gpu_memory_fraction": "--kv-cache-free-gpu-mem-fraction",
    "--kv_cache_free_gpu_mem_fraction": "--kv-cache-free-gpu-mem-fraction",
    "--cache-max-entry-count": "--kv-cache-free-gpu-mem-fraction",
}


@pytest.mark.parametrize("names", sorted(_NATIVE_NAMES))
def test_each_engines_own_flag_names_run_the_engine_its_vllm_names_run(names: str) -> None:
    """A row stated as its engine's users state it (SGLang's --chunked-prefill-size,
    TensorRT-LLM's --max_batch_size, ...) runs the engine the vLLM names describe, every
    setting of it changed from the family's default, and the same prediction."""
    family = names.split("-")[0]
    load = ("--model", "Llama-3.1-8B", "--engine-family", family, "-n", "24", "--rate", "40",
            "--input-tokens", "1500", "--output-tokens", "16")
    native = [word for flag in _NATIVE_NAMES[names] for word in flag]
    vllm = [word for flag in _NATIVE_NAMES[names] for word in (_VLLM_NAMES[flag[0]], *flag[1:])]
    runs = []
    for flags in (native, vllm, []):
        code, err, s = sim_run(*load, *flags)
        assert code == 0 and s is not None, (flags, err)
        runs.append(s)
    (ours, theirs, default) = (r["config"]["engine"] for r in runs)
    assert ours == theirs
    assert runs[0]["ttft_ms"] == runs[1]["ttft_ms"] and runs[0]["tpot_ms"] == runs[1]["tpot_ms"]
    changed = {k for k in ours if ours[k] != default[k]}
    named = {"tensor_parallel_size", "max_num_seqs", "max_model_len"}  # (named in every family's list)
    assert named <= changed, changed
    assert runs[0]["ttft_ms"] != runs[2]["ttft_ms"]


def test_sglangs_no_chunking_budget_is_refused_with_the_flag_that_says_it() -> None:
    """SGLang's --chunked-prefill-size -1 turns chunking off; here it would be a budget of
    -1 tokens: refused (exit 2) with the flag that turns chunking off."""
    code, err, _ = sim_run("-n", "2", "--engine-family", "sglang", "--chunked-prefill-size", "-1")
    assert code == 2 and "--no-enable-chunked-prefill" in err, err
    code, err, _ = sim_run("-n", "2", "--max-num-batched-tokens", "0")
    assert code == 2 and "at least 1" in err, err


@pytest.mark.parametrize(("args", "needle"), [
    (["sim", "run", "-n", "4", "--slo-ttft-ms", "nan"], "'nan' is not a finite number"),
    (["sim", "run", "-n", "4", "--slo-e2e-ms", "inf"], "'inf' is not a finite number"),
    (["sim", "run", "-n", "4", "--mem-fraction-static", "nan"], "'nan' is not a number"),
    (["sim", "run", "-n", "4", "--rate", "5", "--burstiness", "nan"], "'nan' is not a number"),
    (["sweep", "-c", "1,2", "-n", "4", "--saturation-gain", "nan"], "'nan' is not a number"),
    (["sweep", "-c", "2", "-n", "4", "--gpu-memory-utilization", "0.5,nan"], "'nan' is not a number"),
    # and sizes no engine takes, in a sweep's list too (each was a failed point after the others ran)
    (["sweep", "-c", "2", "-n", "4", "--page-size", "16,3"], "3: a KV block holds 1, 8, 16, 32, 64, 128 tokens"),
    (["sweep", "-c", "2", "-n", "4", "--engine-family", "sglang", "--max-running-requests", "0,8"], "0 is not in the range x>=1"),
    (["sim", "run", "-n", "4", "--tp", "0"], "0 is not in the range x>=1"),
])
def test_nan_and_an_infinite_slo_are_refused_not_run(args: list[str], needle: str, tmp_path: Path) -> None:
    """click's float ranges let NaN through (it fails no comparison): an SLO of NaN ms
    ran with goodput 0 and no SLO recorded, a sweep's NaN threshold crashed after its
    points ran. Each is a usage error (exit 2, one line) before anything runs."""
    res = CliRunner().invoke(main, [*args, "--no-history", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (("--num-gpu-blocks-override", "100000"), "more than the 65.5 GiB H100-SXM-80GB has beside"),
    (("--no-enable-prefix-caching", "--evict-unhashed-first"), "this engine caches no prefixes (--no-enable-prefix-caching)"),
    (("--engine-family", "lmdeploy", "--evict-unhashed-first"), "this engine caches no prefixes (lmdeploy default)"),
    (("--engine-family", "trtllm", "--kv_cache_free_gpu_memory_fraction", "0.5", "--num-gpu-blocks-override", "1000"),
     "would size nothing"),
])
def test_engine_flags_that_cannot_take_effect_are_refused(args: tuple[str, ...], needle: str) -> None:
    """A KV cache of more blocks than the card holds beside the weights (vLLM would fail
    to allocate it; here it ran out of host memory), a free-queue order for a cache that
    keeps no prefixes, and a KV share beside a fixed block count: each was accepted and
    changed nothing (or crashed); now refused. The same flags alone still run."""
    code, err, _ = sim_run("-n", "2", *args)
    assert code == 2 and needle in err, err
    code, err, s = sim_run("-n", "2", "--num-gpu-blocks-override", "50000")
    assert code == 0 and s is not None and s["config"]["engine"]["kv_cache_blocks"] == 49999, err  # (one null block)


@pytest.mark.parametrize("args", [
    ["sim", "run", "-n", "4", "--max-num-seqs", "8", "--max-running-requests", "16"],
    ["sim", "run", "-n", "4", "--enable-prefix-caching", "--disable-radix-cache"],
    ["sweep", "-c", "4", "-n", "4", "--max-running-requests", "16,32", "--max-num-seqs", "8"],
    ["sim", "run", "--request-rate", "5", "--rate=8", "-n", "4"],
    ["sim", "run", "-n4", "--num-prompts", "6"],  # (a short option's value attached)
])
def test_two_names_of_one_setting_are_refused(args: list[str], tmp_path: Path) -> None:
    """Two names of one setting (a pasted SGLang command beside a vLLM flag) took the
    last silently, and in a sweep dropped the whole axis; refused now, naming both. One
    name given twice stays click's way (the last wins)."""
    res = CliRunner().invoke(main, [*args, "--no-history", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "name one setting: give one of them" in res.output, res.output
    code, err, s = sim_run("-n", "2", "--max-num-seqs", "8", "--max-num-seqs", "16")
    assert code == 0 and s is not None and s["config"]["engine"]["max_num_seqs"] == 16, err
    # an option's value that looks like a flag is a value, not a name given
    res = CliRunner().invoke(main, ["sim", "run", "-n", "2", "--prompt", "--rate", "--request-rate", "5", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["config"]["load"]["schedule"]["rate_rps"] == 5


def test_more_requests_than_the_sessions_send_is_refused() -> None:
    """Sessions send sessions x turns requests and stop: -n 100 over 8 sessions of 4 turns
    ran 32 while config.json said 100. Refused now with the most that can be asked;
    that many or fewer runs as asked."""
    code, err, _ = sim_run("--sessions", "8", "--turns", "4", "-n", "100")
    assert code == 2 and "send (32): give -n 32 or fewer" in err, err
    code, err, _ = sim_run("--sessions", "8", "--turns", "4", "-n", "30", "--warmup", "4")
    assert code == 2 and "give -n 28 or fewer" in err, err
    for n in ("32", "20"):
        code, err, s = sim_run("--sessions", "8", "--turns", "4", "-n", n)
        assert code == 0 and s is not None, err
        assert s["counts"]["total"] == s["config"]["load"]["num_requests"] == int(n)
    # without -n, every turn but the warm-up ones is measured; a warm-up of every turn is refused
    code, err, s = sim_run("--sessions", "2", "--turns", "2", "--warmup", "1")
    assert code == 0 and s is not None, err
    assert s["counts"]["total"] == s["config"]["load"]["num_requests"] == 3 and s["counts"]["warmup"] == 1
    code, err, _ = sim_run("--sessions", "2", "--turns", "2", "--warmup", "4")
    assert code == 2 and "--warmup 4 leaves nothing to measure of the 4 requests" in err, err


@pytest.mark.parametrize("command", ["tune", "sweep"])
def test_a_sweep_commands_output_flags_say_what_it_writes(command: str) -> None:
    # (their help was bench's: -o writes summary.json, requests.jsonl and config.json,
    # --overwrite "with --result-filename: that file" (refused by both), --json "the summary")
    out = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    assert "sweep.json indexing them" in out and "replace the sweep already there" in out
    assert "summary.json, requests.jsonl and config.json" not in out and "Print the summary" not in out
    assert "that file" not in out
