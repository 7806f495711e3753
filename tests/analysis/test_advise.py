"""``inferlab advise``: the rules fire on the evidence that should trigger them, not on
the evidence that should not, and a predicted gain agrees with the gain measured by
actually making the change."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from inferlab._errors import UsageError
from inferlab.analysis.advise import advise
from inferlab.load.run import HttpTarget, RunConfig, RunResult, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig, Replay
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.launch import ChildServer
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.traces import TraceConfig

LIMIT_S = 120.0
SHORT_MAX = 512  # tokens: the short chats' prompts are far below, the long ones far above


def mixed_trace(path: Path, n: int = 40, rate: float = 6.0) -> None:
    """Every fourth request an 8,000-token prompt, the rest short chats, Poisson arrivals."""
    rng = random.Random(1)
    t = 0.0
    with path.open("w") as f:
        for i in range(n):
            t += rng.expovariate(rate)
            long = i % 4 == 1
            f.write(json.dumps({"arrival_s": round(t, 4), "input_tokens": 8000 if long else 100, "output_tokens": 16 if long else 32}) + "\n")


def bench(url: str, trace: Path, out: Path | None) -> RunResult:
    cfg = RunConfig(LoadConfig(Replay()), WorkloadConfig(trace=TraceConfig(str(trace))), out_dir=None if out is None else str(out))

    async def go() -> RunResult:
        async with asyncio.timeout(LIMIT_S):
            return await run(cfg, HttpTarget(url))

    return asyncio.run(go())


def through_gateway(config: Any, trace: Path) -> RunResult:
    """The trace replayed through the real gateway with ``config`` (a ``GatewayConfig``)
    on a free port, stopped again after (which closes its access log, if it has one)."""
    from inferlab.gateway.app import Gateway, start

    async def go() -> RunResult:
        runner, port = await start(Gateway(config), "127.0.0.1", 0)
        try:
            cfg = RunConfig(LoadConfig(Replay()), WorkloadConfig(trace=TraceConfig(str(trace))))
            async with asyncio.timeout(LIMIT_S):
                return await run(cfg, HttpTarget(f"http://127.0.0.1:{port}"))
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def p99(values: list[float]) -> float:
    values = sorted(values)
    k = (len(values) - 1) * 0.99
    lo = int(k)
    return values[lo] + (values[min(lo + 1, len(values) - 1)] - values[lo]) * (k - lo)


def short_itl_p99(records: list[RequestRecord]) -> float:
    return p99([g for r in records if r.ok and not r.warmup and (r.input_tokens or 0) <= SHORT_MAX for g in request_metrics(r).itl_ms])


def test_head_of_line_blocking_is_flagged_and_its_predicted_gain_matches_the_change_made(tmp_path: Path) -> None:
    trace = tmp_path / "mixed.jsonl"
    mixed_trace(trace)
    serve = ["--max-model-len", "16384", "--enforce-eager", "--max-num-batched-tokens", "8192"]
    with ChildServer(serve) as server:
        observed = bench(server.url, trace, tmp_path / "observed")
    a = advise(tmp_path / "observed", "latency")
    hol = next((r for r in a.recommendations if r.rule == "head_of_line"), None)
    assert hol is not None, [r.rule for r in a.recommendations]
    assert a.recommendations[0].rule == "head_of_line"  # first for latency
    budget = int(hol.change.split("--max-num-batched-tokens ")[1].split()[0])
    assert budget < 8192
    gain = hol.gains[0]
    assert gain.metric.startswith("short requests' p99 inter-token gap") and "prediction" in gain.kind
    # the change, made: the same workload against a server with that budget
    with ChildServer([*serve[:-1], str(budget)]) as server:
        changed = bench(server.url, trace, None)
    measured = short_itl_p99(changed.records) - short_itl_p99(observed.records)
    predicted = gain.delta
    assert measured < 0 and predicted < 0  # the same sign: stalls shrink
    assert predicted == pytest.approx(measured, rel=0.30)


def sim_run(out: Path, engine: EngineConfig) -> None:
    cfg = RunConfig(
        LoadConfig(ClosedLoop(4), num_requests=40),
        WorkloadConfig(prefix_groups=2, prefix_tokens=2000, suffix_tokens=100, output_tokens=32), out_dir=str(out),
    )
    asyncio.run(run(cfg, SimTarget(engine)))


def test_shared_prefixes_with_caching_off_get_it_turned_on_with_a_predicted_ttft_gain(tmp_path: Path) -> None:
    sim_run(tmp_path / "off", EngineConfig(enable_prefix_caching=False))
    a = advise(tmp_path / "off", "latency")
    rec = next((r for r in a.recommendations if r.rule == "prefix_caching"), None)
    assert rec is not None and "--enable-prefix-caching" in rec.change
    assert rec.gains and all("prediction" in g.kind for g in rec.gains)
    assert rec.gains[0].after < 0.8 * rec.gains[0].before  # a 2,000-token prefix of 2,100 tokens


def test_each_predicted_gain_names_the_validation_error_of_its_metric(tmp_path: Path) -> None:
    """A what-if reruns the run's closed loop of 4 users on vLLM V1: its TTFT gain shows
    the TTFT band validation holds for vLLM V1 closed loops, in the JSON and on the console;
    a gain that is no prediction has none."""
    from click.testing import CliRunner

    from inferlab.cli.main import main
    from inferlab.sim.engine.bands import error_band

    sim_run(tmp_path / "off", EngineConfig(enable_prefix_caching=False))
    d = json.loads(CliRunner().invoke(main, ["advise", str(tmp_path / "off"), "--json"]).output)
    gains = [g for r in d["recommendations"] for g in r["gains"]]
    cache = next(r for r in d["recommendations"] if r["rule"] == "prefix_caching")
    band = error_band("vllm", "closed loop", "TTFT")
    assert band is not None
    for g in cache["gains"]:
        assert g["metric_class"] == "TTFT" and g["error_band"] == band.to_json()
    for g in gains:
        assert (g["error_band"] is not None) == g["kind"].startswith("prediction"), g
    console = " ".join(CliRunner().invoke(main, ["advise", str(tmp_path / "off")]).output.split())
    assert f"(prediction; simulated TTFT values {band.describe()})" in console


def test_shared_prefixes_served_from_cache_get_no_such_advice(tmp_path: Path) -> None:
    sim_run(tmp_path / "on", EngineConfig(enable_prefix_caching=True))
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["cached_tokens"] / summary["input_tokens"] > 0.8  # (the premise: a high hit rate)
    for goal in ("latency", "throughput", "consistency"):
        assert all(r.rule != "prefix_caching" for r in advise(tmp_path / "on", goal).recommendations)


def test_goals_reorder_the_same_recommendations(tmp_path: Path) -> None:
    sim_run(tmp_path / "off", EngineConfig(enable_prefix_caching=False, num_gpu_blocks_override=400))
    orders = {g: [r.rule for r in advise(tmp_path / "off", g).recommendations] for g in ("latency", "throughput")}
    assert "kv_pressure" in orders["throughput"] and "prefix_caching" in orders["throughput"]
    assert orders["throughput"][0] == "kv_pressure"
    assert orders["latency"].index("prefix_caching") < orders["latency"].index("kv_pressure")


def test_something_that_is_not_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a run directory"):
        advise(tmp_path)
    with pytest.raises(UsageError, match="no such file"):
        advise(tmp_path / "missing")


def flood_trace(path: Path, clients: int = 12, each: int = 4, shorts: int = 16) -> None:
    """8,000-token prompts from ``clients`` closed-loop users, ``each`` one after another,
    and short chats arriving among them, 0.1 s apart from 1 s on (a requests.jsonl)."""
    lines = []
    for c in range(clients):
        for i in range(each):
            lines.append(RequestRecord(len(lines), intended_send_ns=i, send_ns=i, end_ns=i + 1, content_ns=[i + 1],
                                       input_tokens=8000, output_tokens=16, user=c))
    for k in range(shorts):
        t = int((1.0 + 0.1 * k) * 1e9)
        lines.append(RequestRecord(len(lines), intended_send_ns=t, send_ns=t, end_ns=t + 1, content_ns=[t + 1],
                                   input_tokens=50, output_tokens=8, user=clients + k))
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in lines))


def short_ttft_p99(records: list[RequestRecord]) -> float:
    return p99([request_metrics(r).ttft_ms or 0.0 for r in records if r.ok and not r.warmup and (r.input_tokens or 0) <= SHORT_MAX])


def test_a_flood_of_long_prompts_gets_token_admission_whose_predicted_gain_the_real_gateway_delivers(tmp_path: Path) -> None:
    from inferlab.gateway.config import AdmissionConfig, CacheConfig, GatewayConfig, UpstreamConfig

    trace = tmp_path / "flood.jsonl"
    flood_trace(trace)
    serve = ["--max-model-len", "16384", "--enforce-eager", "--max-num-batched-tokens", "8192"]
    with ChildServer(serve) as server:
        observed = bench(server.url, trace, tmp_path / "observed")
        a = advise(tmp_path / "observed", "latency")
        rec = next((r for r in a.recommendations if r.rule == "token_admission"), None)
        assert rec is not None, [(r.rule, r.title) for r in a.recommendations]
        budget = int(rec.change.split("max_tokens_in_flight = ")[1].split()[0].replace(",", ""))
        gain = rec.gains[0]
        assert gain.metric == "short requests' p99 TTFT ms" and "prediction" in gain.kind and gain.error_band is not None
        # the change, made: the real gateway, admitting by tokens with that budget, in front
        # of the same server, the same flood through it
        # (as recommended: prompts counted by the engine's /tokenize, the rest default; with
        # the default estimate, 4 characters a token, the long prompts counted otherwise and
        # the short chats' p99 measured 383-530 ms where exact counts predict 803)
        assert 'tokenizer = "upstream"' in rec.change, rec.change
        adm = AdmissionConfig(mode="tokens", max_tokens_in_flight=budget, tokenizer="upstream")
        changed = through_gateway(GatewayConfig((UpstreamConfig(server.url),), admission=adm, cache=CacheConfig(enabled=False)),
                                  trace)
    assert all(r.ok for r in changed.records)
    measured = short_ttft_p99(changed.records) - short_ttft_p99(observed.records)
    assert measured < 0 and gain.delta < 0  # the same sign: the short chats get through
    assert gain.delta == pytest.approx(measured, rel=0.30)


def test_a_what_if_keeps_the_runs_replicas_router_and_admission(tmp_path: Path) -> None:
    from inferlab.analysis.whatif import WhatIf
    from inferlab.gateway.config import AdmissionConfig
    from inferlab.results.runfiles import read_summary

    cfg = RunConfig(LoadConfig(ClosedLoop(24), num_requests=96),
                    WorkloadConfig(input_tokens=3000, output_tokens=64), out_dir=str(tmp_path / "run"))
    adm = AdmissionConfig(mode="tokens", max_tokens_in_flight=20000)
    asyncio.run(run(cfg, SimTarget(EngineConfig(), replicas=2, router="least-outstanding", admission=adm)))
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    w = WhatIf(tmp_path / "run", config)
    assert (w.replicas, w.router, w.admission) == (2, "least-outstanding", adm)
    # unchanged, the what-if is the run again (virtual time: the same numbers)
    base = w.simulate().result.summary
    ran = read_summary(tmp_path / "run" / "summary.json")
    assert base.ttft_ms is not None and ran.ttft_ms is not None
    assert base.ttft_ms.p50 == pytest.approx(ran.ttft_ms.p50) and base.e2e_ms.p50 == pytest.approx(ran.e2e_ms.p50)  # type: ignore[union-attr]
    # and one engine with no gateway is not that run
    one = WhatIf(tmp_path / "run", {**config, "replicas": None, "admission": None}).simulate().result.summary
    assert one.ttft_ms is not None and one.ttft_ms.p50 != pytest.approx(ran.ttft_ms.p50)


def test_a_gateways_access_log_is_advised_on_from_its_records(tmp_path: Path) -> None:
    """Production traffic: the gateway's access log (no summary.json, no workload) gets
    the rules that read the records, without predictions (the engine behind it is not
    known), and nothing the records cannot show (whether the prompts were identical)."""
    from inferlab.gateway.config import CacheConfig, GatewayConfig, UpstreamConfig

    trace = tmp_path / "mixed.jsonl"
    mixed_trace(trace)
    serve = ["--max-model-len", "16384", "--enforce-eager", "--max-num-batched-tokens", "8192"]
    with ChildServer(serve) as server:
        sent = through_gateway(GatewayConfig((UpstreamConfig(server.url),), cache=CacheConfig(enabled=False),
                                             access_log=str(tmp_path / "log"), metrics_refresh_s=0), trace)
    assert all(r.ok for r in sent.records) and not (tmp_path / "log" / "summary.json").exists()
    a = advise(tmp_path / "log", "latency")
    assert a.kind.startswith("gateway access log")
    rules = {r.rule: r for r in a.recommendations}
    assert "head_of_line" in rules and "response_cache" not in rules, list(rules)
    hol = rules["head_of_line"]
    assert hol.evidence.startswith("10 of ")  # (every fourth of the 40 is 8,000 tokens; the log has the preflight too)
    assert not hol.gains and hol.note.startswith("no prediction: a gateway's access log")


def test_a_what_if_of_a_trace_run_replays_what_the_run_sent_not_the_file_as_it_is_now(tmp_path: Path) -> None:
    """The trace file a run read may have changed or moved (or its relative path be
    another folder's): the what-if replays the run's own requests.jsonl."""
    from click.testing import CliRunner

    from inferlab.analysis.whatif import WhatIf
    from inferlab.cli.main import main

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.1, "input_tokens": 100 + 900 * (i % 4 == 0),
                                         "output_tokens": 20}) + "\n" for i in range(24)))
    res = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "-o", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    trace.write_text(json.dumps({"arrival_s": 0, "input_tokens": 5000, "output_tokens": 1}) + "\n")  # (changed since)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    what = WhatIf(tmp_path / "run", config)
    assert what.method.startswith("the run's requests.jsonl replayed")
    trace.unlink()  # (and gone: still predicted)
    assert WhatIf(tmp_path / "run", config).available


@pytest.mark.parametrize("served", [True, False])
def test_a_what_if_keeps_whether_the_run_had_an_api_server(tmp_path: Path, served: bool) -> None:
    """A served burst (bench --rate inf, sim run --rate inf --served) reruns served, its
    front end with it: every what-if of it was refused before (an offline rerun given a
    served front end); an offline one reruns offline."""
    from click.testing import CliRunner

    from inferlab.analysis.whatif import WhatIf
    from inferlab.cli.main import main

    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "--rate", "inf", "--served" if served else "--offline", "-n", "8",
                                    "--input-tokens", "200", "--output-tokens", "16", "-o", str(run)])
    assert res.exit_code == 0, res.output
    what = WhatIf(run, json.loads((run / "config.json").read_text()))
    sim = what.simulate({"quantization": "fp8"})
    assert bool(sim.result.engine and sim.result.engine.config.offline) is not served


@pytest.mark.parametrize(("flags", "says", "never"), [
    # a pool fixed at N blocks: fp8 adds no block, nor would a bigger GPU
    (["--num-gpu-blocks-override", "300"], "more than the 300 blocks --num-gpu-blocks-override fixes", "fp8"),
    # SGLang's own flags, not vLLM's
    (["--engine-family", "sglang", "--gpu-memory-utilization", "0.28"], "--mem-fraction-static", "--gpu-memory-utilization"),
])
def test_kv_pressure_advice_is_what_can_give_that_engine_room(tmp_path: Path, flags: list[str], says: str, never: str) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "-c", "64", "-n", "128", "--input-tokens", "1000", "--output-tokens", "256",
                                    "-o", str(run), *flags])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    kv = next(r for r in json.loads(res.stdout)["recommendations"] if r["rule"] == "kv_pressure")
    assert says in kv["change"] and never not in kv["change"], kv["change"]


@pytest.mark.parametrize(("family", "says", "never"), [
    ("trtllm", "--max_num_tokens", "vLLM"),
    ("lmdeploy", "--max-prefill-token-num", "vLLM"),
    ("vllm", "--max-num-batched-tokens", "TensorRT-LLM"),
    # SGLang's prefill steps leave decodes out by default: a smaller chunk alone does not
    # stop the stalls; chunks in the decodes' steps do
    ("sglang", "--chunked-prefill-size", "vLLM"),
])
def test_head_of_line_advice_names_the_flags_of_the_engine_that_ran(tmp_path: Path, family: str, says: str, never: str) -> None:
    """Long prompts beside short ones on each engine: the budget to lower is that
    engine's own flag (a TensorRT-LLM run was told vLLM's and SGLang's), and so is the
    fp8 advice beside it."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    trace, run = tmp_path / "mixed.jsonl", tmp_path / "run"
    mixed_trace(trace, n=60)
    res = CliRunner().invoke(main, ["sim", "run", "--engine-family", family, "--trace", str(trace),
                                    "--max-model-len", "16384", "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    recs = {r["rule"]: r for r in json.loads(res.stdout)["recommendations"]}
    hol = recs["head_of_line"]
    assert hol["gains"] and says in hol["change"] and never not in hol["change"], hol["change"]
    assert never not in recs["quantization"]["change"], recs["quantization"]["change"]
    assert ("--enable-mixed-chunk" in hol["change"]) == (family == "sglang"), hol["change"]
    # SGLang's chunk size bounds prompt chunks only: its running-request cap is not cut with it
    # (the advice told SGLang users to cut --max-running-requests to the chunk size)
    if family == "sglang":
        assert "max-running-requests" not in hol["change"], hol["change"]


def test_an_engine_behind_the_gateway_or_named_by_its_server_is_told_its_own_flags() -> None:
    """A profile through inferlab gateway in front of TensorRT-LLM engines was told vLLM's
    flags (the gateway's answer has no family of its own); a real server that said it is
    SGLang is told SGLang's; one that said nothing, vLLM's and SGLang's both."""
    from inferlab.analysis.advise import _flags, _Run
    from inferlab.results.provenance import gateway_answer
    from inferlab.results.summary import summarize

    trt = {"engine_family": "trtllm"}
    assert "--max_num_tokens" in _flags(gateway_answer([trt, trt])).budget
    mixed = _flags(gateway_answer([trt, {"engine_family": "sglang"}])).budget
    assert "vLLM" in mixed and "SGLang" in mixed  # (two families: neither's alone)

    def told(config: dict[str, Any]) -> str:
        return _Run(Path("."), config, summarize([], config=config), []).flags().budget

    assert told({"url": "http://x", "resolved": {"server_software": {"name": "SGLang"}}}).startswith("SGLang --chunked")
    assert "vLLM" in told({"url": "http://x", "resolved": {}}) and "SGLang" in told({"url": "http://x", "resolved": {}})


def test_an_slo_one_request_alone_misses_is_called_out_of_reach_and_one_the_load_misses_is_not(tmp_path: Path) -> None:
    """64 users of 2,000/300 tokens: a 2 ms TPOT limit is below what one such request
    takes alone on the engine (its floor: a run of one user at a time, made apart), so no
    load setting meets it and the advice says so first; a limit between that floor and
    the loaded run's TPOT is the load's doing, and is not called out of reach."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    sizes = ["--input-tokens", "2000", "--output-tokens", "300"]

    def advice(tpot_limit: str) -> dict[str, Any]:
        run = tmp_path / f"slo{tpot_limit}"
        res = CliRunner().invoke(main, ["sim", "run", "-c", "64", "-n", "128", *sizes, "--slo-tpot-ms", tpot_limit,
                                        "-o", str(run)])
        assert res.exit_code == 0, res.output
        res = CliRunner().invoke(main, ["advise", str(run), "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    res = CliRunner().invoke(main, ["sim", "run", "-c", "1", "-n", "3", *sizes, "--json"])
    assert res.exit_code == 0, res.output
    floor = json.loads(res.stdout)["tpot_ms"]["p50"]
    loaded = advice("2")
    first = loaded["recommendations"][0]
    assert first["rule"] == "slo_out_of_reach", [r["rule"] for r in loaded["recommendations"]]
    (gain,) = first["gains"]
    assert gain["after"] == pytest.approx(floor, rel=0.01) and gain["before"] > 2 * floor > 4
    between = advice(f"{1.3 * floor:.1f}")  # (met alone, missed under the load)
    assert "slo_out_of_reach" in between["rules_checked"]
    assert all(r["rule"] != "slo_out_of_reach" for r in between["recommendations"])


def test_prompts_the_cache_served_are_not_judged_against_an_uncached_request_alone(tmp_path: Path) -> None:
    """Two 12,000-token shared prefixes at 16 users and an E2E limit of 500 ms: one
    uncached request alone takes longer than that, but the run's cached ones, one at a
    time, do not; so the limit is not called out of reach (it was)."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    work = ["--prefix-groups", "2", "--prefix-tokens", "12000", "--suffix-tokens", "100", "--output-tokens", "50"]
    res = CliRunner().invoke(main, ["sim", "run", *work, "-c", "1", "-n", "20", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["e2e_ms"]["p50"] < 500  # (one at a time, cached: within it)
    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", *work, "-c", "16", "-n", "100", "--slo-e2e-ms", "500", "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert all(r["rule"] != "slo_out_of_reach" for r in json.loads(res.stdout)["recommendations"])


@pytest.mark.parametrize(("policy", "title"), [
    ("GUARANTEED_NO_EVICT", "requests wait for room"), ("MAX_UTILIZATION", "requests are preempted and recomputed"),
])
def test_a_full_cache_is_advised_on_whether_it_preempts_or_holds_requests_back(tmp_path: Path, policy: str, title: str) -> None:
    """TensorRT-LLM in 200 KV blocks at 16 users: under GUARANTEED_NO_EVICT nothing is
    preempted, requests wait instead (TTFT p50 seconds), and no KV advice was given; now
    it is, with what a cache twice the size does; under MAX_UTILIZATION it preempts."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "--engine-family", "trtllm", "--num-gpu-blocks-override", "200", "-c", "16",
                                    "-n", "48", "--input-tokens", "200", "--output-tokens", "400",
                                    "--capacity-scheduler-policy", policy, "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    kv = next(r for r in json.loads(res.stdout)["recommendations"] if r["rule"] == "kv_pressure")
    assert kv["title"].endswith(title), kv["title"]
    if policy == "GUARANTEED_NO_EVICT":
        (gain,) = kv["gains"]
        assert gain["after"] < 0.8 * gain["before"] and "MAX_UTILIZATION" in kv["change"]


def test_a_sweep_over_settings_is_advised_on_each_settings_heaviest_point(tmp_path: Path) -> None:
    """A sweep of two capacity policies at one load: the run rules looked at one point
    only (the first heaviest), so the preempting policy's KV advice was never given."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    res = CliRunner().invoke(main, ["sweep", "--engine-family", "trtllm", "--num-gpu-blocks-override", "200", "-c", "16",
                                    "-n", "48", "--input-tokens", "200", "--output-tokens", "400",
                                    "--capacity-scheduler-policy", "GUARANTEED_NO_EVICT,MAX_UTILIZATION",
                                    "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output
    kv = [r for r in json.loads(res.stdout)["recommendations"] if r["rule"] == "kv_pressure"]
    assert sorted(r["title"].rsplit(": ", 1)[1] for r in kv) == ["requests are preempted and recomputed",
                                                                 "requests wait for room"], kv


def sim_run_rules(run: Path, *flags: str) -> dict[str, Any]:
    """``inferlab sim run FLAGS -o RUN``, then ``inferlab advise RUN``: its
    recommendations by rule."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    res = CliRunner().invoke(main, ["sim", "run", *flags, "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    return {r["rule"]: r for r in json.loads(res.stdout)["recommendations"]}


def test_a_system_prompt_the_cache_serves_gets_no_advice_to_shorten_it(tmp_path: Path) -> None:
    """16 sessions of 6 turns sharing a 1,500-token system prompt: the prefix cache serves
    it, and a shorter one predicts no gain (it predicted +3 % TTFT, and was advised);
    with caching off it is advised, with a gain."""
    chats = ["--sessions", "16", "--turns", "6", "--input-tokens", "300", "--output-tokens", "200", "--system-tokens", "1500"]
    assert "template_overhead" not in sim_run_rules(tmp_path / "on", *chats)
    off = sim_run_rules(tmp_path / "off", *chats, "--no-enable-prefix-caching")["template_overhead"]
    assert off["gains"] and off["gains"][0]["after"] < 0.95 * off["gains"][0]["before"]


def test_prefixes_the_cache_cannot_hold_are_blamed_on_its_size_not_the_prompts(tmp_path: Path) -> None:
    """64 groups of 3,000-token prefixes (192,000 tokens) in a cache of 12,800: they are
    evicted before they are used again, whatever the prompts' order."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "-c", "16", "-n", "128", "--prefix-tokens", "3000", "--prefix-groups", "64",
                                    "--suffix-tokens", "100", "--output-tokens", "50", "--num-gpu-blocks-override", "801",
                                    "-o", str(run)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["advise", str(run), "--json"])
    assert res.exit_code == 0, res.output
    rec = next(r for r in json.loads(res.stdout)["recommendations"] if r["rule"] == "prefix_caching")
    assert "too small to keep them" in rec["title"] and "192,000 tokens" in rec["evidence"], rec


def test_repeats_get_a_response_cache_unless_one_already_answered_them(tmp_path: Path) -> None:
    """Every request the same prompt: a response cache would answer the repeats. Where
    one already did (records answered by a cache in front of the engine, as a run
    through inferlab gateway records them), it is not advised again."""
    cfg = RunConfig(LoadConfig(ClosedLoop(2), num_requests=8), WorkloadConfig(prompt="What is RAG?", output_tokens=16),
                    out_dir=str(tmp_path / "same"))
    asyncio.run(run(cfg, SimTarget(EngineConfig())))
    assert "response_cache" in [r.rule for r in advise(tmp_path / "same").recommendations]
    records = tmp_path / "same" / "requests.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    for rec in lines[1:]:
        rec["response_cache_hit"] = True
    records.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    assert "response_cache" not in [r.rule for r in advise(tmp_path / "same").recommendations]


def test_a_knee_the_engines_own_cap_made_is_advised_raised_not_capped_again(tmp_path: Path) -> None:
    """A sweep of 1-16 users on an engine that runs 4 requests at once: past 4 the rest
    queue in the engine. The knee is its cap, so the advice is to raise it (predicted to
    gain throughput and E2E), never to cap concurrency at 4 again; the same for one run
    of 8 users, under every goal. A knee of the GPU itself (no such cap) under the
    throughput goal gets no cap either: a cap gives throughput up."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    def sweep(out: Path, *flags: str) -> None:
        res = CliRunner().invoke(main, ["sweep", "-n", "24", "--input-tokens", "300", "--output-tokens", "48", *flags, "-o", str(out)])
        assert res.exit_code == 0, res.output

    sweep(tmp_path / "capped", "-c", "1,2,4,8,16", "--max-num-seqs", "4")
    for goal in ("latency", "throughput"):
        recs = advise(tmp_path / "capped", goal).recommendations
        assert recs[0].rule == "engine_cap" and "--max-num-seqs 8" in recs[0].change, [r.rule for r in recs]
        assert "concurrency_cap" not in [r.rule for r in recs]
        gains = {g.metric: g for g in recs[0].gains}
        assert gains["output tokens/s"].after > 1.3 * gains["output tokens/s"].before
        assert gains["E2E p50 ms"].after < gains["E2E p50 ms"].before
    one = next(d for d in (tmp_path / "capped").iterdir() if d.name.endswith("_c8"))
    assert [r.rule for r in advise(one, "throughput").recommendations][:1] == ["engine_cap"]
    sweep(tmp_path / "gpu", "-c", "1,4,16,64,256", "-n", "256", "--input-tokens", "2000", "--output-tokens", "64", "--gpu", "L40S")
    assert "concurrency_cap" in [r.rule for r in advise(tmp_path / "gpu", "latency").recommendations]
    assert not {"concurrency_cap", "engine_cap"} & {r.rule for r in advise(tmp_path / "gpu", "throughput").recommendations}


def test_requests_that_failed_come_first_with_what_made_them_fail(tmp_path: Path) -> None:
    """Prompts up to 3,000 tokens on an engine of 1,024 tokens of context: most fail. The
    advice starts there (the other rules read the completed few), naming the context
    length; a run where none failed gets no such item."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    for name, length in (("long", "uniform:100:3000"), ("short", "200")):
        res = CliRunner().invoke(main, ["sim", "run", "--max-model-len", "1024", "--input-tokens", length, "-n", "12", "-c", "2",
                                        "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    first = advise(tmp_path / "long").recommendations[0]
    assert first.rule == "failures" and "--max-model-len" in first.change
    assert "of 12 requests failed" in first.evidence
    assert "failures" not in [r.rule for r in advise(tmp_path / "short").recommendations]


def test_a_growing_conversation_gets_a_window_only_where_the_cache_does_not_serve_its_history(tmp_path: Path) -> None:
    """16 chats of 6 turns: with prefix caching on, the history (answers too) comes from
    the cache, and a sliding window, which changes where each prompt starts, would cost
    TTFT: no window is advised. With caching off, the window is advised with a gain."""
    chats = ["--api", "chat", "--sessions", "16", "--turns", "6", "--input-tokens", "300", "--output-tokens", "200"]
    assert "context_growth" not in sim_run_rules(tmp_path / "on", *chats)
    off = sim_run_rules(tmp_path / "off", *chats, "--no-enable-prefix-caching")["context_growth"]
    assert off["gains"] and off["gains"][0]["after"] < 0.8 * off["gains"][0]["before"]
    assert "no longer finds the history" in off["change"]


@pytest.mark.parametrize("simulated", [True, False])
def test_advice_on_a_profile_of_the_simulated_server_says_every_number_is_a_prediction(tmp_path: Path, simulated: bool) -> None:
    """A profile of `sim serve` is labelled a prediction; advise on it said "bound: at
    best, TTFT as measured alone" and "estimate: ... the measured prefill cost", with no
    word of the simulator. Now the advice says it read a simulation, and so does each
    gain's source; a profile of a real server reads as measured, as before."""
    from rich.console import Console

    from inferlab.analysis.profile import PROFILE_FILE, Factor, Profile
    from inferlab.cli.advise import render_advice
    from inferlab.results.metrics import SLO

    factors = [
        Factor("head_of_line", "Head-of-line", "x", "y",
               {"inflation": 3.0, "long_tokens": 3000, "short_alone_ttft_ms": 40.0, "short_with_long_ttft_ms": 120.0}),
        Factor("response_cache", "Response cache", "x", "y", {"detected": False, "ratio": 1.0, "e2e_repeat_ms": 900.0}),
    ]
    engine = {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "H100", "engine_family": "vllm"} if simulated else None
    prof = Profile("http://127.0.0.1:8000/v1", "m", engine, 4096, "server", 60.0, 50.0, SLO(2000.0, 100.0), factors)
    (tmp_path / PROFILE_FILE).write_text(json.dumps(prof.to_json()))
    a = advise(tmp_path)
    assert a.simulated is simulated and a.to_json()["simulated"] is simulated
    kinds = [g.kind for r in a.recommendations for g in r.gains]
    assert len(kinds) == 2 and all(k.startswith("prediction") is simulated for k in kinds), kinds
    assert any(("TTFT as simulated alone" if simulated else "TTFT as measured alone") in k for k in kinds)
    console = Console(record=True, width=200)
    render_advice(console, a)
    assert ("every number below, the evidence included, is a prediction" in console.export_text()) is simulated


def test_failures_of_several_causes_get_a_change_for_each(tmp_path: Path) -> None:
    """A gateway's log where 5 requests met the key's rate limit and 5 were the engine's
    400s for prompts past its context: every failure was put down to the rate limit (the
    first cause any error message matched). Each request's own cause now, with counts."""
    import dataclasses

    from click.testing import CliRunner

    from inferlab.cli.main import main
    from inferlab.results.records import ErrorKind
    from inferlab.results.runfiles import read_records

    run = tmp_path / "log"
    res = CliRunner().invoke(main, ["sim", "run", "-n", "20", "-c", "2", "--input-tokens", "200", "--out", str(run)])
    assert res.exit_code == 0, res.output
    recs = list(read_records(run / "requests.jsonl"))
    limited = "HTTP 429: key alice: 3 requests per minute"
    context = "HTTP 400: This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"
    changed = [dataclasses.replace(r, end_ns=None, status=429 if i < 5 else 400, error_kind=ErrorKind.HTTP_STATUS,
                                   error=limited if i < 5 else context) if i < 10 else r for i, r in enumerate(recs)]
    (run / "requests.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in changed))
    (run / "summary.json").unlink()  # (as an access log: the summary from the records)
    first = advise(run).recommendations[0]
    assert first.rule == "failures" and "10 of 20 requests failed" in first.evidence
    assert "5 of them: the key's rate limits" in first.change and "5 of them: prompts (with their answers) longer" in first.change
    # a 429 the server gave with its queue full is the server's load, not a key's limit
    # (the key's rate limits were blamed: "429" matched first)
    full = "HTTP 429: The server is overloaded: too many requests are waiting."
    (run / "requests.jsonl").write_text("".join(json.dumps(dataclasses.replace(r, error=full).to_json() if i < 5 else r.to_json()) + "\n"
                                                for i, r in enumerate(changed)))
    first = advise(run).recommendations[0]
    assert "5 of them: the server turned them away with its queue of waiting requests full" in first.change, first.change
    assert "rate limits" not in first.change


def test_an_open_loop_the_server_cannot_keep_up_with_is_told_to_lower_the_load_first(tmp_path: Path) -> None:
    """20 req/s of 512/256-token requests on one L4, which completes under 4: the queue
    grows all run long. advise put it down to a full KV cache (fp8 KV) with an E2E gain
    that grew with the run's length; now the overload leads (a lower rate, replicas,
    admission), and no other item quotes a TTFT or E2E gain, saying why. A rate the
    server keeps up with gets no such item."""
    over = sim_run_rules(tmp_path / "over", "--gpu", "L4", "-r", "20", "-n", "200", "--input-tokens", "512",
                         "--output-tokens", "256")
    assert next(iter(over)) == "overload", list(over)
    assert "replicas" in over["overload"]["change"] and "admission" in over["overload"]["change"]
    for rec in over.values():
        assert not [g for g in rec["gains"] if g["metric_class"] in ("TTFT", "E2E")], rec
    assert any("no TTFT or E2E gain quoted" in rec["note"] for rec in over.values()), over
    assert "overload" not in sim_run_rules(tmp_path / "fits", "--gpu", "L4", "-r", "1", "-n", "40", "--input-tokens", "512",
                                           "--output-tokens", "256")


@pytest.mark.parametrize("where", ["server", "gateway"])
def test_prefix_caching_a_real_server_or_the_gateways_upstreams_had_off_is_advised_on(tmp_path: Path, where: str) -> None:
    """Shared prefixes, caching off: not on a simulated engine but on a real server that
    stated its settings (resolved.server_software.settings), or on the engines behind
    inferlab gateway (resolved.engine.inferlab_gateway.engines). advise read only the
    simulated engine's flag, and blamed the prompts ("keep shared text at the very
    start"); now it says turn prefix caching on. With it stated on, the prompts it is."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    run = tmp_path / "run"
    res = CliRunner().invoke(main, ["sim", "run", "-c", "4", "-n", "24", "--prefix-tokens", "1500", "--prefix-groups", "2",
                                    "--suffix-tokens", "64", "--output-tokens", "16", "--no-enable-prefix-caching",
                                    "-o", str(run)])
    assert res.exit_code == 0, res.output
    config = json.loads((run / "config.json").read_text())
    engine = config.pop("engine")
    config.pop("command")  # (as bench records a server: not a sim run)

    def advised(caching: bool) -> dict[str, Any]:
        resolved = ({"server_software": {"name": "vLLM", "settings": {"enable_prefix_caching": caching}}} if where == "server"
                    else {"engine": {"inferlab_gateway": {"upstreams": 1, "engines": [{**engine, "enable_prefix_caching": caching}]}}})
        (run / "config.json").write_text(json.dumps({**config, "url": "http://127.0.0.1:8000", "resolved": resolved}))
        return next(r for r in advise(run).recommendations if r.rule == "prefix_caching").to_json()

    off = advised(False)
    assert off["change"].startswith("turn prefix caching on") and "--enable-prefix-caching" in off["change"], off
    assert "keep shared text" not in off["change"]
    assert "keep shared text" in advised(True)["change"]


def bench_closed(url: str, out: Path, input_tokens: int, n: int = 24, concurrency: int = 4) -> None:
    """``n`` chat requests of ``input_tokens`` user tokens and 16 output tokens, a closed
    loop of ``concurrency`` users against ``url``, written to ``out``."""
    cfg = RunConfig(LoadConfig(ClosedLoop(concurrency), num_requests=n),
                    WorkloadConfig(input_tokens=input_tokens, output_tokens=16), out_dir=str(out))

    async def go() -> RunResult:
        async with asyncio.timeout(LIMIT_S):
            return await run(cfg, HttpTarget(url))

    asyncio.run(go())


def test_a_stock_chat_template_costs_too_little_to_be_advised_on(tmp_path: Path) -> None:
    """The simulated server's ChatML, 19 tokens on 64-token prompts (a fifth of each): it
    was advised shortened, with no gain stated; its prefill is a fraction of a ms beside
    the run's TTFT."""
    with ChildServer(["--max-model-len", "4096"]) as server:
        bench_closed(server.url, tmp_path / "run", 64)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["prompt_overhead_tokens"] < 64  # (the premise: a short template, a large share of a short prompt)
    assert "template_overhead" not in [r.rule for r in advise(tmp_path / "run").recommendations]


def long_template_model(tmp_path: Path, tokenizer_path: str) -> Path:
    """A model folder for ``sim serve --tokenizer``: the test tokenizer, and a chat
    template that opens every prompt with a long system text of its own (over 1,000
    tokens)."""
    import shutil

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(tokenizer_path, model / "tokenizer.json")
    policy = " ".join(f"Always follow the corporate policy number {i} with care." for i in range(120))
    template = ("{{ '<|im_start|>system\\n" + policy + "<|im_end|>\\n' }}{% for m in messages %}{{ '<|im_start|>' + "
                "m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return model


def test_a_long_chat_template_is_left_to_the_prefix_cache_that_serves_it_or_would(tmp_path: Path, tokenizer_path: str) -> None:
    """A server whose own chat template adds a long system text to every prompt. With
    prefix caching on, the cache serves it: advise said "shorten the template" all the
    same; now nothing. With caching off it said the same, never that the template is
    an identical prefix the cache would serve; now it says turn prefix caching on, and
    what the template costs a request's TTFT."""
    model = long_template_model(tmp_path, tokenizer_path)
    for name, flags in (("on", []), ("off", ["--no-enable-prefix-caching"])):
        with ChildServer(["--max-model-len", "4096", "--tokenizer", str(model), "--enable-prompt-tokens-details", *flags]) as server:
            bench_closed(server.url, tmp_path / name, 200)
    assert json.loads((tmp_path / "on" / "summary.json").read_text())["prompt_overhead_tokens"] >= 500  # (the premise)
    assert "template_overhead" not in [r.rule for r in advise(tmp_path / "on").recommendations]
    off = next(r for r in advise(tmp_path / "off").recommendations if r.rule == "template_overhead")
    assert off.change.startswith("turn prefix caching on") and "of the run's TTFT p50" in off.evidence, off


def test_a_what_if_whose_baseline_is_not_the_run_quotes_no_gain_from_it(tmp_path: Path, tokenizer_path: str) -> None:
    """A server whose own chat template adds a long system text: the what-if reruns the
    workload with the simulator's template, prompts a tenth as long, and quoted gains
    from that baseline (fp8 weights' TPOT) as the run's. Now the items say the rerun is
    not the run, and quote none; against the stock template the rerun is the run, and
    the gain stands."""
    with ChildServer(["--max-model-len", "4096", "--tokenizer", str(long_template_model(tmp_path, tokenizer_path))]) as server:
        bench_closed(server.url, tmp_path / "long", 200)
    with ChildServer(["--max-model-len", "4096"]) as server:
        bench_closed(server.url, tmp_path / "stock", 200)

    def predicted(recs: list[Any]) -> list[Any]:
        return [g for r in recs for g in r.gains if "rerun" in g.kind]

    long = advise(tmp_path / "long").recommendations
    assert "quantization" in [r.rule for r in long] and not predicted(long), [r.to_json() for r in long]
    assert any("not the run" in r.note and "prompts average" in r.note for r in long)
    stock = advise(tmp_path / "stock").recommendations
    assert predicted(stock) and not any("not the run" in r.note for r in stock)


def test_a_sweeps_kv_evidence_names_each_run_once(tmp_path: Path) -> None:
    """-c 8,32,96 with the cache full at 96 only: the knee's pair (32, 96) and the runs
    past it held the 96 run twice, and the evidence said "at concurrency 96: …; at
    concurrency 96: …"."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    s = tmp_path / "s"
    res = CliRunner().invoke(main, ["sweep", "--num-gpu-blocks-override", "1200", "-c", "8,32,96", "-n", "192",
                                    "--input-tokens", "200", "--output-tokens", "400", "-o", str(s)])
    assert res.exit_code == 0, res.output
    # the cache full at 96 alone: the 32 run's few preemptions taken out
    c32 = s / "002_c32"
    records = [json.loads(line) for line in (c32 / "requests.jsonl").read_text().splitlines() if line.strip()]
    for r in records:
        if r.get("server_timeline"):
            r["server_timeline"]["preemptions"] = 0
    (c32 / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = json.loads((c32 / "summary.json").read_text())
    summary["prediction"]["preemptions"] = 0
    (c32 / "summary.json").write_text(json.dumps(summary))
    res = CliRunner().invoke(main, ["advise", str(s), "--json"])
    assert res.exit_code == 0, res.output
    (kv,) = [r for r in json.loads(res.stdout)["recommendations"] if r["rule"] == "kv_pressure"]
    assert "concurrency 32 → 96" in kv["evidence"] and kv["evidence"].count("at concurrency 96:") == 1, kv["evidence"]
