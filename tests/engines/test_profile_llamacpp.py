"""``inferlab profile --engine``: llama.cpp started from a config, profiled, and stopped;
its context per slot read back from the server it started."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.engines.tinymodel import TinyModel

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_profile_starts_llamacpp_from_its_config_and_stops_it(llama_server_binary: Path, tiny: TinyModel, tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(f'engine = "llamacpp"\nmodel = "{tiny.gguf}"\nexecutable = "{llama_server_binary}"\n'
                      "max_model_len = 1024\nmax_num_seqs = 2\n")
    out = tmp_path / "profile"
    # (the ladder takes about a second; the budget leaves room for a stall: one clean-clone
    # run saw the client pause 10 s between two prompt lengths, the server idle, and ran out
    # of a 15 s budget; not reproduced in 12 runs since)
    res = CliRunner().invoke(main, ["profile", "--engine", str(config), "--budget", "60", "--factors", "prefill",
                                    "--api", "completions", "-o", str(out)])
    assert res.exit_code == 0, res.output
    p = json.loads((out / "profile.json").read_text())
    assert p["engine_config"]["engine"] == "llamacpp" and p["url"].startswith("http://127.0.0.1:")
    # the context each of the config's 2 slots got (-c 2048), as the started server says
    assert (p["max_model_len"], p["max_model_len_source"]) == (1024, "the server's /props (llama.cpp: one slot's context)")
    # what the server said it is, in profile.json and beside its URL
    assert p["server_software"]["name"] == "llama.cpp" and p["server"]["software"].startswith("llama.cpp")
    prefill = p["factors"][0]
    assert prefill["name"] == "prefill" and prefill["measured"], prefill
    assert "n_slots = 2," in (out / "engine.log").read_text()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(p["url"] + "/health", timeout=5)
