"""``BenchConfig.to_json``: what lands in config.json and summary.json."""

from __future__ import annotations

import json

import pytest

from inferlab import BenchConfig, LoadConfig, OpenLoop


@pytest.mark.parametrize("name", [
    "Authorization", "X-Api-Key", "api_key", "X-APIKEY", "X-Auth-Token", "X-Client-Secret",
    "Cookie", "Set-Cookie", "X-Password", "Ocp-Apim-Subscription-Key",
])
def test_secret_headers_are_redacted(name: str) -> None:
    cfg = BenchConfig(LoadConfig(OpenLoop(1.0), num_requests=1), api_key="sk-A", headers=((name, "sk-X"), ("X-Trace", "abc")))
    d = cfg.to_json()
    assert d["headers"] == {name: "***", "X-Trace": "abc"}
    assert d["api_key"] == "***"
    assert "sk-" not in json.dumps(d)


async def test_the_headers_go_with_every_request_the_model_lookup_included() -> None:
    """Against a server that wants ``Authorization: Bearer k``, ``-H 'Authorization:
    Bearer k'`` was sent with the requests but not with ``GET /v1/models`` (which
    carried only --api-key): the run failed on a 401 before a request was sent. And
    --api-key beside -H Authorization dropped one of them silently: refused now."""
    from aiohttp import web

    from inferlab import ClosedLoop, bench_async
    from inferlab._errors import RunFailedError, UsageError
    from inferlab.openai.errors import error_body

    seen: list[tuple[str, str | None]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != "Bearer k":
            return web.json_response(error_body(401, "no key", "AuthenticationError"), status=401)
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
        return web.json_response(error_body(503, "not today", "ServiceUnavailableError"), status=503)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        cfg = BenchConfig(LoadConfig(ClosedLoop(1), num_requests=1), headers=(("Authorization", "Bearer k"),),
                          preflight=False, server_metrics=False)
        with pytest.raises(RunFailedError, match="not today"):  # (past the lookup: the request was sent)
            await bench_async(cfg, f"http://127.0.0.1:{port}")
        assert seen[0] == ("/v1/models", "Bearer k")
        assert ("/v1/chat/completions", "Bearer k") in seen and all(auth == "Bearer k" for _, auth in seen)
        both = BenchConfig(LoadConfig(ClosedLoop(1), num_requests=1), api_key="k", headers=(("authorization", "Bearer k"),))
        with pytest.raises(UsageError, match="--api-key and --header Authorization both"):
            await bench_async(both, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
