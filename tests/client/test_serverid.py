"""``client.serverid``: what a measured server says it is, and its release, over real
HTTP on loopback; and what a ``bench`` run records and shows of it. Servers here answer
as each engine's own routes do (vLLM's ``/version``, SGLang's ``/server_info`` and
``/get_server_info``, llama.cpp's ``/props``); the real ones are checked in
``tests/engines`` (llama-server always, vLLM with ``-m vllm``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from inferlab import BenchConfig, ClosedLoop, LoadConfig, WorkloadConfig, bench_async
from inferlab.client.serverid import identify_server
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer

Routes = dict[str, Any]  # path -> JSON body (200), an int (that status, no body), a float (seconds to wait), a str (text)
Serve = Callable[[Routes], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a server answering ``routes`` on loopback; its API root (``.../v1``). It
    also streams a two-token answer at /v1/chat/completions, so bench can run on it."""
    runners: list[web.AppRunner] = []

    async def start(routes: Routes) -> str:
        app = web.Application()
        for path, answer in routes.items():
            async def handler(request: web.Request, answer: Any = answer) -> web.Response:
                if isinstance(answer, float):  # (a server that takes that long to answer)
                    await asyncio.sleep(answer)
                    return web.json_response({"version": "0.11.0"})
                if isinstance(answer, int):
                    return web.Response(status=answer)
                if isinstance(answer, str):  # (a text page: /metrics)
                    return web.Response(text=answer)
                return web.json_response(answer)
            app.router.add_get(path, handler)
        app.router.add_post("/v1/chat/completions", _chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for r in runners:
        await r.cleanup()


async def _chat(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for piece in ("a", "b"):
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


def cards(*owners: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": f"m{i}", "object": "model", "owned_by": o} for i, o in enumerate(owners)]}


@pytest.mark.parametrize(("routes", "expected"), [
    ({"/v1/models": cards("vllm"), "/version": {"version": "0.11.0"}},
     {"name": "vLLM", "version": "0.11.0", "source": "GET /version"}),
    # SGLang 0.5's route, and the one before it
    ({"/v1/models": cards("sglang"), "/server_info": {"version": "0.5.2", "tp_size": 1}},
     {"name": "SGLang", "version": "0.5.2", "source": "GET /server_info", "settings": {"tensor_parallel_size": 1}}),
    ({"/v1/models": cards("sglang"), "/server_info": 404, "/get_server_info": {"version": "0.4.6.post1"}},
     {"name": "SGLang", "version": "0.4.6.post1", "source": "GET /get_server_info"}),
    ({"/v1/models": cards("llamacpp"), "/props": {"build_info": "b6000-1a2b3c4", "total_slots": 4}},
     {"name": "llama.cpp", "version": "b6000-1a2b3c4", "source": "GET /props", "settings": {"max_num_seqs": 4}}),
    # its slots and a slot's context, as llama-server's /props states them
    ({"/v1/models": cards("llamacpp"), "/props": {"build_info": "b6000-1a2b3c4", "total_slots": 8,
                                                  "default_generation_settings": {"n_ctx": 2048, "params": {}}}},
     {"name": "llama.cpp", "version": "b6000-1a2b3c4", "source": "GET /props",
      "settings": {"max_num_seqs": 8, "max_model_len": 2048}}),
    # named, but its release route does not answer (a proxy passing the cards on): the name alone
    ({"/v1/models": cards("vllm"), "/version": 404}, {"name": "vLLM", "version": None, "source": None}),
    ({"/v1/models": cards("vllm"), "/version": {"version": ""}}, {"name": "vLLM", "version": None, "source": None}),
    # not one of them: unknown, whatever else it answers
    ({"/v1/models": cards("openai"), "/version": {"version": "1.2.3"}}, None),
    ({"/v1/models": {"data": [{"id": "m"}]}, "/version": {"version": "0.11.0"}}, None),
    ({"/v1/models": 500}, None),
    ({"/v1/models": ["not", "an", "object"]}, None),
    # cards of two engines (a router in front of both): neither is "the" server
    ({"/v1/models": cards("vllm", "sglang"), "/version": {"version": "0.11.0"}}, None),
])
async def test_the_server_is_named_as_its_cards_and_release_route_say(
    serve: Serve, routes: Routes, expected: dict[str, Any] | None
) -> None:
    assert await identify_server(await serve(routes), {}) == expected


async def test_nothing_answering_is_unknown_not_an_error() -> None:
    # (a port nothing listens on: the probe gives up quietly)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert await identify_server(f"http://127.0.0.1:{port}/v1", {}) is None


async def test_a_release_route_that_does_not_answer_in_time_leaves_the_name_alone(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferlab.client import serverid

    monkeypatch.setattr(serverid, "_TIMEOUT_S", 0.3)  # (the probes' time in all)
    url = await serve({"/v1/models": cards("vllm"), "/version": 2.0})
    assert await identify_server(url, {}) == {"name": "vLLM", "version": None, "source": None}
    url = await serve({"/v1/models": 2.0})
    assert await identify_server(url, {}) is None


async def test_the_simulated_server_is_not_taken_for_vllm() -> None:
    # sim serve answers /version with inferlab's own release; its cards name inferlab
    with EmbeddedServer(ServerConfig(EngineConfig())) as sim:
        assert await identify_server(sim.url + "/v1", {}) is None
        s = (await bench_async(BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2),
                                           workload=WorkloadConfig(input_tokens=20, output_tokens=2)), sim.url)).summary
    assert s.config["resolved"]["server_software"] is None and s.server.software is None and s.server.simulated


async def test_a_bench_run_records_what_the_server_said_and_names_it(serve: Serve) -> None:
    url = await serve({"/v1/models": cards("vllm"), "/version": {"version": "0.13.0"}})
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), workload=WorkloadConfig(input_tokens=10),
                      url=url.removesuffix("/v1"), model="m0", preflight=False)
    s = (await bench_async(cfg, url.removesuffix("/v1"))).summary
    assert s.config["resolved"]["server_software"] == {"name": "vLLM", "version": "0.13.0", "source": "GET /version"}
    assert s.server.software == "vLLM 0.13.0" and not s.server.simulated
    assert s.server.where == f"{url} (vLLM 0.13.0)"
    # summary.json keeps it, and a summary read back says the same
    from inferlab.results.summary import Summary

    back = Summary.from_json(json.loads(json.dumps(s.to_json())))
    assert back.server == s.server


