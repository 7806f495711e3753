"""``inferlab tokens``: the parts of a prompt in tokens, the system/template share, and
the TTFT they cost at a prefill rate or on the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.analysis.tokencost import rate_prefill, sim_prefill, token_cost
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.spec import RequestSpec


def test_parts_add_up_and_the_template_is_what_chatml_adds() -> None:
    tok = BuiltinTokenizer()
    spec = RequestSpec("what is the cache", system="answer with the text")
    c = token_cost([spec], tok, rate_prefill(1000.0), "1000 tokens/s")
    assert (c.system_tokens, c.user_tokens) == (4, 4)
    assert c.total_tokens == len(tok.apply_chat_template(spec.messages()))
    assert c.template_tokens == c.total_tokens - 8 > 0
    assert c.overhead_share == pytest.approx((4 + c.template_tokens) / c.total_tokens)
    assert c.ttft_ms == pytest.approx(c.total_tokens)  # 1 ms per token at 1000 tokens/s
    assert c.ttft_saved_ms == pytest.approx(c.total_tokens - 4)


def test_simulated_prefill_grows_with_length() -> None:
    f = sim_prefill("Qwen/Qwen2.5-7B-Instruct", "H100")
    assert 0 < f(100) < f(4000)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", "tokens", *args], capture_output=True, text=True, timeout=120)


def test_cli_over_a_dataset_with_a_system_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "sys.txt").write_text("answer with the text")
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "what is the cache"}\n{"prompt": "why"}\n')
    p = run("--system", f"@{tmp_path / 'sys.txt'}", "--dataset", str(data), "--json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)
    assert c["prompts"] == 2 and c["system_tokens"] == 4 and c["user_tokens"] == 2.5
    assert c["ttft_saved_ms"] > 0 and c["prefill_source"].endswith(" (prediction)")
    p = run("--prompt", "hi", "--system", "be brief", "--prefill-tps", "2000")
    assert p.returncode == 0 and "chat template" in p.stdout and "system + template share" in p.stdout
    p = run("--prompt", "hi", "--system", "be brief")  # the simulator's prefill: a prediction, said as everywhere
    assert p.returncode == 0 and "(prediction)):" in p.stdout and "simulated" not in p.stdout


@pytest.mark.parametrize(("args", "needle"), [
    ((), "give --prompt, --system or --dataset"),
    (("--prompt", "@/no/such/file"), "--prompt @/no/such/file"),
    (("--prompt", "x", "--prefill-tps", "0"), "--prefill-tps 0: must be at least 1 token/s"),
    (("--prompt", "x", "--gpu", "nope"), "unknown GPU"),
    # (each was accepted: a 300-digit TTFT; --model, --gpu and --dataset-format ignored)
    (("--prompt", "x", "--prefill-tps", "1e-300"), "--prefill-tps 1e-300: must be at least 1 token/s"),
    (("--prompt", "x", "--prefill-tps", "1000", "--model", "nosuch"), "--model: only the simulated prefill uses it"),
    (("--prompt", "x", "--prefill-tps", "1000", "--gpu", "A100"), "--gpu: only the simulated prefill uses it"),
    (("--prompt", "x", "--dataset-format", "csv"), "--dataset-format: give --dataset too"),
])
def test_cli_errors_are_one_line(args: tuple[str, ...], needle: str) -> None:
    p = run(*args)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cli_says_builtin_counts_are_approximate_and_shows_whole_tokens_for_one_prompt(tmp_path: Path) -> None:
    p = run("--prompt", "what is the cache", "--system", "answer with the text", "--prefill-tps", "1000")
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stdout.split())
    assert "approximate" in flat and "--tokenizer" in flat
    cells = [line.split("│")[1:3] for line in p.stdout.splitlines() if line.startswith("│ system prompt")]
    assert [c.strip() for c in cells[0]] == ["system prompt", "4"]
    j = json.loads(run("--prompt", "what is the cache", "--prefill-tps", "1000", "--json").stdout)
    assert j["approximate"] is True
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "what is the cache"}\n{"prompt": "why"}\n')
    p = run("--dataset", str(data), "--prefill-tps", "1000")
    assert "2.5" in p.stdout  # means over a prompt set keep their decimals
