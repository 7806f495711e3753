"""Fixtures of the simulated server's HTTP tests: one server per test module (the
default engine, ``simserver.MODEL`` with ``MAX_MODEL_LEN``), and an httpx client on it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from simserver import HTTP_TIMEOUT_S, MAX_MODEL_LEN, MODEL

from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerConfig(engine=EngineConfig(model=MODEL, max_model_len=MAX_MODEL_LEN))) as srv:
        yield srv


@pytest.fixture
def http(server: EmbeddedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=HTTP_TIMEOUT_S) as client:
        yield client
