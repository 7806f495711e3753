"""bench against SGLang at the context, over HTTP on loopback. Its pre-run check: the server's
rule (``SGLangLimits``, the simulated SGLang's own) where bench identified SGLang, by
its model cards and ``/server_info`` (a fake in front of ``sim serve --engine-family
sglang`` that says so), or where the simulated server runs the ``sglang`` family; vLLM's
rule for a vLLM server. Its record of a stream SGLang 0.5.6-0.5.9 abort."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from inferlab import BenchConfig, ClosedLoop, LoadConfig, UsageError, WorkloadConfig, bench_async
from inferlab._errors import RunFailedError
from inferlab.results.records import ErrorKind
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

CONTEXT = 2048
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # (the simulator's default model)


@asynccontextmanager
async def sglang_server(version: str | None) -> AsyncIterator[str]:
    """``sim serve --engine-family sglang`` (of ``version``) behind a front that names it
    as SGLang does: model cards ``owned_by`` sglang, ``/server_info`` with the release and
    the context; requests go to the simulator, its own routes are not reached."""
    engine = {"engine_version": version} if version else {}
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=CONTEXT, engine_family="sglang", **engine))) as sim:
        async with aiohttp.ClientSession() as session:

            async def models(request: web.Request) -> web.Response:
                return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang"}]})

            async def server_info(request: web.Request) -> web.Response:
                return web.json_response({"version": version or "0.5.11", "context_length": CONTEXT})

            async def forward(request: web.Request) -> web.StreamResponse:
                async with session.post(sim.url + request.path, data=await request.read(),
                                        headers={"Content-Type": "application/json"}) as upstream:
                    out = web.StreamResponse(status=upstream.status,
                                             headers={"Content-Type": upstream.headers.get("Content-Type", "")})
                    await out.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await out.write(chunk)
                    await out.write_eof()
                    return out

            app = web.Application()
            app.router.add_get("/v1/models", models)
            app.router.add_get("/server_info", server_info)
            app.router.add_post("/{path:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            try:
                yield f"http://127.0.0.1:{runner.addresses[0][1]}"
            finally:
                await runner.cleanup()


def cfg(input_tokens: int, output_tokens: int, exact: bool = True, n: int = 2) -> BenchConfig:
    return BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=n), model=MODEL,
                       workload=WorkloadConfig(input_tokens=input_tokens, output_tokens=output_tokens, exact_output=exact))


async def overhead_of(url: str) -> int:
    o = (await bench_async(cfg(100, 1, n=1), url)).summary.prompt_overhead_tokens
    assert o is not None
    return o


async def test_prompt_and_output_of_the_whole_context_fit_vllm_but_not_sglang_before_0_5_11() -> None:
    """prompt + output = the context: vLLM takes it (the answer whole); SGLang 0.5.10
    refuses every such request (its tokenizer manager's ``>=``), and bench says so before
    sending; 0.5.11 takes it but ends the answer two tokens short, so an exact length
    cannot be had (refused before sending) and without one the summary says so."""
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=CONTEXT))) as vllm:
        overhead = await overhead_of(vllm.url)
        edge = cfg(CONTEXT - overhead - 40, 40)
        ran = await bench_async(edge, vllm.url)
        assert ran.summary.counts.completed == 2
        assert not [w for w in ran.summary.warnings if "context" in w], ran.summary.warnings
    async with sglang_server("0.5.10") as url:
        assert await overhead_of(url) == overhead
        for exact in (True, False):
            with pytest.raises(UsageError, match=r"\+ 40 output tokens > 2,047, the most prompt \+ max_tokens "
                                                 r"SGLang 0\.5\.10's server takes in its 2,048-token context"):
                await bench_async(cfg(CONTEXT - overhead - 40, 40, exact), url)
    async with sglang_server("0.5.11") as url:
        with pytest.raises(UsageError, match="every answer would be cut short of the exact length asked"):
            await bench_async(edge, url)
        ran = await bench_async(cfg(CONTEXT - overhead - 40, 40, exact=False, n=6), url)
        said = [w for w in ran.summary.warnings if "may not get their whole answer" in w]
        assert len(said) == 1 and "ends each answer 2 tokens short" in said[0], ran.summary.warnings
        # cut two short of the 40 asked; an answer may end sooner at its end of sequence (the
        # simulated model's length for each prompt, which the run's fresh prompts change:
        # 1 of 24 answers ended before 38 in twelve runs by hand), never later
        ends = [(r.output_tokens, r.finish_reason) for r in ran.records]
        assert all(n == 38 for n, why in ends if why == "length") and all(n < 38 for n, why in ends if why == "stop")
        assert ("length" in {why for _, why in ends}), ends


async def test_a_prompt_within_six_tokens_of_the_context_is_refused_for_sglang_alone() -> None:
    """A prompt of the context - 6 tokens (as sent) for one token: vLLM answers it; SGLang's
    scheduler refuses it, and bench says so before sending, the server's words naming it,
    for the simulated SGLang too (its engine route says its family)."""
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=CONTEXT))) as vllm:
        overhead = await overhead_of(vllm.url)
        assert (await bench_async(cfg(CONTEXT - 6 - overhead, 1), vllm.url)).summary.counts.completed == 2
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=CONTEXT, engine_family="sglang"))) as sim:
        with pytest.raises(UsageError, match=r"≥ 2,042, the shortest prompt SGLang's server refuses in its 2,048-token "
                                             r"context: every request would fail.*release unknown: 0\.5\.11's rule assumed"):
            await bench_async(cfg(CONTEXT - 6 - overhead, 1), sim.url)
        assert (await bench_async(cfg(CONTEXT - 7 - overhead, 1), sim.url)).summary.counts.completed == 2


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stream_sglang_0_5_9_aborts_is_a_failure_not_an_empty_answer(stream: bool) -> None:
    """SGLang 0.5.6-0.5.9 end a stream their scheduler refuses (a prompt within 6 tokens of
    the context) with finish_reason "abort" and no text or error event: bench records it
    failed (stream_error), as the error event of 0.5.10 on; not streamed, it is a 400."""
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=512, engine_family="sglang",
                                                  engine_version="0.5.9"))) as sim:
        config = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), model=MODEL, stream=stream,
                             preflight=False, api="completions",
                             workload=WorkloadConfig(input_tokens=508, output_tokens=1))  # (one token a word)
        with pytest.raises(RunFailedError) as failed:
            await bench_async(config, sim.url)
    records = failed.value.result.records
    assert all(r.input_tokens is None or r.input_tokens >= 506 for r in records)
    if stream:
        assert [(r.status, r.error_kind, r.finish_reason, r.error) for r in records] == [
            (200, ErrorKind.STREAM_ERROR, "abort", 'the server aborted the request (finish_reason "abort")')] * 2
    else:
        assert [(r.status, r.error_kind) for r in records] == [(400, ErrorKind.HTTP_STATUS)] * 2


async def test_bench_fails_any_answer_the_server_aborted() -> None:
    """SGLang 0.5.9's stream for a request its scheduler refused, as its
    serving_completions.py writes it (one chunk: no text, finish_reason "abort"; then the
    usage chunk and [DONE]), and a whole body ending "abort": failures, not empty answers."""
    abort = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "abort", "matched_stop": None}]}
    usage = {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}

    async def completions(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response({**abort, "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in (abort, {**abort, "choices": [], "usage": usage}):
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        for stream in (True, False):
            config = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), model=MODEL, stream=stream,
                                 preflight=False, api="completions", workload=WorkloadConfig(input_tokens=8, output_tokens=4))
            with pytest.raises(RunFailedError, match="aborted"):
                await bench_async(config, f"http://127.0.0.1:{runner.addresses[0][1]}")
    finally:
        await runner.cleanup()
