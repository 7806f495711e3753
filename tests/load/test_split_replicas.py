"""``sim run --replicas N --router split-by-length``: rare long prompts on a replica of
their own keep the short requests' TTFT down, in virtual time (the same workload, the
same numbers: orderings and ratios only)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from inferlab.cli.main import main
from inferlab.results.metrics import request_metrics
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import read_records

LONG_TOKENS = 12000
SHORT_MAX = 512


def rare_long_trace(path: Path) -> None:
    """300 requests, Poisson at 20/s: 7 % of them 12,000-token prompts, the rest short chats."""
    rng, t, rows = random.Random(7), 0.0, []
    for _ in range(300):
        t += rng.expovariate(20.0)
        long = rng.random() < 0.07
        rows.append({"arrival_s": round(t, 4), "input_tokens": LONG_TOKENS if long else rng.randint(100, 300),
                     "output_tokens": 16 if long else 256})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def short_ttft_p90(records: list[RequestRecord]) -> float:
    return p90([t for r in records if r.ok and (r.input_tokens or 0) <= SHORT_MAX
                for t in [request_metrics(r).ttft_ms] if t is not None])


def sim(tmp_path: Path, name: str, *args: str) -> tuple[dict[str, Any], list[RequestRecord]]:
    trace = tmp_path / "rare.jsonl"
    if not trace.exists():
        rare_long_trace(trace)
    out = tmp_path / name
    r = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "--max-model-len", "16384", "--enforce-eager",
                                  "--replicas", "2", "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return json.loads((out / "config.json").read_text()), list(read_records(out / "requests.jsonl"))


def test_long_prompts_on_a_replica_of_their_own_cut_the_short_requests_ttft_p90(tmp_path: Path) -> None:
    _, plain = sim(tmp_path, "lo", "--router", "least-outstanding")
    config, split = sim(tmp_path, "split", "--router", "split-by-length", "--long-prompt-tokens", "2048")
    assert config["replicas"] == {"count": 2, "router": "split-by-length", "long_prompt_tokens": 2048, "long_replicas": 1}
    assert sum(1 for r in split if (r.input_tokens or 0) >= LONG_TOKENS) == 25  # (the same workload)
    # least-outstanding already steers short requests away from a replica prefilling a
    # long prompt, but not from the one it lands on next: the split keeps them off it
    assert short_ttft_p90(split) < 0.5 * short_ttft_p90(plain)
    # the long prompts pay: they share one replica
    long_ttft = [[request_metrics(r).ttft_ms or 0.0 for r in rs if (r.input_tokens or 0) >= LONG_TOKENS] for rs in (plain, split)]
    assert sum(long_ttft[1]) > sum(long_ttft[0])


@pytest.mark.parametrize(("args", "words"), [
    (["--replicas", "2", "--router", "least-outstanding", "--long-prompt-tokens", "2048"], "act with --router split-by-length"),
    (["--replicas", "2", "--long-replicas", "1"], "act with --router split-by-length (the default router is round-robin)"),
    (["--replicas", "2", "--router", "split-by-length"], "needs --long-prompt-tokens"),
    (["--replicas", "2", "--router", "split-by-length", "--long-prompt-tokens", "2048", "--long-replicas", "2"],
     "from 1 to 1 of the 2 replicas"),
    (["--router", "split-by-length", "--long-prompt-tokens", "2048"], "--replicas"),
])
def test_split_flags_that_would_do_nothing_are_refused(args: list[str], words: str) -> None:
    r = CliRunner().invoke(main, ["sim", "run", "-n", "5", *args])
    assert r.exit_code == 2 and words in r.output, r.output


@pytest.mark.parametrize(("threshold", "words"), [
    ("20000", "no prompt reached the --long-prompt-tokens threshold of 20,000: the long replicas took none"),
    ("1", "every prompt was 1+ tokens: the short replicas took none"),
])
def test_a_split_one_pool_of_which_took_nothing_is_said(tmp_path: Path, threshold: str, words: str) -> None:
    """A threshold no prompt reaches (or every prompt does) ran one engine of two, and
    said nothing: the summary says so, with each replica's count."""
    def warned(name: str, t: str) -> list[str]:
        sim(tmp_path, name, "--router", "split-by-length", "--long-prompt-tokens", t)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        return [w for w in summary["warnings"] if w.startswith("split-by-length:")]

    said = warned(f"t{threshold}", threshold)
    assert len(said) == 1 and words in said[0], said
    assert "requests per replica: 300, 0" in said[0] or "requests per replica: 0, 300" in said[0]
    assert warned("t2048", "2048") == []
