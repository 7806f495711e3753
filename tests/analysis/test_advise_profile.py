"""``inferlab advise`` on a profile: the decode ladder's knee is put down to what made
it (the KV cache, or the GPU), and a change is offered only where it gains something.
The ladders here are ``sim run`` directories (virtual time) laid out as a profile's
``decode/cN`` runs, with the ``profile.json`` the profiler would write for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from inferlab.analysis.advise import advise
from inferlab.analysis.fits import knee
from inferlab.analysis.profile import PROFILE_FILE, Factor, Profile
from inferlab.cli.main import main
from inferlab.results.metrics import SLO

LADDER = (1, 2, 4, 8, 16, 32, 64)


def write_profile(folder: Path, factors: list[Factor], engine: dict[str, Any] | None = None) -> None:
    prof = Profile(None, "m", engine, 4096, "server", 60.0, 50.0, SLO(2000.0, 100.0), factors)
    (folder / PROFILE_FILE).write_text(json.dumps(prof.to_json()))


def decode_factor(rows: list[dict[str, Any]], runs: list[str] | None = None, output_tokens: int = 32) -> Factor:
    k = knee([r["concurrency"] for r in rows], [r["output_tps"] for r in rows], [None] * len(rows))
    data = {"points": rows, "knee_concurrency": k.knee_concurrency, "best_goodput_concurrency": None,
            "output_tokens": output_tokens}
    return Factor("decode", "decode (concurrency)", "x", "y", data, runs or [])


def ladder_profile(folder: Path, input_tokens: int, *flags: str) -> None:
    """The profile's decode ladder (closed loops of 2×c requests, 32 output tokens) as
    sim runs with ``flags``, and its profile.json."""
    rows, runs = [], []
    for c in LADDER:
        name = f"decode/c{c}"
        res = CliRunner().invoke(main, ["sim", "run", "-c", str(c), "-n", str(max(2 * c, 4)), "--api", "chat",
                                        "--input-tokens", str(input_tokens), "--output-tokens", "32", *flags,
                                        "-o", str(folder / name)])
        assert res.exit_code == 0, res.output
        s = json.loads((folder / name / "summary.json").read_text())
        rows.append({"concurrency": c, "completed": s["counts"]["completed"], "tpot_ms_p50": s["tpot_ms"]["p50"],
                     "ttft_ms_p50": s["ttft_ms"]["p50"], "e2e_ms_p50": s["e2e_ms"]["p50"],
                     "output_tps": s["output_token_throughput_tps"], "goodput_rps": None, "interrupted": False})
        runs.append(name)
    engine = json.loads((folder / "decode/c1/config.json").read_text())["engine"]
    write_profile(folder, [decode_factor(rows, runs)], engine)


def test_a_knee_the_kv_cache_made_is_put_down_to_the_cache_not_capped(tmp_path: Path) -> None:
    """A KV cache of 120 blocks: past 16 requests in flight the cache is full and
    requests are preempted. advise said "cap requests in flight at about 16
    (--max-num-seqs 16)", whose own gains were worse (and a cap gives the cache no
    room); now it names the KV cache and the flag that fixes its size."""
    ladder_profile(tmp_path, 128, "--num-gpu-blocks-override", "120", "--max-model-len", "1024")
    recs = advise(tmp_path).recommendations
    rules = [r.rule for r in recs]
    assert "concurrency_cap" not in rules and "kv_pressure" in rules, rules
    kv = next(r for r in recs if r.rule == "kv_pressure")
    assert "preemptions" in kv.evidence and "--num-gpu-blocks-override" in kv.change
    assert "--max-num-seqs" not in kv.change


def test_a_knee_of_the_gpu_gets_a_cap_that_says_what_it_costs_the_held_back_requests(tmp_path: Path) -> None:
    """2,000-token prompts on an L40S: past 16 the GPU is the limit (no preemption), and
    TPOT doubles. The cap is advised, with the TTFT the requests it holds back pay."""
    ladder_profile(tmp_path, 2000, "--gpu", "L40S")
    recs = advise(tmp_path).recommendations
    cap = next(r for r in recs if r.rule == "concurrency_cap")
    assert "kv_pressure" not in [r.rule for r in recs]
    assert "--max-num-seqs 16" in cap.change
    ttft = next(g for g in cap.gains if g.metric.startswith("TTFT"))
    assert "wait" in ttft.metric and ttft.kind.startswith("estimate") and "TTFT" in cap.note


def test_a_cap_whose_every_gain_is_a_loss_is_not_advised(tmp_path: Path) -> None:
    """Throughput flat past 16 (a knee), and TPOT no better at 16 than at 64: a cap at 16
    would give throughput up and gain no latency of the running streams."""
    rows = [{"concurrency": c, "tpot_ms_p50": 9.8 if c >= 16 else 9.0, "ttft_ms_p50": 20.0 * c, "e2e_ms_p50": 400.0,
             "output_tps": min(c, 16) * 60.0 * (1.0 + 0.01 * (c > 16)), "goodput_rps": None} for c in LADDER]
    write_profile(tmp_path, [decode_factor(rows)])
    assert "concurrency_cap" not in [r.rule for r in advise(tmp_path).recommendations]
    # (the same ladder with TPOT rising past 16: the cap has a gain, and is advised)
    for r in rows:
        r["tpot_ms_p50"] = 9.0 * max(1.0, r["concurrency"] / 16)
    write_profile(tmp_path, [decode_factor(rows)])
    assert "concurrency_cap" in [r.rule for r in advise(tmp_path).recommendations]


def test_a_profiles_long_template_is_left_to_the_prefix_cache_that_serves_it_or_would(tmp_path: Path) -> None:
    """A 1,666-token template, 41 ms of prefill a request. Where the profile's prefix
    cache factor saw a shared prefix save TTFT, the cache serves the template too (it
    opens every prompt unchanged): advise said "use a leaner chat template" all the
    same; now nothing. Where it saved none, advise now says turn prefix caching on."""
    prefill = Factor("prefill", "prefill", "x", "y", {"fit": {"overhead_ms": 10.0, "prefill_tps": 40_000.0, "points": []}})
    template = Factor("template", "chat template", "x", "y", {"overhead_tokens": 1666, "ttft_cost_ms": 41.0})

    def prefix(saved_ms: float) -> Factor:
        return Factor("prefix_cache", "prefix cache", "x", "y", {"prefix_tokens": 1205, "ttft_shared_ms": 81.0 - saved_ms,
                                                                 "ttft_unique_ms": 81.0, "saved_ms": saved_ms})

    write_profile(tmp_path, [prefill, prefix(30.0), template])
    assert "template_overhead" not in [r.rule for r in advise(tmp_path).recommendations]
    write_profile(tmp_path, [prefill, prefix(0.0), template])
    rec = next(r for r in advise(tmp_path).recommendations if r.rule == "template_overhead")
    assert rec.change.startswith("turn prefix caching on") and "TTFT" in rec.evidence


def test_a_profile_lists_as_checked_only_the_rules_whose_factors_it_measured(tmp_path: Path) -> None:
    """A profile of the response cache alone (one detected: nothing to advise). advise
    said "nothing to change: no rule fired (head_of_line, prefix_caching, … checked)"
    of factors the profile says it never measured; now those are listed apart."""
    from rich.console import Console

    from inferlab.cli.advise import render_advice

    factors = [
        Factor("response_cache", "response cache", "x", "y", {"detected": True, "ratio": 0.1, "e2e_repeat_ms": 5.0}),
        Factor("head_of_line", "head of line", "not measured: the budget ran out before it", "", measured=False),
    ]
    write_profile(tmp_path, factors)
    a = advise(tmp_path)
    assert a.recommendations == [] and a.checked == ["response_cache"]
    assert {"head_of_line", "prefix_caching", "concurrency_cap", "template_overhead"} <= set(a.not_measured)
    assert a.to_json()["rules_not_measured"] == a.not_measured
    console = Console(record=True, width=400)
    render_advice(console, a)
    text = console.export_text()
    assert "(response_cache checked; not measured, so not checked: head_of_line" in text, text


def test_a_prefix_that_saved_nothing_is_not_said_to_have_saved_minus_zero(tmp_path: Path) -> None:
    # ("a shared 1,205-token prefix saved -0.0 ms TTFT")
    pc = Factor("prefix_cache", "prefix cache", "x", "y", {"prefix_tokens": 1205, "ttft_shared_ms": 81.01,
                                                           "ttft_unique_ms": 81.0, "saved_ms": -0.01})
    write_profile(tmp_path, [pc])
    rec = next(r for r in advise(tmp_path).recommendations if r.rule == "prefix_caching")
    assert "saved 0.0 ms TTFT" in rec.evidence and "-0.0" not in rec.evidence, rec.evidence


def test_a_template_cost_from_an_untrusted_prefill_line_is_quoted_with_its_caveat(tmp_path: Path) -> None:
    """The template's gain is its tokens × the prefill cost per token: where the
    profile found the prefill line not to be trusted (3 requests per length), the
    recommendation says so beside the number it rests on."""
    quality = {"r2": 0.95, "monotonic": True, "requests_per_point": 3, "trusted": False,
               "caveats": ["3 requests per point (fewer than 5)"]}
    prefill = Factor("prefill", "prefill", "x", "y", {"fit": {"overhead_ms": 10.0, "prefill_tps": 40_000.0, "points": []},
                                                      "quality": quality})
    template = Factor("template", "chat template", "x", "y", {"overhead_tokens": 1666, "ttft_cost_ms": 41.0})
    write_profile(tmp_path, [prefill, template])
    rec = next(r for r in advise(tmp_path).recommendations if r.rule == "template_overhead")
    assert "the prefill rate behind it is not to be trusted: 3 requests per point" in rec.evidence
    assert "not to be trusted" in rec.gains[0].kind
    write_profile(tmp_path, [Factor("prefill", "prefill", "x", "y", {**prefill.data, "quality": {**quality, "trusted": True}}), template])
    rec = next(r for r in advise(tmp_path).recommendations if r.rule == "template_overhead")
    assert "not to be trusted" not in rec.evidence
