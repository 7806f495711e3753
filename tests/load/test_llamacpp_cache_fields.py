"""The prompt tokens llama.cpp's server says its cache served, read from the fields it
writes, on loopback against a fake that writes them as the real one does.

The chunks are the shape ``llama-server`` (the llama.cpp vendored in llama-cpp-python
0.3.36; ``--version``: 0.5.0-dev, fingerprint ``b0-unknown``) streamed for a chat
request with ``stream_options.include_usage``, started with its own defaults (its
``cache_prompt`` on): the usage chunk carries ``usage.prompt_tokens_details.cached_tokens``
and ``timings.cache_n``, equal (29 and 29 for a repeated 30-token prompt: llama.cpp always
computes the prompt's last token again). ``prompt_tokens_details`` came with llama.cpp's
PR 19361 (February 2026); before it, the answers said their cached tokens only as
``timings.cache_n``, and a rerun measured against the cache went unremarked.

The fake counts a prompt's words as its tokens and, like llama.cpp's slot and host
prompt caches, serves the longest prefix any earlier prompt shares with it, all but its
last token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.results.summary import FOREIGN_CACHE


class FakeLlamaServer:
    """Streams chat answers with llama.cpp's chunks; ``details``: write
    ``usage.prompt_tokens_details`` (llama.cpp since PR 19361) besides ``timings``."""

    def __init__(self, details: bool) -> None:
        self.details = details
        self.prompts: list[list[str]] = []
        self.cache_n: list[int] = []  # what each answer said, in order
        self.url = ""
        self._runner: web.AppRunner | None = None

    def _cached(self, tokens: list[str]) -> int:
        best = 0
        for old in self.prompts:
            n = 0
            while n < min(len(old), len(tokens)) and old[n] == tokens[n]:
                n += 1
            best = max(best, n)
        return min(best, len(tokens) - 1)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = " ".join(m["content"] for m in body["messages"]).split()
        cache_n = self._cached(tokens)
        self.prompts.append(tokens)
        self.cache_n.append(cache_n)
        n_out = int(body["max_tokens"])
        head = {"created": 1796622692, "id": "chatcmpl-o02qOF8Kf2Hi7LTnGIUNtKjsipbW1EJC", "model": "tiny",
                "system_fingerprint": "b0-unknown", "object": "chat.completion.chunk"}
        usage: dict[str, Any] = {"completion_tokens": n_out, "prompt_tokens": len(tokens),
                                 "total_tokens": len(tokens) + n_out}
        if self.details:
            usage["prompt_tokens_details"] = {"cached_tokens": cache_n}
        timings = {"cache_n": cache_n, "prompt_n": len(tokens) - cache_n, "prompt_ms": 0.757,
                   "prompt_per_token_ms": 0.757, "prompt_per_second": 1321.0, "predicted_n": n_out,
                   "predicted_ms": 0.439, "predicted_per_token_ms": 0.2195, "predicted_per_second": 4555.8}
        chunks = [{"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}], **head}]
        chunks += [{"choices": [{"finish_reason": None, "index": 0, "delta": {"content": " tok"}}], **head}] * n_out
        chunks.append({"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], **head})
        chunks.append({"choices": [], **head, "usage": usage, "timings": timings})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def __aenter__(self) -> FakeLlamaServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(params=[False, True], ids=["timings-only", "usage-and-timings"])
async def llama(request: pytest.FixtureRequest) -> AsyncIterator[FakeLlamaServer]:
    async with FakeLlamaServer(details=request.param) as server:
        yield server


def config(**workload: Any) -> BenchConfig:
    return BenchConfig(LoadConfig(ClosedLoop(1), num_requests=6), WorkloadConfig(output_tokens=2, **workload),
                       preflight=False, server_metrics=False)


async def test_the_same_prompt_every_request_is_counted_and_called_out(llama: FakeLlamaServer) -> None:
    fixed = await bench_async(config(prompt=" ".join(f"word{i}" for i in range(120))), llama.url)
    assert fixed.summary.cached_tokens == sum(llama.cache_n) > 0  # (what the answers said, summed)
    assert any("every request sent the same prompt" in w for w in fixed.summary.warnings)


async def test_a_rerun_with_the_same_salt_is_called_out_and_a_fresh_run_is_not(llama: FakeLlamaServer) -> None:
    await bench_async(config(input_tokens=200, prompt_salt="again"), llama.url)
    said = len(llama.cache_n)
    again = await bench_async(config(input_tokens=200, prompt_salt="again"), llama.url)
    assert again.summary.cached_tokens == sum(llama.cache_n[said:]) > 0
    assert any(FOREIGN_CACHE in w for w in again.summary.warnings)
    said = len(llama.cache_n)
    fresh = await bench_async(config(input_tokens=200, prompt_salt="other"), llama.url)  # (as a run without --seed)
    assert fresh.summary.cached_tokens == sum(llama.cache_n[said:])  # (known: not None)
    assert fresh.summary.cached_tokens is not None
    assert not any("prefix cache" in w for w in fresh.summary.warnings)
