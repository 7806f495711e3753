"""``inferlab profile`` and ``inferlab advise`` on the command line: one-line errors with
the right exit codes, the checklist and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
    # (for the throughput goal no cap: it gives throughput up)
    code, out = invoke("advise", str(tmp_path), "--goal", "throughput", "--json")
    assert code == 0, out
    d = json.loads(out)
    assert d["kind"] == "sweep" and d["goal"] == "throughput"
    assert "concurrency_cap" not in [r["rule"] for r in d["recommendations"]]
    code, out = invoke("advise", str(tmp_path), "--json")
    assert code == 0, out
    d = json.loads(out)
    cap = next(r for r in d["recommendations"] if r["rule"] == "concurrency_cap")
    # 128 → 1024: E2E about 6x for a third more throughput; a cap that only queues the rest
    # would not give it, so the change says which limit does
    assert "keep about 128 requests in flight" in cap["change"] and "turns the rest away" in cap["change"]
    assert "max_requests_in_flight = 128, queue_max = 0: HTTP 503" in cap["change"]  # (what the gateway answers)
    assert "not those held back" in cap["gains"][0]["kind"]
    e2e = cap["gains"][0]
    assert e2e["after"] < e2e["before"] and e2e["kind"].startswith("prediction")  # (sim runs: simulated)
    band = error_band("vllm", "closed loop", "E2E", stat="median")  # (the runs' family and regime; a p50 gain: the medians' error)
    assert band is not None and (e2e["metric_class"], e2e["error_band"]) == ("E2E", band.to_json())
    code, out = invoke("advise", str(tmp_path))
    assert code == 0 and "Past the knee" in out


def test_a_sweeps_knee_is_found_within_one_setting_of_its_other_axes(tmp_path: Path) -> None:
    """A sweep over users and --max-num-seqs: going from 16 to 64 users at 16 sequences
    gains nothing (the cap binds), at 256 sequences it gains several times over; advise
    pairs points of one setting only, never 16 users at 256 with 64 at 16."""
    out = tmp_path / "sw"
    code, text = invoke("sweep", "-c", "16,64", "--max-num-seqs", "16,256", "-n", "128", "--input-tokens", "500",
                        "--output-tokens", "100", "--no-saturation-stop", "-o", str(out))
    assert code == 0, text
    code, text = invoke("advise", str(out), "--json")
    assert code == 0, text
    caps = [r for r in json.loads(text)["recommendations"] if r["rule"] in ("concurrency_cap", "engine_cap")]
    assert caps and all(("seqs16" in r["evidence"]) != ("seqs256" in r["evidence"]) for r in caps), caps
    # the 16-sequence setting's knee is that cap: it is advised raised, not capped again
    assert all(r["rule"] == "engine_cap" for r in caps if "seqs16" in r["evidence"])



def test_profile_flags_for_a_factor_left_out_are_refused(tmp_path: Path) -> None:
    # (each was accepted and did nothing: the temperature factor was recorded "not measured")
    url = ("--url", "http://127.0.0.1:9", "--out", str(tmp_path / "p"))
    for args, flag in [
        (("--factors", "temperature"), "--factors temperature needs --no-exact-output"),
        (("--factors", "prefill", "--no-exact-output"), "--no-exact-output: only the temperature factor"),
        (("--factors", "template", "--max-concurrency", "4"), "--max-concurrency: only the decode factor"),
        (("--factors", "prefill", "--slo-ttft-ms", "500"), "--slo-ttft-ms: only the decode factor"),
        (("--factors", "prefix_cache", "--slo-tpot-ms", "50"), "--slo-tpot-ms: only the decode factor"),
        # (it spent the budget on the prefill ladder, then reported the template not measured)
        (("--factors", "template", "--api", "completions"), "--factors template: the completions API applies no chat template"),
    ]:
        code, out = invoke("profile", *url, *args)
        assert code == 2 and flag in out and len(out.strip().splitlines()) == 1, (args, out)
    # (output length is checked against decode's TPOT: it measures decode, and takes them)
    code, out = invoke("profile", *url, "--factors", "output_length", "--max-concurrency", "4")
    assert code == 1 and "cannot reach" in out, out
    code, out = invoke("profile", *url, "--factors", "temperature", "--no-exact-output")
    assert code == 1 and "cannot reach" in out, out


def test_advise_reads_a_sweep_json_as_report_and_compare_do(tmp_path: Path) -> None:
    # (each was an internal error, or, [] and {}, advice for a sweep.json that report refuses)
    code, out = invoke("sim", "run", "-c", "2", "-n", "4", "--out", str(tmp_path / "sw" / "c2"))
    assert code == 0, out
    for index, why in [
        ('{"format":"inferlab.sweep/1","points":"x"}', 'points is "x", not a list'),
        ('{"format":"inferlab.sweep/1","points":[1]}', "a point that is not an object: 1"),
        ('{"format":"inferlab.sweep/1","points":[{"params":"x"}]}', "a point's params are not an object"),
        ('{"format":"inferlab.sweep/1","points":[{"dir":"c2","repeat":"x"}]}', "a point's repeat is not a whole number"),
        ("[]", "expected a JSON object"),
        ("{}", "format None, expected 'inferlab.sweep/1'"),
    ]:
        (tmp_path / "sw" / "sweep.json").write_text(index)
        for command in ("advise", "report"):
            code, out = invoke(command, str(tmp_path / "sw"))
            assert code == 2 and why in out and len(out.strip().splitlines()) == 1, (command, index, out)
    (tmp_path / "sw" / "sweep.json").write_text('{"format":"inferlab.sweep/1","points":[{"dir":"c2","params":{"concurrency":2}}]}')
    code, out = invoke("advise", str(tmp_path / "sw"))
    assert code == 0 and "(sweep; goal: latency)" in out, out


def test_advise_refuses_a_profile_json_that_is_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "profile.json").write_text("[]")
    code, out = invoke("advise", str(tmp_path))
    assert code == 2 and "not an inferlab profile (a JSON list, not an object)" in out and len(out.strip().splitlines()) == 1, out


def test_a_raised_cap_the_sweep_measured_is_advised_from_that_measurement(tmp_path: Path) -> None:
    """A sweep over --max-num-seqs 1,4: the seqs=1 group's raise names the 4 the sweep
    ran, with its gain from that group's point at the same concurrency; where that
    point did worse, the raise is not advised."""
    out = tmp_path / "sw"
    code, text = invoke("sweep", "-c", "1,4", "--max-num-seqs", "1,4", "-n", "16", "--input-tokens", "200",
                        "--output-tokens", "50", "--no-saturation-stop", "-o", str(out))
    assert code == 0, text

    def caps() -> list[dict[str, object]]:
        code, text = invoke("advise", str(out), "--json")
        assert code == 0, text
        return [r for r in json.loads(text)["recommendations"] if r["rule"] == "engine_cap"]

    found = caps()
    assert found and all("--max-num-seqs 4" in r["change"] and "raise" in r["change"] for r in found), found
    tps = [g for r in found for g in r["gains"] if g["metric"] == "output tokens/s"]
    assert tps and all("in this folder" in g["kind"] and "004_c4_seqs4" in g["kind"] and g["after"] > g["before"]
                       for g in tps), tps
    # (the seqs=4 point made worse than the seqs=1 one at the same concurrency: keep the cap)
    summary = out / "004_c4_seqs4" / "summary.json"
    d = json.loads(summary.read_text())
    d["output_token_throughput_tps"] = 1.0
    summary.write_text(json.dumps(d))
    found = caps()
    assert found and all("keep the cap" in r["change"] and "raise" not in r["change"] for r in found), found


@pytest.mark.parametrize("command", [
    ["tune", "--param", "max-num-seqs=1,4", "--param", "gpu=L40S,H100", "--search", "grid", "--slo-ttft-ms", "100000"],
    ["sweep", "--max-num-seqs", "1,4", "--gpu", "L40S,H100", "--no-saturation-stop"],
])
def test_a_raised_cap_is_advised_only_from_a_run_that_differs_in_the_cap_alone(tmp_path: Path, command: list[str]) -> None:
    """A tune (or sweep) over --max-num-seqs 1,4 and --gpu L40S,H100: the L40S run's raise
    names the L40S run of the higher cap, not the faster H100's (the GPU's gain is not the
    cap's)."""
    out = tmp_path / "f"
    code, text = invoke(*command, "-c", "4", "-n", "16", "--input-tokens", "200", "--output-tokens", "50", "-o", str(out))
    assert code == 0, text
    code, text = invoke("advise", str(out), "--json")
    assert code == 0, text
    found = [r for r in json.loads(text)["recommendations"] if r["rule"] == "engine_cap"]
    assert found, text
    for r in found:
        base = r["evidence"].split(":", 1)[0]  # (the run the item is on, then what it saw)
        cited = {g["kind"].rsplit("(", 1)[1].rstrip(")") for g in r["gains"] if "in this folder" in g["kind"]}
        assert cited, r
        gpu = "L40S" if "L40S" in base else "H100"
        assert all(gpu in c and ("seqs4" in c or "seqs=4" in c) for c in cited), (base, cited)
