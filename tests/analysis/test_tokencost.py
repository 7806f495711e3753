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


def test_a_prompt_sets_ttft_is_each_prompts_own_not_the_ttft_at_its_mean_length() -> None:
    """Prefill grows faster than the length: over short and long prompts the TTFT of a
    prompt of mean length (what was shown) is below the mean of each prompt's TTFT; the
    set's TTFT is the mean, p50 and p99 of each prompt's own, its lengths' p50, p99, max."""
    tok = BuiltinTokenizer()
    specs = [RequestSpec("what is the cache " * 5)] * 3 + [RequestSpec("what is the cache " * 400)] * 2
    quadratic = lambda n: (n / 1000) ** 2  # noqa: E731  # (seconds: a prefill that grows faster than its length)
    c = token_cost(specs, tok, quadratic, "quadratic")
    lengths = sorted(len(tok.apply_chat_template(s.messages())) for s in specs)
    each = [quadratic(n) * 1e3 for n in lengths]
    assert c.ttft_ms == pytest.approx(sum(each) / 5) and c.ttft_ms > quadratic(round(c.total_tokens)) * 1e3 * 1.5
    assert c.ttft_p50_ms == pytest.approx(each[2]) and c.ttft_p99_ms == pytest.approx(each[3] + 0.96 * (each[4] - each[3]))
    assert (c.total_tokens_p50, c.total_tokens_max, c.ttft_prompts) == (lengths[2], lengths[4], 5)


def test_system_and_developer_messages_are_the_system_prompt_wherever_they_are(tmp_path: Path) -> None:
    """A system message that is not first was counted as chat template, a first
    developer message as user content: each is counted by its role."""
    tok = BuiltinTokenizer()
    later = RequestSpec("why", context=(("user", "what is the cache"), ("assistant", "the text"),
                                        ("system", "answer with the text")))
    c = token_cost([later], tok, None, "")
    assert (c.system_tokens, c.user_tokens) == (4, 4 + 2 + 1)
    assert c.template_tokens == c.total_tokens - 11
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "developer", "content": "answer with the text"},
                                             {"role": "user", "content": "what is the cache"}]}) + "\n")
    # (--system goes to rows without a system prompt of their own: a developer message is one)
    j = json.loads(run("--dataset", str(data), "--system", "be brief", "--prefill-tps", "1000", "--json").stdout)
    assert (j["system_tokens"], j["user_tokens"]) == (4, 4)


def test_system_with_a_dataset_says_the_prompts_it_went_to(tmp_path: Path) -> None:
    """--system goes only to rows without a system prompt of their own: where rows have
    one, the flag was silently not counted (a 28-token --system showed 5 tokens, the rows')."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "system", "content": "answer with the text"},
                                             {"role": "user", "content": "what is the cache"}]}) + "\n"
                    + json.dumps({"prompt": "why"}) + "\n")
    p = run("--dataset", str(data), "--system", "be brief", "--prefill-tps", "1000")
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stdout.split())
    assert "--system went to 1 of the 2 prompts: the other 1 have a system or developer message of their own" in flat
    j = json.loads(run("--dataset", str(data), "--system", "be brief", "--prefill-tps", "1000", "--json").stdout)
    assert j["system_added_to_prompts"] == 1
    every = run("--dataset", str(data), "--prefill-tps", "1000", "--json")  # (no --system: nothing to say)
    assert "system_added_to_prompts" not in json.loads(every.stdout)


def test_a_prompt_beyond_the_models_context_shows_its_counts_and_says_why_no_ttft(tmp_path: Path) -> None:
    """A 240,000-word prompt: the counts were computed, then the simulator refused a
    max_model_len the user never set (an error, no counts)."""
    huge = tmp_path / "huge.txt"
    huge.write_text(("what is the cache " * 60_000).strip())
    p = run("--prompt", f"@{huge}")
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stdout.split())
    assert "│ user content │ 240,000 │" in flat
    assert "not available: the prompt (240,0" in flat and "exceeds the model's context of 32,768 tokens" in flat
    j = json.loads(run("--prompt", f"@{huge}", "--json").stdout)
    assert j["ttft_ms"] is None and j["context_tokens"] == 32_768 and j["user_tokens"] == 240_000
    # a set: the TTFT is over the prompts the context holds, and says so
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "what is the cache " * 60_000}) + "\n" + '{"prompt": "why"}\n')
    p = run("--dataset", str(data))
    assert p.returncode == 0, p.stderr
    assert "over the 1 of 2 prompts within the model's context of 32,768 tokens (1 longer)" in " ".join(p.stdout.split())


def test_an_unusable_text_file_or_an_empty_value_is_a_one_line_error(tmp_path: Path) -> None:
    """An empty @FILE was measured as an empty part (an empty system prompt is no system
    message at all), --system "" and --tokenizer "" were dropped in silence, and a file
    that is not UTF-8 said only the codec's words."""
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / "bin.dat").write_bytes(b"\xce\x01\xff\xfe")
    for args, needle in (
        (("--system", f"@{tmp_path / 'empty.txt'}", "--prompt", "x"), "empty.txt: the file holds no text"),
        (("--prompt", f"@{tmp_path / 'empty.txt'}"), "empty.txt: the file holds no text"),
        (("--prompt", f"@{tmp_path / 'bin.dat'}"), "bin.dat: not UTF-8 text (invalid continuation byte at byte 0)"),
        (("--prompt", "@"), "--prompt @: give a file name after the @"),
        (("--system", "", "--prompt", "x"), "--system: empty"),
        (("--prompt", "x", "--tokenizer", ""), "--tokenizer: empty"),
    ):
        p = run(*args)
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)


def test_the_ttft_is_the_tokenizers_model_where_the_simulator_knows_it(tmp_path: Path, tokenizer_path: str) -> None:
    """The TTFT was always the default model's (Qwen2.5-7B), whatever model --tokenizer
    was: the tokenizer's own is simulated where the simulator knows it (here by its
    folder's name), and said where it does not; each TTFT says what it is."""
    known = tmp_path / "Qwen3-32B"
    known.mkdir()
    (known / "tokenizer.json").write_text(Path(tokenizer_path).read_text())
    args = ("--prompt", "what is the cache", "--system", "answer with the text", "--json")
    mine = json.loads(run("--tokenizer", str(known), *args).stdout)
    told = json.loads(run("--tokenizer", str(known), "--model", "Qwen3-32B", *args).stdout)
    default = json.loads(run("--tokenizer", str(known), "--model", "Qwen/Qwen2.5-7B-Instruct", *args).stdout)
    assert mine["ttft_ms"] == told["ttft_ms"] != default["ttft_ms"]
    assert mine["prefill_source"].startswith(str(known)) and mine["ttft_basis"].startswith("a prediction by inferlab's simulator: one request alone")
    p = run("--tokenizer", tokenizer_path, "--prompt", "what is the cache")  # (a folder named tok0...)
    assert p.returncode == 0 and "the simulator does not know the tokenizer's model" in " ".join(p.stdout.split())
    rate = json.loads(run("--prompt", "x", "--prefill-tps", "1000", "--json").stdout)
    assert rate["ttft_basis"].startswith("the prompt's tokens / --prefill-tps")
