"""``inferlab tune --engine``: llama.cpp started for each trial with the setting put in
(its -np), measured, and stopped after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.engines.tinymodel import TinyModel

pytestmark = [pytest.mark.engines, pytest.mark.slow]


def test_tune_starts_the_engine_per_trial_with_each_setting(llama_server_binary: Path, tiny: TinyModel, tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(f'engine = "llamacpp"\nmodel = "{tiny.gguf}"\nexecutable = "{llama_server_binary}"\nmax_model_len = 1024\n')
    out = tmp_path / "tune"
    res = CliRunner().invoke(main, [
        "tune", "--engine", str(config), "--param", "max-num-seqs=1,3", "--search", "grid", "--api", "completions",
        "-c", "3", "-n", "6", "--input-tokens", "64", "--output-tokens", "8", "--slo-ttft-ms", "60000", "-o", str(out),
    ])
    assert res.exit_code == 0, res.stderr
    index = json.loads((out / "sweep.json").read_text())
    assert index["prediction"] is False and index["target"]["engine"]["engine"] == "llamacpp"
    points = index["points"]
    assert [p["params"]["max_num_seqs"] for p in points] == [1, 3] and all(p["status"] == "done" for p in points)
    for p in points:
        # each trial's server was started with its setting, and said so in its log
        log = (out / f"{p['dir']}.engine.log").read_text()
        assert f"n_slots = {p['params']['max_num_seqs']}," in log
        summary = json.loads((out / p["dir"] / "summary.json").read_text())
        assert summary["counts"]["completed"] == 6
