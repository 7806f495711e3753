"""The preflight probe: fail fast on refused requests, drop fields a strict server
rejects, measure the chat-template overhead, and make prompt lengths exact through the
server's /tokenize (or calibrate them from usage when it has none)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from inferlab import BenchConfig, ClosedLoop, LoadConfig, UsageError, WorkloadConfig, bench_async
from inferlab._errors import RunFailedError
from inferlab.client.exchange import Endpoint
from inferlab.client.preflight import (
    APPROX_USAGE,
    EXACT_LOCAL,
    EXACT_SERVER,
    NO_FORCE_WARNING,
    ContextRule,
    Preflight,
    context_fit,
    requests_fit,
)
from inferlab.load.schedules import Replay
from inferlab.results.summary import Summary
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.datasets import DatasetConfig
from inferlab.workload.spec import RequestSpec
from inferlab.workload.traces import TraceConfig

KNOWN = {"model", "messages", "prompt", "max_tokens", "stream", "stream_options"}
TEMPLATE_TOKENS = 5  # what the strict server's "chat template" adds
TOKENS_PER_WORD = 2  # its tokenizer: every word is two tokens


class StrictServer:
    """An OpenAI-like server that rejects unknown fields with 422 (like a strict
    gateway), needs ``Bearer good``, serves one model, and has no /tokenize."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if request.headers.get("Authorization") != "Bearer good":
            return web.json_response({"error": {"message": "Invalid API key"}}, status=401)
        if body.get("model") != "m":
            return web.json_response({"error": {"message": f"model {body.get('model')} not found"}}, status=404)
        extra = set(body) - KNOWN
        if extra:
            return web.json_response({"detail": f"extra fields not permitted: {sorted(extra)}"}, status=422)
        text = " ".join(str(m["content"]) for m in body["messages"])
        usage = {"prompt_tokens": TOKENS_PER_WORD * len(text.split()) + TEMPLATE_TOKENS,
                 "completion_tokens": 2, "total_tokens": 0}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("a", "b"):
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})


@pytest.fixture
async def strict() -> AsyncIterator[StrictServer]:
    srv = StrictServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", srv.chat)
    app.router.add_get("/v1/models", srv.models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield srv
    await runner.cleanup()


def config(n: int = 6, key: str = "good", model: str = "m", **wl: Any) -> BenchConfig:
    return BenchConfig(
        load=LoadConfig(ClosedLoop(2), num_requests=n), workload=WorkloadConfig(**wl),
        model=model, api_key=key,
    )


@pytest.mark.parametrize(("key", "model", "needle"), [("bad", "m", "Invalid API key"), ("good", "x", "model x not found")])
async def test_a_refused_request_fails_fast_with_the_servers_message(
    strict: StrictServer, key: str, model: str, needle: str
) -> None:
    with pytest.raises(UsageError, match=needle):
        await bench_async(config(50, key, model, input_tokens=20, output_tokens=2), strict.url)
    assert len(strict.requests) == 1  # the probe only, not 50 doomed requests


async def test_rejected_exact_output_fields_are_dropped_and_lengths_calibrated(strict: StrictServer) -> None:
    s = (await bench_async(config(input_tokens=100, output_tokens=2), strict.url)).summary
    assert s.counts.completed == 6 and s.counts.failed == 0
    assert NO_FORCE_WARNING in s.warnings
    run = strict.requests[-6:]
    assert all("ignore_eos" not in b and "min_tokens" not in b for b in run)
    # no /tokenize: two probes give tokens per word and the template overhead
    assert s.input_length_source == APPROX_USAGE
    assert s.prompt_overhead_tokens == TEMPLATE_TOKENS
    assert isinstance(s.preflight, dict) and s.preflight["tokens_per_word"] == TOKENS_PER_WORD
    # calibrated: 50 words of 2 tokens, plus the template
    assert s.input_tokens == 6 * (100 + TEMPLATE_TOKENS)


async def test_without_preflight_nothing_is_probed(strict: StrictServer) -> None:
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), workload=WorkloadConfig(input_tokens=10),
                      model="m", api_key="good", preflight=False)
    s = (await bench_async(cfg, strict.url)).summary
    assert len(strict.requests) == 2 and s.prompt_overhead_tokens is None


