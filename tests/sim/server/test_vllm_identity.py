"""What the simulated server writes as vLLM 0.32 writes it, over real loopback HTTP: the
answer's id (``X-Request-Id``, else ``request_id``, else random), the ``X-Request-Id``
response header (``--enable-request-id-headers``), the model card, and
``usage.prompt_tokens_details`` (``--enable-prompt-tokens-details``); and what bench's
summary says of cached tokens with and without it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from simserver import HTTP_TIMEOUT_S, MAX_MODEL_LEN, MODEL
from test_sim_server import sse_events, words

from inferlab.cli.main import main
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import ChildServer, EmbeddedServer

PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-"}
ROUTES = ("chat", "completions")


def body(route: str, **fields: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL, "max_tokens": 3, "ignore_eos": True}
    b.update({"messages": [{"role": "user", "content": words(40, seed=5)}]} if route == "chat" else {"prompt": words(40, seed=5)})
    b.update(fields)
    return b


def streamed(http: httpx.Client, route: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The JSON chunks of one streamed answer with its usage chunk."""
    b = body(route, stream=True, stream_options={"include_usage": True})
    with http.stream("POST", PATH[route], json=b, headers=headers) as r:
        assert r.status_code == 200
        events = sse_events(b"".join(r.iter_raw()).decode())
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def config(**flags: bool) -> ServerConfig:
    return ServerConfig(engine=EngineConfig(model=MODEL, max_model_len=MAX_MODEL_LEN), **flags)


@pytest.fixture(scope="module")
def detailed() -> Iterator[httpx.Client]:
    """A server started with ``--enable-prompt-tokens-details`` and ``--enable-request-id-headers``."""
    with EmbeddedServer(config(enable_prompt_tokens_details=True, enable_request_id_headers=True)) as srv, \
            httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT_S) as client:
        yield client


# --- answer ids ------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_answer_ids_are_random_and_differ_between_servers(http: httpx.Client, route: str) -> None:
    """vLLM: ``cmpl-``/``chatcmpl-`` and 16 random hex digits. The server counted
    (``cmpl-0``, ``cmpl-1``...), so a second server repeated the first one's ids."""
    ids = [http.post(PATH[route], json=body(route)).json()["id"] for _ in range(2)]
    ids += {c["id"] for c in streamed(http, route)}  # (one id for every chunk)
    with EmbeddedServer(config()) as other, httpx.Client(base_url=other.url, timeout=HTTP_TIMEOUT_S) as again:
        ids.append(again.post(PATH[route], json=body(route)).json()["id"])
    assert all(re.fullmatch(re.escape(PREFIX[route]) + "[0-9a-f]{16}", i) for i in ids), ids
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("route", ROUTES)
def test_the_x_request_id_header_names_the_answer_before_request_id(http: httpx.Client, route: str) -> None:
    headers = {"X-Request-Id": "trace-7"}
    r = http.post(PATH[route], json=body(route, request_id="abc-1"), headers=headers)
    assert r.json()["id"] == PREFIX[route] + "trace-7"
    assert {c["id"] for c in streamed(http, route, headers)} == {PREFIX[route] + "trace-7"}
    assert "x-request-id" not in r.headers  # (vLLM sends it back only with --enable-request-id-headers)


def test_request_id_headers_on_every_response(detailed: httpx.Client) -> None:
    """``--enable-request-id-headers``: the request's own X-Request-Id, else a random one
    (vLLM's uuid4 hex, not the answer's id), on every route, errors included."""
    r = detailed.post(PATH["chat"], json=body("chat"), headers={"X-Request-Id": "mine"})
    assert r.headers["x-request-id"] == "mine" and r.json()["id"] == "chatcmpl-mine"
    plain = detailed.post(PATH["completions"], json=body("completions"))
    assert re.fullmatch("[0-9a-f]{32}", plain.headers["x-request-id"])
    assert plain.headers["x-request-id"] not in plain.json()["id"]
    for r in (detailed.get("/v1/models"), detailed.get("/nowhere"), detailed.post(PATH["chat"], json={"model": MODEL})):
        assert re.fullmatch("[0-9a-f]{32}", r.headers["x-request-id"]), (r.status_code, r.headers)
    assert detailed.get("/nowhere", headers={"X-Request-Id": "lost"}).headers["x-request-id"] == "lost"


# --- the model card ----------------------------------------------------------------------


