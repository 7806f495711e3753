"""``inferlab bench``'s library call against a real engine: llama.cpp's ``llama-server``
serving the tiny generated model on loopback (``conftest.py``).

What a real server says is checked against what was asked: exact usage counts (every
request generates exactly ``max_tokens`` printable tokens, one content chunk each), exact
prompt lengths through its ``/tokenize``, its ``/metrics`` counters, its prompt cache,
its batching, its context limit and its connection handling. Timings are compared only
as orderings and ratios within one run, never against absolute numbers. Every run is
bounded in requests and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import time
import urllib.request
from typing import Any

import aiohttp
import pytest

from inferlab import (
    ClosedLoop,
    ErrorKind,
    HttpTarget,
    LoadConfig,
    RequestRecord,
    RunConfig,
    RunFailedError,
    RunResult,
    UsageError,
    WallClock,
    WorkloadConfig,
    request_metrics,
    run,
)
from inferlab.client.http import Client, Endpoint, session_trace
from inferlab.client.preflight import EXACT_LOCAL, EXACT_SERVER
from inferlab.engines.llamacpp import LlamaServer
from inferlab.engines.tinymodel import TinyModel
from inferlab.openai.request import Api
from inferlab.workload.spec import RequestSpec

pytestmark = [pytest.mark.engines, pytest.mark.slow]

RUN_LIMIT_S = 180.0  # any one run, whole: a hung server fails the test, it does not hang it
REQUEST_TIMEOUT_S = 60.0


def bench(
    server: LlamaServer, *, n: int, c: int, api: Api = "chat", preflight: bool = True, **workload: Any
) -> RunResult:
    """``n`` requests from ``c`` closed-loop users against ``server``, as ``inferlab
    bench --url`` runs them."""
    config = RunConfig(load=LoadConfig(ClosedLoop(c), num_requests=n), workload=WorkloadConfig(**workload), api=api)
    target = HttpTarget(url=server.url, timeout_s=REQUEST_TIMEOUT_S, idle_timeout_s=30.0, preflight=preflight)

    async def go() -> RunResult:
        async with asyncio.timeout(RUN_LIMIT_S):
            return await run(config, target)

    return asyncio.run(go())


def ttft_ms(r: RequestRecord) -> float:
    value = request_metrics(r).ttft_ms
    assert value is not None, r
    return value


def metrics(server: LlamaServer) -> dict[str, float]:
    """The server's Prometheus counters and gauges (``llamacpp:`` prefix dropped)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^llamacpp:(\w+) (\S+)$", text, re.M)}


def test_the_server_runs_in_a_group_of_its_own_in_the_clients_session(llama: LlamaServer) -> None:
    # killpg stops it all; a session of its own let Linux's autogroup scheduling keep a
    # busy engine's session on the CPU and the measuring client off it for seconds
    assert llama._proc is not None
    pid = llama._proc.pid
    assert os.getpgid(pid) == pid != os.getpgid(0)
    assert os.getsid(pid) == os.getsid(0)