async def test_a_server_that_names_nothing_is_recorded_as_unknown(serve: Serve) -> None:
    url = await serve({"/v1/models": {"data": [{"id": "m"}]}})
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), workload=WorkloadConfig(input_tokens=10),
                      url=url.removesuffix("/v1"), model="m", preflight=False)
    s = (await bench_async(cfg, url.removesuffix("/v1"))).summary
    assert s.config["resolved"]["server_software"] is None and s.server.software is None
    assert s.server.where == url


#: A page as vLLM 0.32's /metrics writes its cache config (labels trimmed)
CACHE_INFO = (
    '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
    '# TYPE vllm:cache_config_info gauge\n'
    'vllm:cache_config_info{block_size="128",cache_dtype="fp8_e4m3",enable_prefix_caching="False",engine="0",'
    'gpu_memory_utilization="0.92",num_cpu_blocks="None",num_gpu_blocks="24",num_gpu_blocks_override="24"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n'
)


@pytest.mark.parametrize(("metrics", "card", "expected"), [
    # the blocks it had, and the override it was given
    (CACHE_INFO, {"max_model_len": 2048},
     {"block_size": 128, "num_gpu_blocks": 24, "num_gpu_blocks_override": 24, "enable_prefix_caching": False,
      "kv_cache_dtype": "fp8_e4m3", "max_model_len": 2048}),
    # sized from memory (no override): the blocks it had, not recorded as an override
    (CACHE_INFO.replace('num_gpu_blocks_override="24"', 'num_gpu_blocks_override="None"'), {},
     {"block_size": 128, "num_gpu_blocks": 24, "enable_prefix_caching": False, "kv_cache_dtype": "fp8_e4m3"}),
    # a label it writes otherwise, or leaves out, is left out; so is a card without a length
    (CACHE_INFO.replace('num_gpu_blocks="24"', 'num_gpu_blocks="None"').replace('block_size="128",', "")
     .replace(',num_gpu_blocks_override="24"', ""), {},
     {"num_gpu_blocks": None, "enable_prefix_caching": False, "kv_cache_dtype": "fp8_e4m3"}),
    ("vllm:num_requests_running 0\n", {"max_model_len": 4096}, {"max_model_len": 4096}),
    # two engine cores (data parallelism) that differ on a label: that one is left out
    (CACHE_INFO + CACHE_INFO.splitlines()[2].replace('engine="0"', 'engine="1"').replace('num_gpu_blocks="24"',
                                                                                           'num_gpu_blocks="30"') + "\n",
     {}, {"block_size": 128, "num_gpu_blocks_override": 24, "enable_prefix_caching": False, "kv_cache_dtype": "fp8_e4m3"}),
])
async def test_a_vllm_server_states_its_kv_cache_and_context(
    serve: Serve, metrics: str, card: dict[str, Any], expected: dict[str, Any]
) -> None:
    cards_ = {"data": [{"id": "tiny", "owned_by": "vllm", **card}]}
    said = await identify_server(await serve({"/v1/models": cards_, "/version": {"version": "0.32.0"}, "/metrics": metrics}), {})
    assert said is not None and (said["name"], said["version"]) == ("vLLM", "0.32.0")
    expected = {k: v for k, v in expected.items() if v is not None}
    assert said.get("settings", {}) == expected


