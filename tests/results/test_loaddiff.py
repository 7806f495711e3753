"""Which load and workload settings differ between two runs' configs
(``results.loaddiff``), and which legitimately differing ones are left out."""

from __future__ import annotations

import copy
from typing import Any

from inferlab.results.loaddiff import load_differences


def bench(**changes: Any) -> dict[str, Any]:
    """A bench run's config.json (the fields that matter here)."""
    config: dict[str, Any] = {
        "load": {"schedule": {"kind": "ClosedLoop", "concurrency": 4}, "num_requests": 40, "duration_s": None, "warmup": 0, "seed": 0},
        "workload": {"input_tokens": "300", "output_tokens": "40", "prompt": None, "exact_output": True, "dataset": None,
                     "trace": None, "prefix_groups": None, "prefix_tokens": None, "suffix_tokens": None,
                     "prefix_popularity": "uniform", "sessions": None, "turns": 4, "think_time_s": 0.0, "system_tokens": 0,
                     "context_window_tokens": None, "tokenizer": None, "token_ids": True, "prompt_salt": None},
        "url": "http://a:8000", "model": None, "api": "chat", "stream": True, "api_key": None, "headers": {},
        "timeout_s": 600.0, "idle_timeout_s": 60.0, "slo": None, "out_dir": "runs/a", "preflight": True,
        "extra_body": {}, "http_client": "auto",
        "resolved": {"url": "http://a:8000/v1", "model": "m", "prompt_salt": "1a2b3c4d", "workers": 1, "engine": None},
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def texts(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [d.text for d in load_differences(a, b)]


def test_the_same_workload_on_another_day_another_server_differs_in_nothing() -> None:
    b = bench(load__seed=7, out_dir="runs/b", url="http://b:9000", timeout_s=30.0, slo={"ttft_ms": 100},
              resolved={"url": "http://b:9000/v1", "model": "m", "prompt_salt": "ffff0000", "workers": 4,
                        "engine": {"max_num_batched_tokens": 512}},
              workload__prompt_salt="", workload__tokenizer="tok.json", api_key="***", http_client="httptools")
    assert load_differences(bench(), b) == []
    assert load_differences(bench(), copy.deepcopy(bench(load__num_requests=40.0))) == []  # (4 and 4.0 are one setting)


def test_each_differing_setting_is_named_with_both_values() -> None:
    a = bench()
    assert texts(a, bench(workload__input_tokens="200", workload__output_tokens="50")) == [
        "prompt lengths (--input-tokens) 300 vs 200", "output lengths, max tokens (--output-tokens) 40 vs 50"]
    assert texts(a, bench(load__schedule={"kind": "OpenLoop", "rate_rps": 8.0, "arrival": "poisson", "burstiness": 1.0,
                                          "max_concurrency": None})) == [
        "load closed loop of 4 users vs open loop at 8 req/s (poisson)"]
    assert texts(a, bench(load__schedule={"kind": "ClosedLoop", "concurrency": 1})) == [
        "load closed loop of 4 users vs closed loop of 1 user"]  # (not "1 users")
    assert texts(a, bench(resolved={"url": "http://a:8000/v1", "model": "other", "engine": None})) == ["model m vs other"]
    assert texts(a, bench(workload__dataset={"path": "sharegpt.json", "format": None}, load__num_requests=100)) == [
        "requests (-n) 40 vs 100", 'dataset none vs {"path": "sharegpt.json"}']
    assert texts(a, bench(extra_body={"temperature": 1.0}, stream=False, api="completions")) == [
        "API chat vs completions", "streaming True vs False",
        'extra request fields (--extra-body, --temperature) {} vs {"temperature": 1.0}']


def test_a_sim_run_is_compared_on_what_it_records() -> None:
    """``sim run`` records no ``stream`` or ``extra_body`` and names its model in its engine."""
    sim = {"command": "sim run", "engine": {"model": "m", "max_num_seqs": 8}, "load": bench()["load"],
           "workload": bench()["workload"], "api": "chat", "trace": None}
    assert load_differences(sim, bench()) == []
    other = {**sim, "engine": {"model": "Llama-3.1-8B"}}
    assert texts(bench(), other) == ["model m vs Llama-3.1-8B"]


def test_engine_differences_name_each_differing_engine_setting_only() -> None:
    from inferlab.results.loaddiff import engine_differences

    started = {"engine": "llamacpp", "model": "m.gguf", "max_num_seqs": 4, "enable_prefix_caching": True,
               "host": "127.0.0.1", "port": 18081, "ready_timeout_s": 600.0}
    a = bench(engine_config=started)
    b = bench(engine_config={**started, "enable_prefix_caching": False, "port": 18082, "model": "other.gguf"})
    assert [d.text for d in engine_differences(a, b)] == ["enable_prefix_caching (engine config) True vs False"]
    assert load_differences(a, b) == []  # (the server's settings are not the workload's)
    assert engine_differences(a, bench()) == []  # (recorded by one run only: not compared)
    sim = {"model": "m", "max_num_batched_tokens": 8192, "engine_family": "vllm"}
    sa = bench(resolved={"url": "u", "model": "m", "engine": sim})
    sb = bench(resolved={"url": "u", "model": "m", "engine": {**sim, "max_num_batched_tokens": 512}})
    assert [d.setting for d in engine_differences(sa, sb)] == ["engine.max_num_batched_tokens"]
    stated = bench(resolved={"url": "u", "model": "m", "engine": None,
                             "server_software": {"name": "vLLM", "settings": {"enable_prefix_caching": False}}})
    other = copy.deepcopy(stated)
    other["resolved"]["server_software"]["settings"]["enable_prefix_caching"] = True
    assert [d.text for d in engine_differences(stated, other)] == ["enable_prefix_caching (stated by the server) False vs True"]