# --- counts and lengths ---------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_usage_counts_match_what_was_asked_with_exact_lengths_from_tokenize(llama: LlamaServer, api: Api) -> None:
    """The trial that found the stale keep-alive bug: 1,024-token prompts at concurrency
    4, all 16 complete, with exact lengths."""
    result = bench(llama, n=16, c=4, api=api, input_tokens=1024, output_tokens=16)
    s = result.summary
    assert s.counts.completed == 16 and s.counts.failed == 0
    assert s.input_length_source == EXACT_SERVER  # (was: approximate, calibrated from usage)
    overhead = s.prompt_overhead_tokens
    assert overhead is not None and (overhead > 0) == (api == "chat")  # the chat template's tokens
    for r in result.records:
        assert (r.requested_input_tokens, r.requested_output_tokens) == (1024, 16)
        assert r.input_tokens == 1024 + overhead
        assert r.output_tokens == 16 == len(r.content_ns)  # one printable token per chunk
        assert r.finish_reason == "length" and r.usage_source == "server"
    # the run records the server as llama.cpp, with its /props build_info as its release
    # (a build from the PyPI sdist has no git: llama.cpp writes b0-unknown)
    said = s.config["resolved"]["server_software"]
    assert (said["name"], said["source"]) == ("llama.cpp", "GET /props") and said["version"]
    # and its slots and a slot's context, as it was started (-np 8, -c 16384 shared by them)
    assert said["settings"] == {"max_num_seqs": llama.slots, "max_model_len": llama.ctx_tokens // llama.slots}
    assert s.server.software == f"llama.cpp {said['version']}" and not s.server.simulated


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_models_own_tokenizer_json_gives_exact_lengths_locally(
    llama: LlamaServer, tiny: TinyModel, api: Api
) -> None:
    """The generated tokenizer.json is the GGUF's vocabulary: the preflight accepts it
    as the server's (its count of the probe equals /tokenize's), and on the completions
    API the prompts go as token ids."""
    result = bench(llama, n=4, c=2, api=api, input_tokens=300, output_tokens=4, tokenizer=str(tiny.tokenizer))
    s = result.summary
    assert s.input_length_source == EXACT_LOCAL
    overhead = s.prompt_overhead_tokens
    assert overhead is not None
    assert [r.input_tokens for r in result.records] == [300 + overhead] * 4
    assert [r.output_tokens for r in result.records] == [4] * 4


def test_metrics_counters_match_the_runs_usage(llama: LlamaServer) -> None:
    """/metrics before and after a run (no preflight, so the run's requests are all the
    server saw): prompt tokens (computed plus cached), cached tokens and generated
    tokens equal the sums of the records' usage."""
    before = metrics(llama)
    result = bench(llama, n=6, c=3, preflight=False, input_tokens=120, output_tokens=10)
    after = metrics(llama)
    records = result.records
    assert all(r.ok for r in records)

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert delta("prompt_tokens_total") + delta("prompt_tokens_cached_total") == sum(r.input_tokens or 0 for r in records)
    assert delta("prompt_tokens_cached_total") == sum(r.cached_tokens or 0 for r in records)
    assert delta("tokens_predicted_total") == sum(r.output_tokens or 0 for r in records) == 60


# --- latency shapes -------------------------------------------------------------------------


def test_ttft_grows_with_prompt_length(llama: LlamaServer) -> None:
    lengths = (32, 512, 1536)
    medians = [
        statistics.median(ttft_ms(r) for r in bench(llama, n=3, c=1, input_tokens=n, output_tokens=2).records)
        for n in lengths
    ]
    assert medians == sorted(medians), dict(zip(lengths, medians, strict=True))
    # 48x the prompt: the prefill dominates, whatever the machine's speed
    assert medians[2] > 4 * medians[0], dict(zip(lengths, medians, strict=True))


def test_a_repeated_prefix_is_served_from_the_prompt_cache(llama: LlamaServer) -> None:
    """One shared 1,024-token prefix (fresh for this run), four requests in turn: the
    first computes it, the others find it cached and answer sooner."""
    result = bench(llama, n=4, c=1, prefix_groups=1, prefix_tokens=1024, suffix_tokens=16, output_tokens=2)
    first, *rest = sorted(result.records, key=lambda r: r.index)
    assert first.cached_tokens is not None and first.cached_tokens < 1024
    for r in rest:
        assert r.cached_tokens is not None and r.cached_tokens >= 1024
        assert ttft_ms(r) < 0.5 * ttft_ms(first), (ttft_ms(first), [ttft_ms(x) for x in rest])


def test_a_fixed_prompt_given_a_salt_is_cached_on_the_second_run(llama: LlamaServer) -> None:
    """A run's prompts are salted afresh unless a salt is given: with the same salt, a
    second run repeats the first run's prompt and the server's cache serves it."""
    salt = f"cache-{time.monotonic_ns()}"  # (unique: earlier runs on this server used other prompts)
    runs = [bench(llama, n=1, c=1, input_tokens=800, output_tokens=2, prompt_salt=salt).records[0] for _ in range(2)]
    assert runs[0].cached_tokens is not None and runs[0].cached_tokens < 800
    assert runs[1].cached_tokens is not None and runs[1].cached_tokens >= 800
    assert ttft_ms(runs[1]) < 0.5 * ttft_ms(runs[0])


def test_its_timings_cache_n_is_its_usages_cached_tokens(llama: LlamaServer) -> None:
    """llama.cpp writes its cached prompt tokens twice, ``usage.prompt_tokens_details``
    and ``timings.cache_n``; older releases wrote only the second, which is read where the
    first is missing (``ResponseReader``): the two must mean the same."""
    body = json.dumps({"messages": [{"role": "user", "content": f"cache-n {time.monotonic_ns()} " + "word " * 60}],
                       "max_tokens": 2}).encode()
    said = []
    for _ in range(2):
        req = urllib.request.Request(llama.url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            answer = json.load(resp)
        said.append((answer["usage"]["prompt_tokens_details"]["cached_tokens"], answer["timings"]["cache_n"]))
    (first, first_n), (second, second_n) = said
    assert first == first_n and second == second_n and second > first, said


def test_a_rerun_of_the_same_prompts_is_called_out_and_a_fresh_one_is_not(llama: LlamaServer) -> None:
    """The summary's warning, from the server's own counts: the same salt again (a
    rerun with --seed) hit the prompt cache; another salt (a rerun without) did not;
    bench's default prompt, the same every request, did."""
    salt = f"rerun-{time.monotonic_ns()}"
    first = bench(llama, n=4, c=2, input_tokens=300, output_tokens=2, prompt_salt=salt).summary
    again = bench(llama, n=4, c=2, input_tokens=300, output_tokens=2, prompt_salt=salt).summary
    fresh = bench(llama, n=4, c=2, input_tokens=300, output_tokens=2, prompt_salt=salt + "-other").summary
    assert not any("prefix cache" in w for w in first.warnings + fresh.warnings), (first.warnings, fresh.warnings)
    assert any("though this run's prompts share no prefix" in w for w in again.warnings), again.warnings
    assert again.cached_tokens is not None and again.input_tokens is not None
    assert again.cached_tokens > again.input_tokens / 2
    assert fresh.cached_tokens is not None and fresh.input_tokens is not None
    assert fresh.cached_tokens < fresh.input_tokens / 10
    fixed = bench(llama, n=4, c=2, output_tokens=2).summary  # (bench's default: one prompt every time)
    assert any("every request sent the same prompt" in w for w in fixed.warnings), fixed.warnings


def test_concurrent_streams_are_batched(llama: LlamaServer) -> None:
    """Four streams at once are decoded together: they overlap in time (each one's
    first token comes before any one's last, so none waited for another to finish),
    and the engine needs about one decode call per step for all four (its
    n_decode_total), not one per stream.

    (On one CPU thread a step of four sequences costs about four of one: the tiny model
    is compute-bound, so batching shows in the overlap and the decode calls, not in a
    shorter total time.) Streams of 512 tokens last long enough that a late dispatch
    on a busy machine does not undo the overlap."""
    OUT = 512
    before = metrics(llama)
    together = bench(llama, n=4, c=4, preflight=False, input_tokens=16, output_tokens=OUT).records
    after = metrics(llama)
    assert all(r.ok and r.output_tokens == OUT for r in together)
    last_first_token = max(r.content_ns[0] for r in together)
    first_end = min(r.end_ns or 0 for r in together)
    # all four were streaming at once: nobody queued behind a whole stream (compared
    # within one run, not with an earlier one, which a busy machine makes noisy)
    assert last_first_token < first_end
    decodes = after["n_decode_total"] - before["n_decode_total"]
    predicted = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert predicted == 4 * OUT
    assert decodes < predicted / 2, (decodes, predicted)  # unbatched: one call per token each


# --- errors and connections -----------------------------------------------------------------


def test_a_prompt_beyond_the_context_is_a_clean_error_record(llama: LlamaServer) -> None:
    # bench knows the slot's context (the server states it) and the prompt's exact length
    # (its /tokenize): it refuses before sending
    with pytest.raises(UsageError, match="every request would fail"):
        bench(llama, n=2, c=1, input_tokens=llama.ctx_tokens // llama.slots + 500, output_tokens=4)
    # sent all the same (no preflight), the server's refusal is a clean error record
    with pytest.raises(RunFailedError) as info:
        bench(llama, n=2, c=1, preflight=False, input_tokens=llama.ctx_tokens // llama.slots + 500, output_tokens=4)
    result = info.value.result
    assert isinstance(result, RunResult)
    for r in result.records:
        assert (r.error_kind, r.status) == (ErrorKind.HTTP_STATUS, 400)
        assert r.error is not None and "context" in r.error, r.error
    # the server is unharmed: the next run completes
    assert bench(llama, n=1, c=1, input_tokens=32, output_tokens=4).summary.counts.completed == 1


async def _send_all(client: Client, n: int, spec: RequestSpec) -> list[RequestRecord]:
    records = [RequestRecord(index=i) for i in range(n)]
    await asyncio.gather(*(client.send(spec, r) for r in records))
    return records


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_idle_connections_past_the_keep_alive_timeout_fail_no_request(llama: LlamaServer, stream: bool) -> None:
    """Two requests, then the pooled connections idle past the server's 5 s keep-alive
    (``Keep-Alive: timeout=5, max=100``), then two more on the same session. (Streamed,
    llama-server also closes each connection after its response, while saying
    keep-alive: every reuse races its close.)"""
    spec = RequestSpec(prompt="hello there", max_tokens=4)

    async def go() -> list[RequestRecord]:
        async with asyncio.timeout(60), aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trace_configs=[session_trace()]
        ) as session:
            clock = WallClock()
            endpoint = Endpoint(base_url=llama.url + "/v1", model="m", stream=stream, timeout_s=REQUEST_TIMEOUT_S)
            client = Client(endpoint, clock, session, clock.now_ns())
            first = await _send_all(client, 2, spec)
            await asyncio.sleep(5.5)
            return first + await _send_all(client, 2, spec)

    records = asyncio.run(go())
    assert [(r.error_kind, r.error) for r in records] == [(None, None)] * 4
    assert [r.output_tokens for r in records] == [4] * 4


def test_more_requests_than_the_servers_keep_alive_max_over_one_connection(llama: LlamaServer) -> None:
    """105 requests in turn over a one-connection pool: the server ends the connection
    after its 100th request (``max=100``), and the next ones go on a new one."""
    spec = RequestSpec(prompt="hi", max_tokens=1)
    created = 0

    async def on_create(*_: object) -> None:
        nonlocal created
        created += 1

    trace = session_trace()
    trace.on_connection_create_end.append(on_create)

    async def go() -> list[RequestRecord]:
        async with asyncio.timeout(120), aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace]
        ) as session:
            clock = WallClock()
            endpoint = Endpoint(base_url=llama.url + "/v1", model="m", stream=False, timeout_s=REQUEST_TIMEOUT_S)
            client = Client(endpoint, clock, session, clock.now_ns())
            records = []
            for i in range(105):
                records.append(RequestRecord(index=i))
                await client.send(spec, records[-1])
            return records

    records = asyncio.run(go())
    assert [r.error for r in records if not r.ok] == []
    assert created >= 2  # the server's max was reached, and the client went on
