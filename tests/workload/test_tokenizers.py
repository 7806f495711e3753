"""Exact prompt lengths with a real tokenizer, shared by the sim server and bench.

A tiny byte-level BPE is trained here on Python's own standard library (offline, about
a second), so nothing is downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

from inferlab import BenchConfig, ClosedLoop, LoadConfig, UsageError, WorkloadConfig, bench_async  # noqa: E402
from inferlab.sim.engine.engine import EngineConfig  # noqa: E402
from inferlab.sim.server.app import ServerConfig  # noqa: E402
from inferlab.sim.server.launch import EmbeddedServer  # noqa: E402
from inferlab.workload.prompts import PromptBuilder  # noqa: E402
from inferlab.workload.tokenizers import hf_hub_cache, load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def sim(tokenizer_path: str) -> Iterator[EmbeddedServer]:
    cfg = ServerConfig(EngineConfig(max_model_len=8192), tokenizer=tokenizer_path, enable_prompt_tokens_details=True)
    with EmbeddedServer(cfg) as server:
        yield server


def test_exact_text_lengths_by_re_encoding(tokenizer_path: str) -> None:
    tok = load_tokenizer(os.path.dirname(tokenizer_path))  # a directory works too
    b = PromptBuilder(tok)
    for n in (1, 7, 100, 500, 1333):
        for key in ("a", "b", "c"):
            text, count = b.prompt(key, n)
            assert isinstance(text, str) and count == n
            assert len(tok.encode(text)) == n
    # word prompts are not one token per word with this tokenizer: the adjustment matters
    assert len(tok.encode(" ".join(["prefill"] * 50))) != 50 or len(tok.encode("throughput latency decode")) != 3


@pytest.mark.parametrize("token_ids", [True, False])
async def test_completions_prompt_tokens_exact_with_tokenizer(sim: EmbeddedServer, tokenizer_path: str, token_ids: bool) -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(4), num_requests=12),
        workload=WorkloadConfig(input_tokens=500, output_tokens=8, tokenizer=tokenizer_path, token_ids=token_ids),
        api="completions",
    )
    result = await bench_async(cfg, sim.url)
    assert result.summary.counts.completed == 12
    assert [r.input_tokens for r in result.records] == [500] * 12
    assert [r.output_tokens for r in result.records] == [8] * 12


async def test_drawn_lengths_and_shared_prefix_exact_with_tokenizer(sim: EmbeddedServer, tokenizer_path: str) -> None:
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(2), num_requests=10),
        workload=WorkloadConfig(input_tokens="uniform:50:700", output_tokens=2, tokenizer=tokenizer_path),
        api="completions",
    )
    recs = (await bench_async(cfg, sim.url)).records
    assert all(r.input_tokens == r.requested_input_tokens for r in recs)
    assert len({r.input_tokens for r in recs}) > 5
    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(1), num_requests=6),
        workload=WorkloadConfig(prefix_groups=1, prefix_tokens=512, suffix_tokens=40, output_tokens=2, tokenizer=tokenizer_path),
        api="completions",
    )
    recs = (await bench_async(cfg, sim.url)).records
    assert [r.input_tokens for r in recs] == [552] * 6
    assert [r.cached_tokens for r in recs][1:] == [512] * 5  # 32 full blocks of 16


def test_sim_server_counts_with_the_given_tokenizer(sim: EmbeddedServer, tokenizer_path: str) -> None:
    tok = load_tokenizer(tokenizer_path)
    assert sim.server.tokenizer.vocab_size == tok.vocab_size
    text = "def main():\n    return 42\n"
    assert sim.server.tokenizer.encode(text) == tok.encode(text)


def test_bad_tokenizer_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no tokenizer\.json"):
        load_tokenizer(str(tmp_path))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match=r"tokenizer\.json: not a tokenizer\.json"):
        load_tokenizer(str(bad))


def test_cli_bench_with_tokenizer_starts_the_sim_with_it(tokenizer_path: str) -> None:
    cmd = [
        sys.executable, "-m", "inferlab", "bench", "--tokenizer", tokenizer_path, "--api", "completions",
        "--input-tokens", "500", "--output-tokens", "4", "-n", "4", "-c", "2", "--json",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    import json

    s = json.loads(p.stdout)
    assert s["input_tokens"] == 4 * 500 and s["counts"]["completed"] == 4


async def test_without_a_local_tokenizer_the_servers_tokenize_makes_lengths_exact(sim: EmbeddedServer) -> None:
    from inferlab.client.preflight import EXACT_SERVER

    cfg = BenchConfig(
        load=LoadConfig(ClosedLoop(2), num_requests=6),
        workload=WorkloadConfig(input_tokens="uniform:50:600", output_tokens=2),
        api="completions",
    )
    result = await bench_async(cfg, sim.url)
    s = result.summary
    assert s.input_length_source == EXACT_SERVER
    assert isinstance(s.preflight, dict) and s.preflight["vocab_words"] < 400  # BPE: only some built-in words are one token
    assert all(r.input_tokens == r.requested_input_tokens for r in result.records)
    assert s.prompt_overhead_tokens == 0  # completions: no template, no BOS here


async def test_a_local_tokenizer_that_is_not_the_servers_is_refused_before_the_run(tokenizer_path: str) -> None:
    # the server counts with its built-in tokenizer; the local one is a different BPE
    with EmbeddedServer(ServerConfig(EngineConfig(max_model_len=8192))) as builtin:
        cfg = BenchConfig(load=LoadConfig(ClosedLoop(2), num_requests=4),
                          workload=WorkloadConfig(input_tokens=200, output_tokens=2, tokenizer=tokenizer_path))
        with pytest.raises(UsageError, match=r"is not .*'s tokenizer: the probe text is \d+ tokens with it and \d+ with the server's /tokenize"):
            await bench_async(cfg, builtin.url)


def _cached(hub: Path, model_id: str, snapshot: str, tokenizer_path: str) -> Path:
    folder = hub / ("models--" + model_id.replace("/", "--")) / "snapshots" / snapshot
    folder.mkdir(parents=True)
    shutil.copy(tokenizer_path, folder / "tokenizer.json")
    return folder / "tokenizer.json"


def test_a_hugging_face_model_id_is_read_from_the_local_cache(
    tokenizer_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hub"
    main_file = _cached(hub, "Org/Tiny-1B", "aaa", tokenizer_path)
    newer = _cached(hub, "Org/Tiny-1B", "bbb", tokenizer_path)
    os.utime(newer, (main_file.stat().st_mtime + 10,) * 2)
    (hub / "models--Org--Tiny-1B" / "refs").mkdir()
    (hub / "models--Org--Tiny-1B" / "refs" / "main").write_text("aaa\n")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert load_tokenizer("Org/Tiny-1B").path == str(main_file)  # the snapshot refs/main names
    (hub / "models--Org--Tiny-1B" / "refs" / "main").unlink()
    assert load_tokenizer("Org/Tiny-1B").path == str(newer)  # else the newest
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub
    assert load_tokenizer("Org/Tiny-1B").path == str(newer)
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == str(tmp_path / "xdg" / "huggingface" / "hub")
    with pytest.raises(UsageError) as e:
        load_tokenizer("Org/Tiny-1B")  # not in that cache: a message, no download
    msg = str(e.value)
    assert "models--Org--Tiny-1B" in msg and "does not download" in msg and "huggingface-cli download Org/Tiny-1B" in msg
    with pytest.raises(UsageError, match="no such file"):
        load_tokenizer("./nope/tokenizer.json")


def test_cli_takes_a_model_id_for_tokenizer(tokenizer_path: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    _cached(tmp_path / "hub", "Org/Tiny-1B", "aaa", tokenizer_path)
    args = ["sim", "run", "--tokenizer", "Org/Tiny-1B", "-n", "2", "--input-tokens", "40", "--output-tokens", "2", "--json"]
    res = CliRunner().invoke(main, args, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, args, env={"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert res.exit_code == 2 and "--tokenizer: Org/Tiny-1B: not a file, and not in the local Hugging Face cache" in res.output
