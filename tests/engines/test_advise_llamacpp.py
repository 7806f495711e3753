"""``inferlab advise`` on a run against llama.cpp's ``llama-server``, its advice applied:
the server started as the advice says serves what the run's server served."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab.analysis.advise import advise
from inferlab.cli.main import main
from inferlab.engines.llamacpp import LlamaServer
from inferlab.engines.tinymodel import TinyModel

pytestmark = [pytest.mark.engines, pytest.mark.slow]

SLOT_TOKENS = 512


def slot_context(server: LlamaServer) -> int:
    """The context a slot has, as the server's /props says."""
    with urllib.request.urlopen(server.url + "/props", timeout=10) as resp:
        return int(json.load(resp)["default_generation_settings"]["n_ctx"])


def test_raising_the_slots_as_advised_keeps_each_slots_context(llama_server_binary: Path, tiny: TinyModel,
                                                              tmp_path: Path) -> None:
    """8 users against 2 slots of 512 tokens: advise said "raise the cap (llama.cpp
    --parallel 8 (its slots))", and -np 8 with the -c of before gives each slot 128
    tokens, too few for the run's 300-token prompts. The advice now names the context
    too; the server started with its flags has the slots of 512 tokens the run's had."""
    config = tmp_path / "engine.toml"
    config.write_text(f'engine = "llamacpp"\nmodel = "{tiny.gguf}"\nexecutable = "{llama_server_binary}"\n'
                      f"max_model_len = {SLOT_TOKENS}\nmax_num_seqs = 2\nextra_args = [\"-t\", \"1\"]\n")
    out = tmp_path / "run"
    # 48 requests: about 2 s here, so /metrics' sample at 1 s falls mid-run (with 24, about
    # 1 s, its only sample could land on the tail with nothing waiting, and advise rightly
    # took the server's count of 0 waiting over the records: seen once, on a loaded CI run)
    res = CliRunner().invoke(main, ["bench", "--engine", str(config), "-c", "8", "-n", "48", "--input-tokens", "300",
                                    "--output-tokens", "8", "--api", "completions", "-o", str(out)])
    assert res.exit_code == 0, res.output
    cap = next(r for r in advise(out).recommendations if r.rule == "engine_cap")
    found = re.search(r"--parallel (\d+) --ctx-size (\d+)", cap.change)
    assert found, cap.change
    slots, ctx = int(found[1]), int(found[2])
    assert slots > 2, cap.change
    with LlamaServer(llama_server_binary, tiny.gguf, ctx_tokens=ctx, slots=slots, log_path=tmp_path / "advised.log") as s:
        assert slot_context(s) == SLOT_TOKENS
    # (--parallel alone, the -c of before kept: each slot's context cut below the prompts)
    with LlamaServer(llama_server_binary, tiny.gguf, ctx_tokens=2 * SLOT_TOKENS, slots=slots,
                     log_path=tmp_path / "alone.log") as s:
        assert slot_context(s) < 300