def test_the_model_card_has_vllms_parent_and_permission(http: httpx.Client) -> None:
    (card,) = http.get("/v1/models").json()["data"]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert card["parent"] is None and card["owned_by"] == "inferlab-sim"  # (bench tells the simulator by it)
    (perm,) = card["permission"]
    assert re.fullmatch("modelperm-[0-9a-f]{16}", perm["id"]) and isinstance(perm["created"], int)
    assert {k: v for k, v in perm.items() if k not in ("id", "created")} == {
        "object": "model_permission", "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
        "group": None, "is_blocking": False,
    }


# --- usage.prompt_tokens_details -----------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_prompt_tokens_details_without_the_flag_as_vllm_writes_them(http: httpx.Client, route: str) -> None:
    """vLLM without ``--enable-prompt-tokens-details``: null in a whole answer, no key in
    a stream's usage chunk. The server always wrote the cached tokens."""
    usage = http.post(PATH[route], json=body(route)).json()["usage"]
    assert "prompt_tokens_details" in usage and usage["prompt_tokens_details"] is None
    last = streamed(http, route)[-1]
    assert last["usage"]["prompt_tokens"] == usage["prompt_tokens"] and "prompt_tokens_details" not in last["usage"]


@pytest.mark.parametrize("route", ROUTES)
def test_prompt_tokens_details_with_the_flag_say_the_cached_tokens(detailed: httpx.Client, route: str) -> None:
    first = detailed.post(PATH[route], json=body(route, max_tokens=2)).json()
    again = streamed(detailed, route)[-1]  # (the same prompt: its whole blocks are cached)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": first["inferlab_timeline"]["cached_tokens"]}
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == again["inferlab_timeline"]["cached_tokens"] > 0 and cached % 16 == 0


def test_the_cli_flags_reach_the_server() -> None:
    """``sim serve --enable-prompt-tokens-details --enable-request-id-headers``, and SGLang's
    name for the first (``--enable-cache-report``, off by default there too)."""
    for flags in (["--enable-prompt-tokens-details", "--enable-request-id-headers"], ["--enable-cache-report"]):
        with ChildServer(["--max-model-len", "4096", *flags]) as server:
            r = httpx.post(server.url + PATH["completions"], json=body("completions"), timeout=HTTP_TIMEOUT_S)
        assert isinstance(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], int)
        assert ("x-request-id" in r.headers) == ("--enable-request-id-headers" in flags)


#: A workload whose prompts share a prefix.
SHARED = ("--prefix-tokens", "64", "--suffix-tokens", "8")


def bench(url: str | None, out: Path, workload: tuple[str, ...] = SHARED) -> tuple[dict[str, Any], str]:
    """A short bench run (by default, of prompts that share a prefix): its summary.json and console output."""
    args = ["bench", "-n", "4", "-c", "1", *workload, "--output-tokens", "2", "--no-history", "-o", str(out)]
    res = CliRunner().invoke(main, [*args, *(["--url", url] if url else [])])
    assert res.exit_code == 0, res.output
    return json.loads((out / "summary.json").read_text()), " ".join(res.stdout.split())


def test_bench_says_the_servers_metrics_counts_without_the_flag_and_the_answers_with_it(tmp_path: Path) -> None:
    """Without the flag the answers do not say their cached tokens: the tokens row said
    "cached in unknown" while the warning on a rerun with the same --seed quoted what the
    server's /metrics counted over the same run. The row says those counts, as the
    server's (its warm-up's prompt counted too); with the flag, the answers' own."""
    rerun = ("--seed", "7", "--input-tokens", "300", "--warmup", "1")
    with EmbeddedServer(config()) as plain:
        bench(plain.url, tmp_path / "first", rerun)
        summary, said = bench(plain.url, tmp_path / "again", rerun)
    counters = summary["server_metrics"]["counters"]
    hits, queries = int(counters["prefix_cache_hits_tokens"]), int(counters["prefix_cache_queries_tokens"])
    assert summary["cached_tokens"] is None and queries > summary["input_tokens"] and hits > queries / 2
    assert (f"cached: not in the answers; the server's /metrics counted {hits:,} of {queries:,} prompt tokens cached "
            "over the run (warm-ups included)") in said
    assert "cached in unknown" not in said
    assert f"the server's /metrics counted {hits:,} of {queries:,} prompt tokens over the run (warm-ups included) as served" in said  # (the warning)
    with EmbeddedServer(config(enable_prompt_tokens_details=True)) as detailed:
        summary, said = bench(detailed.url, tmp_path / "detailed")
    assert summary["cached_tokens"] >= 3 * 48 and f"{summary['cached_tokens']:,} cached in" in said
    assert "not in the answers" not in said  # (its /metrics count too: the answers' count is shown)
    # bench's own server (no --url) is started with the flag: the shared prefix shows
    summary, said = bench(None, tmp_path / "embedded")
    assert summary["cached_tokens"] >= 3 * 48
