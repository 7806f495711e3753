"""``advise``'s ``split_long_prompts``: rare long prompts beside short ones, where a
smaller per-step budget offers nothing, get long prompts routed to a replica of their
own, predicted against as many replicas behind least-outstanding; a run without long
prompts, or one already split, does not."""

from __future__ import annotations

import json
import random
from pathlib import Path

from click.testing import CliRunner

from inferlab.analysis.advise import advise
from inferlab.cli.main import main


def sim_run(tmp_path: Path, name: str, long_share: float, *args: str) -> Path:
    """``sim run`` on two replicas of 300 requests, Poisson at 20/s: ``long_share`` of
    them 12,000-token prompts, the rest short chats."""
    rng, t, rows = random.Random(7), 0.0, []
    for _ in range(300):
        t += rng.expovariate(20.0)
        long = rng.random() < long_share
        rows.append({"arrival_s": round(t, 4), "input_tokens": 12000 if long else rng.randint(100, 300),
                     "output_tokens": 16 if long else 256})
    trace, out = tmp_path / f"{name}.jsonl", tmp_path / name
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(main, ["sim", "run", "--trace", str(trace), "--max-model-len", "16384", "--enforce-eager",
                                  "--replicas", "2", "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return out


def test_rare_long_prompts_get_a_replica_of_their_own_with_the_short_requests_gain_predicted(tmp_path: Path) -> None:
    a = advise(sim_run(tmp_path, "rare", 0.07, "--router", "least-outstanding"))
    rules = {r.rule: r for r in a.recommendations}
    assert "head_of_line" not in rules and "split_long_prompts" in rules, list(rules)
    rec = rules["split_long_prompts"]
    assert 'router = "split-by-length", long_prompt_tokens = 2048' in rec.change
    assert "--replicas 2 --router split-by-length --long-prompt-tokens 2048 --long-replicas 1" in rec.change
    assert "no GPU added" in rec.note
    gains = {g.metric: g for g in rec.gains}
    ttft, itl = gains["short requests' p90 TTFT ms"], gains["short requests' p99 inter-token gap ms"]
    assert ttft.after < 0.5 * ttft.before and itl.after < itl.before
    assert all("prediction" in g.kind and "against 2 behind least-outstanding" in g.kind for g in rec.gains)
    assert gains["long requests' mean TTFT ms"].after > gains["long requests' mean TTFT ms"].before  # what they pay


def test_no_split_without_long_prompts_or_for_a_run_already_split(tmp_path: Path) -> None:
    short_only = advise(sim_run(tmp_path, "short", 0.0, "--router", "least-outstanding"))
    assert "split_long_prompts" in short_only.checked
    assert all(r.rule != "split_long_prompts" for r in short_only.recommendations)
    split = advise(sim_run(tmp_path, "split", 0.07, "--router", "split-by-length", "--long-prompt-tokens", "2048"))
    assert all(r.rule != "split_long_prompts" for r in split.recommendations)
