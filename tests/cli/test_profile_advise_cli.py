"""``inferlab profile`` and ``inferlab advise`` on the command line: one-line errors with
the right exit codes, the checklist and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.sim.engine.bands import error_band


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def test_bad_profile_flags_are_usage_errors(tmp_path: Path) -> None:
    code, out = invoke("profile", "--budget", "soon", "--out", str(tmp_path / "p"), "--url", "http://127.0.0.1:9")
    assert code == 2 and "--budget 'soon'" in out and "Traceback" not in out
    code, out = invoke("profile", "--factors", "prefill,vibes", "--out", str(tmp_path / "p"), "--url", "http://127.0.0.1:9")
    assert code == 2 and "unknown vibes" in out
    for empty in ("", " , "):  # (it profiled every factor: an empty list reads as all)
        code, out = invoke("profile", "--factors", empty, "--out", str(tmp_path / "p"), "--url", "http://127.0.0.1:9")
        assert code == 2 and "--factors names no factor" in out, out
    code, out = invoke("profile", "--budget", "0", "--out", str(tmp_path / "p"), "--url", "http://127.0.0.1:9")
    assert code == 2 and "positive" in out


def test_profile_of_no_server_fails_at_once(tmp_path: Path) -> None:
    code, out = invoke("profile", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "p"), "--budget", "30")
    assert code == 1 and "cannot reach" in out and len(out.strip().splitlines()) == 1


def test_advise_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    code, out = invoke("advise", str(tmp_path / "nothing"))
    assert code == 2 and "no such file" in out and len(out.strip().splitlines()) == 1
    code, out = invoke("advise", str(tmp_path))
    assert code == 2 and "not a run directory" in out
    code, _ = invoke("advise", str(tmp_path), "--goal", "speed")
    assert code == 2


def test_a_sweep_past_its_knee_gets_a_concurrency_cap(tmp_path: Path) -> None:
    for c in (32, 128, 1024):
        code, out = invoke("sim", "run", "-c", str(c), "-n", str(3 * c), "--input-tokens", "500", "--output-tokens", "200", "--out", str(tmp_path / f"c{c}"))
        assert code == 0, out
    code, out = invoke("advise", str(tmp_path), "--goal", "throughput", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["kind"] == "sweep" and d["goal"] == "throughput"
    cap = next(r for r in d["recommendations"] if r["rule"] == "concurrency_cap")
    assert "--max-num-seqs 128" in cap["change"]  # 128 → 1024: E2E about 6x for a third more throughput
    e2e = cap["gains"][0]
    assert e2e["after"] < e2e["before"] and e2e["kind"].startswith("prediction")  # (sim runs: simulated)
    band = error_band("vllm", "closed loop", "E2E", stat="median")  # (the runs' family and regime; a p50 gain: the medians' error)
    assert band is not None and (e2e["metric_class"], e2e["error_band"]) == ("E2E", band.to_json())
    code, out = invoke("advise", str(tmp_path))
    assert code == 0 and "Past the knee" in out
