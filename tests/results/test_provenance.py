"""One rule for where a run's numbers come from (``results.provenance``): the simulator in
virtual time, the embedded simulated server, the gateway in front of ``sim serve`` (it
answers ``/inferlab/engine`` for its upstreams), ``sim serve`` (it answers
``/inferlab/engine``), or a server measured."""

from __future__ import annotations

from typing import Any

import pytest

from inferlab.results.history import run_row
from inferlab.results.provenance import (
    EMBEDDED,
    GATEWAY,
    SERVER,
    SIM_SERVE,
    VIRTUAL,
    ServerInfo,
    gateway_answer,
    http_server_info,
    server_info,
    simulated_engine,
)
from inferlab.results.summary import Summary, summarize

ENGINE = {"model": "Qwen/Qwen2.5-7B-Instruct", "engine_family": "vllm", "tensor_parallel_size": 1}
#: What inferlab gateway answers at /inferlab/gateway (``GatewayConfig.setup``), and in words.
SETUP = {"upstreams": [{"name": "10.0.0.5:8000"}, {"name": "10.0.0.6:8000"}], "router": "split-by-length",
         "long_prompt_tokens": 8192, "admission": {"mode": "requests", "max_tokens_in_flight": 65536,
                                                   "max_requests_in_flight": 8, "tokenizer": "upstream"},
         "cache": {"enabled": False, "ttl_s": 300.0}, "keys": 0, "redis": True}
SETUP_WORDS = ("2 upstreams, split-by-length routing (prompts of 8,192+ tokens apart), admission by requests (8 requests per upstream, prompts counted by "
               "upstream), cache off, state shared through Redis")


@pytest.mark.parametrize(("config", "expected", "where"), [
    ({"command": "sim run", "engine": {**ENGINE, "engine_family": "sglang"}},
     ServerInfo(True, VIRTUAL, None, "sglang"), "the simulator (virtual time)"),
    # bench without --url: config.json's url is null, whatever the probe found
    ({"url": None, "resolved": {"url": "http://127.0.0.1:40001/v1", "engine": ENGINE}},
     ServerInfo(True, EMBEDDED, None, "vllm"), "the embedded simulated server"),
    ({"url": None, "resolved": {"url": "http://127.0.0.1:40001/v1", "engine": None}},
     ServerInfo(True, EMBEDDED, None, None), "the embedded simulated server"),
    ({"url": "http://h:8000", "resolved": {"url": "http://h:8000/v1", "engine": ENGINE}},
     ServerInfo(True, SIM_SERVE, "http://h:8000/v1", "vllm"), "inferlab sim serve at http://h:8000/v1"),
    ({"url": "http://h:8000", "resolved": {"url": "http://h:8000/v1", "engine": None}},
     ServerInfo(False, SERVER, "http://h:8000/v1", None), "http://h:8000/v1"),
    # the gateway in front of sim serve: simulated, its upstreams' family when they share one
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": gateway_answer([ENGINE, ENGINE])}},
     ServerInfo(True, GATEWAY, "http://g:8080/v1", "vllm"), "inferlab gateway at http://g:8080/v1 in front of inferlab sim serve"),
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1",
                                           "engine": gateway_answer([ENGINE, {**ENGINE, "engine_family": "sglang"}])}},
     ServerInfo(True, GATEWAY, "http://g:8080/v1", None), "inferlab gateway at http://g:8080/v1 in front of inferlab sim serve"),
    # (a gateway in front of a gateway in front of sim serve)
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": gateway_answer([gateway_answer([ENGINE])])}},
     ServerInfo(True, GATEWAY, "http://g:8080/v1", "vllm"), "inferlab gateway at http://g:8080/v1 in front of inferlab sim serve"),
    # the gateway in front of any engine says so (its setup: /inferlab/gateway), and what the engine named itself
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": None, "gateway": SETUP,
                                           "server_software": {"name": "llama.cpp", "version": None}}},
     ServerInfo(False, SERVER, "http://g:8080/v1", None, "llama.cpp", SETUP_WORDS),
     f"inferlab gateway at http://g:8080/v1 in front of llama.cpp ({SETUP_WORDS})"),
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": None, "gateway": SETUP}},
     ServerInfo(False, SERVER, "http://g:8080/v1", None, None, SETUP_WORDS),
     f"inferlab gateway at http://g:8080/v1 in front of a server that did not say what it is ({SETUP_WORDS})"),
    ({"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": gateway_answer([ENGINE]), "gateway": SETUP}},
     ServerInfo(True, GATEWAY, "http://g:8080/v1", "vllm", None, SETUP_WORDS),
     f"inferlab gateway at http://g:8080/v1 in front of inferlab sim serve ({SETUP_WORDS})"),
    ({}, ServerInfo(False, SERVER, None, None), "an unknown server"),  # (a folder of records alone)
])
def test_the_rule(config: dict[str, Any], expected: ServerInfo, where: str) -> None:
    info = server_info(config)
    assert info == expected and info.where == where
    assert info.label == (f"{where} (prediction)" if expected.simulated else where)
    assert ServerInfo.from_json(info.to_json()) == info
    # an engine to rerun in virtual time: never the gateway's (its cache, admission and routing ran too)
    assert (simulated_engine(config) is not None) == (expected.engine_family is not None and expected.kind != GATEWAY)


def test_a_profile_through_the_gateway_is_named_by_the_same_rule() -> None:
    info = http_server_info("http://g:8080/v1", gateway_answer([ENGINE]))
    assert info == ServerInfo(True, GATEWAY, "http://g:8080/v1", "vllm")
    assert info.label == "inferlab gateway at http://g:8080/v1 in front of inferlab sim serve (prediction)"


def test_the_summary_carries_it_and_an_older_summary_gets_it_from_its_config() -> None:
    config = {"url": None, "resolved": {"url": "http://127.0.0.1:40001/v1", "engine": ENGINE}}
    d = summarize([], config=config).to_json()
    assert d["server"] == {"simulated": True, "kind": "embedded", "url": None, "engine_family": "vllm"}
    older = {k: v for k, v in d.items() if k != "server"}
    assert Summary.from_json(older).server == ServerInfo(True, EMBEDDED, None, "vllm")


def test_the_history_names_a_simulated_server_not_its_port() -> None:
    embedded = run_row(summarize([], config={"url": None, "resolved": {"url": "http://127.0.0.1:40001/v1", "engine": ENGINE}}).to_json(), None)
    assert (embedded["target"], embedded["simulated"]) == ("the embedded simulated server", 1)
    served = run_row(summarize([], config={"url": "http://h:8000", "resolved": {"url": "http://h:8000/v1", "engine": ENGINE}}).to_json(), None)
    assert (served["target"], served["simulated"]) == ("inferlab sim serve at http://h:8000/v1", 1)
    gateway = run_row(summarize([], config={"url": "http://g:8080", "resolved": {"url": "http://g:8080/v1", "engine": gateway_answer([ENGINE])}}).to_json(), None)
    assert (gateway["target"], gateway["simulated"], gateway["engine"]) == ("inferlab gateway at http://g:8080/v1 in front of inferlab sim serve", 1, None)
    measured = run_row(summarize([], config={"url": "http://h:8000", "resolved": {"url": "http://h:8000/v1", "engine": None}}).to_json(), None)
    assert (measured["target"], measured["simulated"]) == ("http://h:8000/v1", 0)