async def test_against_the_sim_template_overhead_and_exact_lengths() -> None:
    with EmbeddedServer(ServerConfig(EngineConfig())) as sim:
        cfg = BenchConfig(load=LoadConfig(ClosedLoop(2), num_requests=4),
                          workload=WorkloadConfig(input_tokens=100, output_tokens=3))
        result = await bench_async(cfg, sim.url)
    s = result.summary
    tok = BuiltinTokenizer()
    text = "some words"
    expected = len(tok.apply_chat_template(RequestSpec(text).messages())) - len(tok.encode(text))
    assert s.prompt_overhead_tokens == expected > 0
    assert s.input_length_source == EXACT_SERVER
    assert [r.input_tokens for r in result.records] == [100 + expected] * 4
    # no warning about lengths or the template (client timing depends on the machine's load)
    assert [w for w in s.warnings if "fell behind" not in w and "client was likely the bottleneck" not in w] == []


async def test_prompts_and_answers_that_cannot_fit_the_stated_context_are_caught_before_sending() -> None:
    """runs/long3: 2,000-token prompts (2,010 with the template) for 100 tokens on a
    2,048-token server. With exact output every request failed on the server ("min_tokens
    must be less than or equal to max_tokens=38"); knowing the context (the model card's
    max_model_len) and the exact prompt length (/tokenize), bench refuses before sending.
    Without exact output it runs, and the summary says what the context will do."""
    def cfg(exact: bool, output_tokens: int = 100) -> BenchConfig:
        return BenchConfig(load=LoadConfig(ClosedLoop(2), num_requests=4),
                           workload=WorkloadConfig(input_tokens=2000, output_tokens=output_tokens, exact_output=exact))

    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=2048))) as sim:
        with pytest.raises(UsageError) as refused:
            await bench_async(cfg(True), sim.url)
        overhead = (await bench_async(cfg(True, output_tokens=1), sim.url)).summary.prompt_overhead_tokens
        assert overhead is not None
        assert f"prompt {2000 + overhead:,} + 100 output tokens > the server's 2,048-token context" in str(refused.value)
        # (the simulated server answers them cut to what the context leaves, as vLLM 0.32)
        ran = await bench_async(cfg(False), sim.url)
    said = f"prompt {2000 + overhead:,} + 100 output tokens > the server's 2,048-token context"
    assert any(w.startswith(said) for w in ran.summary.warnings), ran.summary.warnings
    assert ran.summary.counts.completed == 4
    assert all(r.output_tokens is not None and r.input_tokens is not None and r.output_tokens <= 2048 - r.input_tokens
               for r in ran.records)
    # (refused by vLLM before 0.32)
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=2048, engine_version="0.31"))) as old, \
            pytest.raises(RunFailedError) as failed:
        await bench_async(cfg(False), old.url)
    summary = failed.value.summary
    assert isinstance(summary, Summary)
    assert any(w.startswith(said) for w in summary.warnings), summary.warnings


async def test_lengths_of_which_only_some_overflow_the_context_run_with_their_share_said() -> None:
    """Only the whole run is refused before sending, where every request would fail: a
    drawn range of which part overflows runs (its overflowing requests fail or are cut,
    recorded), and the summary says about how many; a prompt alone over the context is
    refused with exact output or without."""
    def cfg(input_tokens: str, output_tokens: str, exact: bool = True) -> BenchConfig:
        return BenchConfig(load=LoadConfig(ClosedLoop(2), num_requests=4),
                           workload=WorkloadConfig(input_tokens=input_tokens, output_tokens=output_tokens, exact_output=exact))

    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=2048))) as sim:
        overhead = (await bench_async(cfg("100", "1"), sim.url)).summary.prompt_overhead_tokens
        assert overhead is not None
        # prompts 100..2,100 (as sent, + overhead) for 48 tokens: those over 2,000 - overhead do not fit
        try:
            result = await bench_async(cfg("uniform:100:2100", "48"), sim.url)
            warnings = result.summary.warnings
        except RunFailedError as e:  # (every drawn request may fail in a run this small)
            assert isinstance(e.summary, Summary)
            warnings = e.summary.warnings
        over = [w for w in warnings if "-token context" in w]
        share = (2100 + overhead + 48 - 2048) / (2100 - 100 + 1)
        assert len(over) == 1 and f"about {share:.0%} of requests may not fit" in over[0], warnings
        for exact in (True, False):
            with pytest.raises(UsageError, match=r"tokens \(as sent\) ≥ the server's 2,048-token context: every request would fail"):
                await bench_async(cfg("2100", "4", exact), sim.url)