async def test_an_sglang_servers_settings_come_from_its_server_info_not_vllms_metrics(serve: Serve) -> None:
    url = await serve({"/v1/models": cards("sglang"), "/server_info": {"version": "0.5.2"}, "/metrics": CACHE_INFO})
    assert "settings" not in (await identify_server(url, {}) or {})


#: ``/server_info`` as SGLang writes it: its server arguments (a few of its ~300), its
#: scheduler's start-up info, each data-parallel rank's state, its release
SERVER_INFO: dict[str, Any] = {
    "model_path": "Qwen/Qwen2.5-7B-Instruct", "tp_size": 2, "dp_size": 1, "pp_size": 1, "page_size": 1,
    "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "max_running_requests": None,
    "mem_fraction_static": 0.871, "disable_radix_cache": False, "disable_overlap_schedule": True, "disable_cuda_graph": False,
    "enable_mixed_chunk": False, "kv_cache_dtype": "auto", "context_length": None, "schedule_policy": "fcfs",
    "status": "ready", "max_total_num_tokens": 1_234_567, "max_req_input_len": 32762,
    "internal_states": [{"attention_backend": "fa3", "last_gen_throughput": 0.0}], "version": "0.5.2",
}


@pytest.mark.parametrize(("changes", "card", "expected"), [
    ({}, {"max_model_len": 32768},
     {"tensor_parallel_size": 2, "enable_prefix_caching": True, "overlap_schedule": False, "enforce_eager": False,
      "mixed_batches": False, "max_num_batched_tokens": 8192, "kv_cache_dtype": "auto", "block_size": 1,
      "kv_cache_tokens": 1_234_567, "max_model_len": 32768}),
    # pages of 64 tokens, a sequence cap and a context given, chunking off, no radix cache
    # (its pool is a count of tokens, not of pages: no block count vLLM's override would be)
    ({"page_size": 64, "max_total_num_tokens": 1_234_560, "max_running_requests": 256, "context_length": 8192,
      "chunked_prefill_size": -1,
      "disable_radix_cache": True, "disable_overlap_schedule": False, "disable_cuda_graph": True,
      "enable_mixed_chunk": True}, {},
     {"tensor_parallel_size": 2, "enable_prefix_caching": False, "overlap_schedule": True, "enforce_eager": True,
      "mixed_batches": True, "enable_chunked_prefill": False, "max_num_seqs": 256, "kv_cache_dtype": "auto", "block_size": 64,
      "kv_cache_tokens": 1_234_560, "max_model_len": 8192}),
    # several schedulers (data or pipeline parallelism), each its own pool and queue: nothing
    ({"dp_size": 2}, {"max_model_len": 32768}, {}),
    ({"pp_size": 2}, {}, {}),
    # a release before paging, and one that writes a value otherwise: what it states only
    ({"page_size": None, "tp_size": "2", "disable_radix_cache": "no"}, {},
     {"overlap_schedule": False, "enforce_eager": False, "mixed_batches": False, "max_num_batched_tokens": 8192,
      "kv_cache_dtype": "auto", "block_size": 1,
      "kv_cache_tokens": 1_234_567}),
])
async def test_an_sglang_server_states_its_arguments_and_kv_pool(
    serve: Serve, changes: dict[str, Any], card: dict[str, Any], expected: dict[str, Any]
) -> None:
    cards_ = {"data": [{"id": "qwen", "owned_by": "sglang", **card}]}
    # (SGLang before 0.5 answers /get_server_info only)
    said = await identify_server(await serve({"/v1/models": cards_, "/server_info": 404,
                                              "/get_server_info": {**SERVER_INFO, **changes}}), {})
    assert said is not None and (said["name"], said["version"], said["source"]) == ("SGLang", "0.5.2", "GET /get_server_info")
    assert said.get("settings", {}) == expected


async def test_compare_names_an_sglang_servers_pool_as_its_tokens(serve: Serve) -> None:
    """Two runs of SGLang servers with other pools differ in ``kv_cache_tokens``, the
    tokens each stated, not in vLLM's ``num_gpu_blocks_override``, which neither was given."""
    from inferlab.results.loaddiff import engine_differences

    cards_ = {"data": [{"id": "qwen", "owned_by": "sglang"}]}
    configs = []
    for tokens in (1_234_560, 2_469_120):
        said = await identify_server(await serve({"/v1/models": cards_, "/server_info": {
            **SERVER_INFO, "page_size": 64, "max_total_num_tokens": tokens}}), {})
        configs.append({"resolved": {"server_software": said}})
    assert [d.setting for d in engine_differences(*configs)] == ["resolved.server_software.settings.kv_cache_tokens"]
