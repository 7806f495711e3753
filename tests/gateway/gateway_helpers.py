"""Helpers for the gateway's tests: a gateway on a free loopback port in the test's
event loop, and a client that reads its streams with the project's SSE parser."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from inferlab._clock import Clock
from inferlab.gateway.app import Gateway, start
from inferlab.gateway.config import GatewayConfig
from inferlab.openai.sse import SSEParser


@contextlib.asynccontextmanager
async def serving(config: GatewayConfig, clock: Clock | None = None) -> AsyncIterator[tuple[str, Gateway]]:
    gw = Gateway(config, clock)
    runner, port = await start(gw, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", gw
    finally:
        await runner.cleanup()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    reads: list[bytes] = field(default_factory=list)  # the body as the client's reads got it
    events: list[str] = field(default_factory=list)  # SSE data payloads, [DONE] included

    @property
    def body(self) -> bytes:
        return b"".join(self.reads)

    def json(self) -> Any:
        return json.loads(self.body)

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    def replays(self, first: Answer) -> bool:
        """Whether this stream is ``first``'s replayed (from the cache) under an id of its
        own: one id through it, not ``first``'s, and every event as ``first``'s otherwise."""
        (rid,) = {o["id"] for o in self.objects()}
        (old,) = {o["id"] for o in first.objects()}
        return rid != old and [e.replace(rid, old) for e in self.events] == first.events

    def text(self) -> str:
        out = []
        for o in self.objects():
            for c in o.get("choices", []):
                out.append((c.get("delta") or {}).get("content") or c.get("text") or "")
        return "".join(out)


async def post(session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None,
               path: str = "/v1/chat/completions") -> Answer:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url + path, data=data, headers=headers or {}) as resp:
        ans = Answer(resp.status, dict(resp.headers))
        parser = SSEParser()
        async for chunk in resp.content.iter_any():
            ans.reads.append(chunk)
            if resp.content_type == "text/event-stream":
                ans.events += parser.feed(chunk)
        return ans


def chat_body(model: str, text: str = "hello there", *, stream: bool = True, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": stream, **extra}


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The gateway's /metrics as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))