def test_unbounded_and_empirical_lengths_are_checked_against_the_context_with_their_share(tmp_path: Path) -> None:
    """normal:, lognormal: and empirical: lengths were not checked against the context at
    all ("no upper bound"): a run of which part overflows now says about how much (the
    share from the draws' definition: a length is round(X) held to at least 1, so a
    prompt over P tokens is X >= P + 0.5), and one where no request can fit is refused."""
    pre = Preflight(prompt_overhead_tokens=10, input_length_source=EXACT_LOCAL)

    def fit(inputs: str, outputs: str, exact: bool = True) -> str | None:
        return context_fit(WorkloadConfig(input_tokens=inputs, output_tokens=outputs, exact_output=exact), pre, 2048)

    def above(z: float) -> float:  # (the standard normal's upper tail)
        return 0.5 * (1 - math.erf(z / math.sqrt(2)))

    room = 2048 - 10 - 200  # (a prompt's own tokens that fit beside 200 output tokens)
    for inputs, share in (("normal:1500:300", above((room + 0.5 - 1500) / 300)),
                          ("lognormal:1000:0.5", above((math.log(room + 0.5) - math.log(1000)) / 0.5))):
        said = fit(inputs, "200")
        assert said is not None and 0.05 < share < 0.95
        assert f"about {share:.0%} of requests may not fit" in said, said
    said = fit("1000", "normal:900:100", exact=False)  # (the output drawn)
    share = above((2048 - 10 - 1000 + 0.5 - 900) / 100)
    assert said is not None and f"about {share:.0%} of requests may not fit; the server cuts" in said, said
    assert fit("normal:100:10", "lognormal:50:0.2") is None  # (fits by hundreds of standard deviations)
    # empirical: a dataset's prompts of 100, 200, ... 2,000 words (a word a token), counted
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(["w"] * 100 * k)}) + "\n" for k in range(1, 21)))
    said = fit(f"empirical:{data}", "100")
    over = sum(100 * k + 10 + 100 > 2048 for k in range(1, 21)) / 20
    assert said is not None and f"about {over:.0%} of requests may not fit" in said, said
    # with answers' lengths too: each request one row's pair
    data.write_text("".join(json.dumps({"prompt": " ".join(["w"] * 100 * k), "max_tokens": 40 * k}) + "\n"
                            for k in range(1, 21)))
    said = fit(f"empirical:{data}", f"empirical:{data}")
    over = sum(100 * k + 10 + 40 * k > 2048 for k in range(1, 21)) / 20
    assert said is not None and f"about {over:.0%} of requests may not fit" in said, said
    data.write_text("".join(json.dumps({"prompt": " ".join(["w"] * (2040 + k))}) + "\n" for k in range(5)))
    for exact in (True, False):  # (no prompt of it fits alone)
        with pytest.raises(UsageError, match="every request would fail"):
            fit(f"empirical:{data}", "normal:50:5", exact)


