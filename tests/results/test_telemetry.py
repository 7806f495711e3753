"""A server's /metrics page in one vocabulary: vLLM's, SGLang's and llama.cpp's names, the
text format's corners, counter deltas, gauges over samples, histogram deltas."""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from inferlab.results.telemetry import (
    ServerMetrics,
    merge,
    parse_prometheus,
    quantile_bound,
    server_metrics,
    server_names,
    snapshot,
)

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_running{{engine="1",model_name="m"}} 1.0
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:num_preemptions_total{{engine="0",model_name="m"}} 2.0
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
vllm:time_to_first_token_seconds_created{{engine="0",model_name="m"}} 1.7e9
"""


def vllm_page(**kw: float) -> str:
    values = dict(running=3, waiting=0, kv=0.5, queries=1000, hits=200, prompt=1000, gen=50, b1=0, b2=0, b3=0, ttft_sum=0.0)
    values.update(kw)
    return VLLM.format(**values)


def test_the_parser_reads_labels_escapes_timestamps_and_special_values() -> None:
    text = (
        '# a comment\n\nm_total{a="x\\"y",le="+Inf"} 3 1700000000000\n'
        "plain 1.5e3\nnan_metric NaN\ngarbage line here\nbad_value{a=\"1\"} abc\n"
    )
    s = parse_prometheus(text)
    assert s["m_total"] == [({"a": 'x"y', "le": "+Inf"}, 3.0)]
    assert s["plain"] == [({}, 1500.0)]
    assert math.isnan(s["nan_metric"][0][1])
    assert "garbage" not in s and "bad_value" not in s


def test_the_parser_reads_each_escape_of_a_label_value_as_written() -> None:
    """A newline is ``\\n``, a backslash ``\\\\`` and a quote ``\\"`` (one pass: an escaped
    backslash before an n is no newline); only a newline ends a line, so a U+2028 in a
    value does not cut it (the name here as prometheus_client writes it)."""
    name = 'my"mo\\del\nv2 \\n \u2028 end'
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "", ["model_name", "engine"], registry=registry).labels(name, "0").set(3)
    s = parse_prometheus(generate_latest(registry).decode())
    assert s["vllm:num_requests_running"] == [({"engine": "0", "model_name": name}, 3.0)]


def test_vllm_names_map_to_ours_summing_label_sets() -> None:
    snap = snapshot(parse_prometheus(vllm_page(running=3)))
    assert snap.server == "vllm"
    assert snap.values["running"] == 4  # two engines: 3 + 1
    assert snap.values["prefix_cache_hits_tokens"] == 200
    assert "ttft" in snap.histograms and snap.histograms["ttft"].bounds == (0.1, 1.0, math.inf)


def test_reading_only_some_names_gives_the_same_values_for_them_and_nothing_else() -> None:
    ours = ("running", "waiting", "kv_usage")
    for page in (vllm_page(running=3, waiting=2, kv=0.75),
                 'sglang:num_running_reqs 5\nsglang:num_queue_reqs 2\nsglang:token_usage 0.25\nsglang:prompt_tokens_total 9\n',
                 "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\nllamacpp:tokens_predicted_total 64\n"):
        whole = snapshot(parse_prometheus(page))
        some = snapshot(parse_prometheus(page, server_names(ours)))
        assert some.values == {k: v for k, v in whole.values.items() if k in ours}
        assert some.values and not some.histograms
    assert "vllm:time_to_first_token_seconds" in server_names(["ttft"])
    assert snapshot(parse_prometheus(vllm_page(b3=4), server_names(["ttft"]))).histograms["ttft"].count == 4


def test_deltas_gauges_and_histograms_over_a_run() -> None:
    before = snapshot(parse_prometheus(vllm_page(queries=1000, hits=200, prompt=1000, gen=50, b1=1, b2=1, b3=1, ttft_sum=0.05)))
    during = [snapshot(parse_prometheus(vllm_page(running=7, waiting=4, kv=0.9)))]
    # 10 new TTFTs: 6 under 0.1 s, 3 more under 1 s, 1 beyond
    after = snapshot(parse_prometheus(vllm_page(queries=3000, hits=1700, prompt=3000, gen=450, b1=7, b2=10, b3=11, ttft_sum=3.05)))
    m = server_metrics(before, during, after)
    assert m.available and m.server == "vllm" and m.samples == 1
    assert m.counters["prompt_tokens"] == 2000 and m.counters["generation_tokens"] == 400
    assert m.counters["preemptions"] == 0
    assert m.prefix_cache_hit_rate == pytest.approx(1500 / 2000)
    # gauges from the pages sampled during the run only (before and after: an idle server)
    page = during[0].values
    assert m.gauges["running"].max == page["running"] and m.gauges["waiting"].max == page["waiting"] == 4
    assert m.gauges["kv_usage"].mean == pytest.approx(0.9)
    short = server_metrics(before, [], after)
    assert short.samples == 0 and short.gauges == {} and short.counters == m.counters
    h = m.histograms["ttft_ms"]
    assert h.count == 10 and h.mean_ms == pytest.approx(300.0)
    assert (h.p50_ms, h.p90_ms, h.p99_ms) == (100.0, 1000.0, None)  # bounds; p99 is in +Inf
    assert "prompt_seconds" in m.missing and "ttft" not in m.missing
    # the hit rate is in the summary (from vLLM's counters): not said to be missing
    assert m.prefix_cache_hit_rate is not None and "prefix_cache_hit_rate" not in m.missing


def test_a_counter_that_went_back_is_unknown_not_negative() -> None:
    before = snapshot(parse_prometheus(vllm_page(prompt=5000)))
    after = snapshot(parse_prometheus(vllm_page(prompt=100)))  # the server restarted
    assert server_metrics(before, [], after).counters["prompt_tokens"] is None


def test_sglang_names() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m"} 5\nsglang:num_queue_reqs{model_name="m"} 2\n'
        'sglang:token_usage{model_name="m"} 0.25\nsglang:cache_hit_rate{model_name="m"} 0.6\n'
        'sglang:prompt_tokens_total{model_name="m"} 900\nsglang:generation_tokens_total{model_name="m"} 90\n'
    )
    snap = snapshot(parse_prometheus(text))
    assert snap.server == "sglang"
    # (no sglang:cached_tokens_total: SGLang shows it once its cache served a token)
    assert snap.values == {"running": 5, "waiting": 2, "kv_usage": 0.25, "prefix_cache_hit_rate": 0.6,
                           "prompt_tokens": 900, "generation_tokens": 90,
                           "prefix_cache_queries_tokens": 900, "prefix_cache_hits_tokens": 0}
    m = server_metrics(snap, [], snap)
    assert m.prefix_cache_hit_rate == 0.6  # the server's own rate where its counters did not move
    # its finished requests and retractions, counted over the run (labels summed)
    later = text + ('sglang:num_requests_total{model_name="m",is_streaming="true"} 7\n'
                    'sglang:num_requests_total{model_name="m",is_streaming="false"} 3\n'
                    'sglang:num_retracted_requests_total{model_name="m"} 2\n')
    first = later.replace("} 7\n", "} 1\n").replace("} 3\n", "} 0\n").replace("} 2\n", "} 0\n")
    m = server_metrics(snapshot(parse_prometheus(first)), [], snapshot(parse_prometheus(later)))
    assert m.counters["requests_finished"] == 9 and m.counters["preemptions"] == 2
    assert "requests_finished" not in m.missing and "preemptions" not in m.missing


def test_sglang_cached_tokens_are_its_prefix_cache_hits_over_its_prompt_tokens() -> None:
    def page(prompt: int, cached: dict[str, int]) -> str:
        lines = [f'sglang:prompt_tokens_total{{model_name="m",engine_type="unified"}} {prompt}']
        lines += [f'sglang:cached_tokens_total{{model_name="m",engine_type="unified",cache_source="{s}"}} {n}'
                  for s, n in cached.items()]
        return "\n".join(lines) + "\n"

    before = snapshot(parse_prometheus(page(1000, {})))
    after = snapshot(parse_prometheus(page(3000, {"device": 1200, "host": 300})))
    m = server_metrics(before, [], after)
    assert m.prefix_cache_tokens() == (1500, 2000)  # every cache source's tokens
    assert m.prefix_cache_hit_rate == 1500 / 2000
    assert "prefix_cache_hits_tokens" not in m.missing and m.server == "sglang"


def test_llama_cpp_counts_cached_prompt_tokens_apart_and_ours_adds_them() -> None:
    text = (
        "llamacpp:prompt_tokens_total 700\nllamacpp:prompt_tokens_cached_total 300\n"
        "llamacpp:tokens_predicted_total 64\nllamacpp:prompt_seconds_total 0.5\n"
        "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n"
    )
    snap = snapshot(parse_prometheus(text))
    assert snap.server == "llama.cpp"
    assert snap.values["prompt_tokens"] == 1000 and snap.values["prefix_cache_hits_tokens"] == 300
    assert snap.values["generation_tokens"] == 64 and snap.values["waiting"] == 1


def test_quantile_bound_is_the_first_bucket_holding_the_share() -> None:
    bounds, cum = (0.1, 0.5, math.inf), (5.0, 9.0, 10.0)
    assert quantile_bound(0.5, bounds, cum) == 0.1
    assert quantile_bound(0.51, bounds, cum) == 0.5
    assert quantile_bound(0.95, bounds, cum) is None
    assert quantile_bound(0.5, bounds, (0.0, 0.0, 0.0)) is None


def test_the_json_form_reads_back() -> None:
    before = snapshot(parse_prometheus(vllm_page(b1=1, b2=1, b3=1, ttft_sum=0.05)))
    after = snapshot(parse_prometheus(vllm_page(prompt=2000, b1=3, b2=4, b3=4, ttft_sum=1.0)))
    m = server_metrics(before, [], after)
    d = json.loads(json.dumps(m.to_json()))
    assert ServerMetrics.from_json(d) == m
    off = ServerMetrics(False, "GET http://x/metrics: HTTP 404")
    assert ServerMetrics.from_json(off.to_json()) == off
    assert off.to_json() == {"available": False, "reason": "GET http://x/metrics: HTTP 404"}


def _gateway_page(zero: float, count: float, total: float, timeouts: float = 0.0) -> str:
    """inferlab gateway's queue-wait histogram (two keys' series) and its refusals."""
    lines = []
    for key in ("a", "b"):
        lines += [f'inferlab_gateway_queue_wait_seconds_bucket{{gen_ai_request_model="m",key="{key}",le="0.0"}} {zero / 2}',
                  f'inferlab_gateway_queue_wait_seconds_bucket{{gen_ai_request_model="m",key="{key}",le="0.5"}} {count / 2}',
                  f'inferlab_gateway_queue_wait_seconds_bucket{{gen_ai_request_model="m",key="{key}",le="+Inf"}} {count / 2}',
                  f'inferlab_gateway_queue_wait_seconds_count{{gen_ai_request_model="m",key="{key}"}} {count / 2}',
                  f'inferlab_gateway_queue_wait_seconds_sum{{gen_ai_request_model="m",key="{key}"}} {total / 2}']
    lines.append(f'inferlab_gateway_rejections_total{{key="a",reason="queue_timeout"}} {timeouts}')
    return "\n".join(lines)


def test_the_gateway_queue_is_the_delta_of_its_wait_histogram_over_every_series() -> None:
    from inferlab.results.telemetry import gateway_queue

    before = parse_prometheus(_gateway_page(zero=4, count=6, total=1.0))
    after = parse_prometheus(_gateway_page(zero=8, count=16, total=3.0, timeouts=2))
    q = gateway_queue(before, after)
    assert q.available and (q.admitted, q.queued) == (10, 6)  # (4 of the 10 let in at once)
    assert q.wait is not None and q.wait.mean_ms == pytest.approx(200.0) and q.queued_mean_ms == pytest.approx(2000 / 6)
    assert q.refused == {"queue_full": 0, "queue_timeout": 2} and q.scope.startswith("gateway-wide over the run")
    restarted = gateway_queue(after, before)  # (the counters went back)
    assert not restarted.available and "restart" in (restarted.reason or "")
    assert not gateway_queue(before, {}).available


def test_pages_of_one_server_are_merged_each_in_its_own_names() -> None:
    """Two engines' pages, the second an older vLLM (``gpu_cache_usage_perc``, no
    ``kv_cache_usage_perc``): counters and running summed, KV usage the largest of both
    (neither page's left out for using the other name), histograms added bound by bound."""
    older = vllm_page(kv=0.7, b1=1, b2=3, b3=3, ttft_sum=0.9).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    a = snapshot(parse_prometheus(vllm_page(running=2, kv=0.4, prompt=100, b1=2, b2=2, b3=4, ttft_sum=1.5)))
    b = snapshot(parse_prometheus(older))
    m = merge([a, b])
    assert m.values["prompt_tokens"] == 100 + 1000 and m.values["running"] == (2 + 1) + (3 + 1)
    assert m.values["kv_usage"] == 0.7 and a.values["kv_usage"] == 0.4
    h = m.histograms["ttft"]
    assert h.cumulative == (3.0, 5.0, 7.0) and h.count == 7 and h.sum == pytest.approx(2.4)
    assert m.server == "vllm" and merge([a]) is a


def test_pages_with_other_buckets_merge_to_counts_that_still_rise() -> None:
    """Two engines' (or releases') TTFT buckets differ: each page counts at a bound it
    lacks what it has at its next bound down, so the merged counts rise and the p50's
    bound is one at least half the observations are under (summing bound by bound gave
    5, 3, 8, 14 and a p50 of 1 s where 8 of 14 are at or under 0.5 s)."""
    def page(buckets: dict[str, int], total: float) -> str:
        lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {n}' for le, n in buckets.items()]
        count = buckets["+Inf"]
        return "\n".join([*lines, f"vllm:time_to_first_token_seconds_count {count}",
                          f"vllm:time_to_first_token_seconds_sum {total}"]) + "\n"

    a = snapshot(parse_prometheus(page({"0.1": 5, "1.0": 8, "+Inf": 10}, 4.0)))
    b = snapshot(parse_prometheus(page({"0.5": 3, "+Inf": 4}, 1.0)))
    h = merge([a, b]).histograms["ttft"]
    assert h.bounds == (0.1, 0.5, 1.0, math.inf) and h.cumulative == (5.0, 8.0, 11.0, 14.0)
    assert all(x <= y for x, y in zip(h.cumulative, h.cumulative[1:], strict=False))
    fresh = snapshot(parse_prometheus("vllm:prompt_tokens_total 0\n"))  # (no TTFT observed yet)
    m = server_metrics(merge([fresh, fresh]), [], merge([a, b]))
    assert m.histograms["ttft_ms"].p50_ms == 500.0 and m.histograms["ttft_ms"].count == 14


def test_a_counter_first_shown_during_the_run_counts_from_zero() -> None:
    """SGLang shows a labelled counter from its first event: absent before the run, 3
    after it is 3 over the run (as a histogram first shown is), not unknown."""
    page = 'sglang:prompt_tokens_total{model_name="m"} 900\n'
    before = snapshot(parse_prometheus(page))
    after = snapshot(parse_prometheus(page + 'sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 3\n'))
    assert "preemptions" not in before.values
    assert server_metrics(before, [], after).counters["preemptions"] == 3
    assert "preemptions" not in server_metrics(before, [], before).counters  # (never shown: not counted)


def test_a_counter_declared_with_no_sample_yet_is_zero_and_a_gauge_so_is_not_there() -> None:
    """prometheus_client writes a labelled counter's HELP and TYPE before its first event
    and no sample (SGLang's retractions): 0 so far, not missing; a gauge declared so has
    no value to read, and a counter the page does not declare is not there."""
    page = ('sglang:prompt_tokens_total{model_name="m"} 900\n'
            "# HELP sglang:num_retracted_requests Total number of retracted requests.\n"
            "# TYPE sglang:num_retracted_requests counter\n"
            "# TYPE sglang:num_running_reqs gauge\n")
    snap = snapshot(parse_prometheus(page))
    assert snap.values["preemptions"] == 0 and "running" not in snap.values
    assert "requests_finished" not in snap.values
    m = server_metrics(snap, [], snap)
    assert m.counters["preemptions"] == 0 and "preemptions" not in m.missing and "requests_finished" in m.missing
    assert parse_prometheus(page, ("sglang:prompt_tokens",)).keys() == {"sglang:prompt_tokens_total"}


def test_one_pages_label_sets_with_other_buckets_add_as_pages_do() -> None:
    """Two label sets of one histogram on one page (two engines behind one exporter) with
    other buckets: added as ``merge`` adds pages, each set's count at a bound it lacks its
    count at its next bound down (by bound they gave 5, 3, 8, 14)."""
    text = "\n".join([
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 5',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 8',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 10',
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5"} 3',
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 4',
        'vllm:time_to_first_token_seconds_count{engine="0"} 10',
        'vllm:time_to_first_token_seconds_count{engine="1"} 4',
        'vllm:time_to_first_token_seconds_sum{engine="0"} 4.0',
        'vllm:time_to_first_token_seconds_sum{engine="1"} 1.0',
    ]) + "\n"
    h = snapshot(parse_prometheus(text)).histograms["ttft"]
    assert h.bounds == (0.1, 0.5, 1.0, math.inf) and h.cumulative == (5.0, 8.0, 11.0, 14.0)
    assert (h.sum, h.count) == (5.0, 14.0)