def test_prompts_alone_at_the_context_are_said_in_the_servers_words_not_another_engines() -> None:
    """Prompts whose answers are not asked for (a dataset's rows): the warning names the
    limit of the server's own rule; for any server not known to be SGLang that is its
    context (it said "vLLM's limit" of a llama.cpp or any other server)."""
    from inferlab.openai.context import SGLangLimits

    pre = Preflight(prompt_overhead_tokens=10, input_length_source=EXACT_LOCAL)
    rows = [(2040, None), (100, None), (200, None), (300, None)]
    said = requests_fit(rows, False, pre, 2048, "rows.jsonl")
    assert said is not None and "can reach the server's 2,048-token context" in said, said
    assert "vLLM" not in said and "about 25% of requests may not fit" in said, said
    sglang = ContextRule.sglang(SGLangLimits(2048, None, (0, 5, 11)), "0.5.11")  # (it refuses C - 6 tokens on)
    said = requests_fit(rows, False, pre, sglang, "rows.jsonl")
    assert said is not None and "can reach SGLang 0.5.11's limit of 2,042 prompt tokens" in said, said


class LlamaLikeServer:
    """What llama.cpp's ``llama-server`` does that the preflight must survive: its
    ``/tokenize`` reads only ``{"content": ...}`` (any other body counts no tokens), and
    it closes the connection after every streamed response while its headers say
    keep-alive. Here the close is made deterministic: a request sent on a connection
    that carried a stream is dropped unanswered (the client lost the race with the
    server's close). Its tokenizer: one token per word."""

    def __init__(self) -> None:
        self.url = ""
        self.dropped = 0
        self._streamed: set[object] = set()  # peers whose connection carried a stream

    @web.middleware
    async def close_after_stream(self, request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        peer = request.transport.get_extra_info("peername")
        if peer in self._streamed:
            self._streamed.discard(peer)
            self.dropped += 1
            request.transport.close()
            raise asyncio.CancelledError
        resp: web.StreamResponse = await handler(request)
        if resp.content_type == "text/event-stream":
            self._streamed.add(peer)
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body["content"]).split() if "content" in body else []
        return web.json_response({"tokens": list(range(len(words)))})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = " ".join(str(m["content"]) for m in body["messages"])
        usage = {"prompt_tokens": len(text.split()) + TEMPLATE_TOKENS, "completion_tokens": 2, "total_tokens": 0}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Keep-Alive": "timeout=5, max=100"})
        await resp.prepare(request)
        for piece in ("a", "b"):
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def llamalike() -> AsyncIterator[LlamaLikeServer]:
    srv = LlamaLikeServer()
    app = web.Application(middlewares=[srv.close_after_stream])
    app.router.add_post("/v1/chat/completions", srv.chat)
    app.router.add_post("/tokenize", srv.tokenize)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield srv
    await runner.cleanup()


async def test_a_count_survives_several_pooled_connections_the_server_closed() -> None:
    """llama-server closes idle keep-alive connections (after 5 s) too: after counts made
    several at a time the pool holds several it closed, and a count that met two of them
    in a row was lost (a CI run's lengths fell back to approximate). Here every request on
    a connection that already carried one is dropped unanswered, as on such a connection:
    the count is tried again on a new connection and comes; a server that answers nothing
    gets two tries, not one per pooled connection."""
    import aiohttp

    from inferlab.client.preflight import TokenizeRoute

    served: set[object] = set()  # connections that carried an answer: "closed" by the server
    dropped = [0]
    drop_all = [False]

    @web.middleware
    async def stale(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        if request.transport in served or drop_all[0]:
            dropped[0] += 1
            request.transport.close()
            raise asyncio.CancelledError
        served.add(request.transport)
        return await handler(request)

    async def tokenize(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)  # (the four counts below overlap: four connections in the pool)
        return web.json_response({"tokens": str((await request.json())["prompt"]).split()})

    app = web.Application(middlewares=[stale])
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}", "m", "completions")
        async with aiohttp.ClientSession() as session:
            route = TokenizeRoute(session, endpoint, concurrency=4)
            assert await asyncio.gather(*(route.count(f"w{i} x") for i in range(4))) == [2] * 4
            assert dropped == [0]
            for _ in range(3):  # (each meets a pooled connection the server closed, then a new one)
                assert await route.count("three words here") == 3
            assert dropped[0] >= 1
            drop_all[0], before = True, dropped[0]
            assert await route.count("three words here") is None and dropped[0] - before == 2
    finally:
        await runner.cleanup()


async def test_llama_cpp_s_tokenize_makes_lengths_exact_despite_its_closed_connections(
    llamalike: LlamaLikeServer,
) -> None:
    """The probe's stream leaves a connection the server has closed in the pool; the
    next /tokenize on it failed, and the preflight fell back to calibrated lengths (the
    issue). Now the count is retried, and requests that hit such a connection are
    resent: lengths are exact and no request fails."""
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(2), num_requests=6), model="m",
                      workload=WorkloadConfig(input_tokens=40, output_tokens=2))
    result = await bench_async(cfg, llamalike.url)
    s = result.summary
    assert llamalike.dropped > 0  # the fault happened
    assert s.counts.completed == 6 and s.counts.failed == 0
    assert s.input_length_source == EXACT_SERVER
    assert s.prompt_overhead_tokens == TEMPLATE_TOKENS
    assert [r.input_tokens for r in result.records] == [40 + TEMPLATE_TOKENS] * 6


async def test_a_prompt_alone_over_the_context_is_refused_before_sending_whatever_the_workload(tmp_path: Path) -> None:
    """A prompt alone at or over the context fails whatever the output setting: such a
    run was sent (every request an HTTP 400) where no --output-tokens was given, and for
    shared prefixes, sessions, datasets and traces at all. Now each is refused before
    sending where its prompt lengths are known; a dataset of which only part is too
    long runs, with the share said."""
    long_row = " ".join(["the"] * 3000)  # (3,000 tokens or more: "the" is one token)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": long_row}) + "\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0, "input_tokens": 3000, "output_tokens": 3}) + "\n")
    refused = {
        "synthetic": WorkloadConfig(input_tokens=2100),
        "shared prefixes": WorkloadConfig(prefix_tokens=2000, suffix_tokens=100),
        "sessions": WorkloadConfig(sessions=1, turns=1, input_tokens=2100),
        "dataset": WorkloadConfig(dataset=DatasetConfig(str(data))),
        "trace": WorkloadConfig(trace=TraceConfig(str(trace))),
    }
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=2048))) as sim:
        for name, wcfg in refused.items():
            load = Replay() if wcfg.trace is not None else ClosedLoop(1)
            with pytest.raises(UsageError, match="≥ the server's 2,048-token context: every request would fail"):
                await bench_async(BenchConfig(load=LoadConfig(load, num_requests=1), workload=wcfg), sim.url)
                pytest.fail(f"{name}: not refused")
        data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (long_row, "a short one", "and another", "hi")))
        result = await bench_async(BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=3),
                                               workload=WorkloadConfig(dataset=DatasetConfig(str(data)))), sim.url)
    over = [w for w in result.summary.warnings if "2,048-token context" in w]
    assert len(over) == 1 and "about 25% of requests may not fit" in over[0], result.summary.warnings


async def test_prompt_counts_leave_no_idle_connection_holding_a_server_thread() -> None:
    """llama-server answers HTTP on a few threads, each holding a keep-alive connection
    until the client closes it (or 5 s idle). Counts sent many at once on pooled
    connections kept those threads idle while the other counts waited behind them: a
    bench's first requests stalled 5 s. Here a server of two such threads: the counts
    come, none waits for a thread an idle connection holds."""
    from inferlab.client.preflight import count_prompts

    threads = asyncio.Semaphore(2)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with threads:  # (held for the connection's life, as a llama-server thread)
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                length = int(head.split("content-length:")[1].split("\r\n")[0])
                body = json.loads(await reader.readexactly(length))
                answer = json.dumps({"tokens": str(body.get("prompt", body.get("content", ""))).split()}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(answer) + answer)
                await writer.drain()
                if "connection: close" in head:
                    break
        writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "m", "completions")
        specs = [RequestSpec(f"w{i} two three") for i in range(6)]
        counts = await asyncio.wait_for(count_prompts(endpoint, specs), 10)  # (a hang guard: the old pool hung 30 s)
        assert counts == [len(str(s.completion_prompt()).split()) for s in specs]
    finally:
        server.close()
