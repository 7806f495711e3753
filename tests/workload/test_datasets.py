"""Datasets from local files: the readers, sampling, length filters, empirical lengths,
bad rows, and runs through bench (HTTP) and sim run (virtual time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab import BenchConfig, ClosedLoop, LoadConfig, UsageError, WorkloadConfig, bench_async
from inferlab.load.virtual import simulate
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.builtin_tokenizer import BuiltinTokenizer
from inferlab.workload.datasets import DatasetConfig, DatasetWorkload, read_dataset
from inferlab.workload.lengths import parse_length


def jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sharegpt(path: Path) -> str:
    data = [
        {"conversations": [{"from": "human", "value": "what is a cache"}, {"from": "gpt", "value": "a b c d e"}]},
        {"conversations": [{"from": "gpt", "value": "orphan answer"}]},  # no prompt: skipped
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "why"},
                           {"from": "gpt", "value": "x y"}, {"from": "human", "value": "later"}]},
    ]
    path.write_text(json.dumps(data))
    return str(path)


def test_the_three_formats(tmp_path: Path) -> None:
    rows = read_dataset(jsonl(tmp_path / "d.jsonl", [
        {"prompt": "hello there", "max_tokens": 5},
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
                      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}],
         "output_tokens": 7},
    ]))
    assert [r.max_tokens for r in rows] == [5, 7]
    spec = rows[1].spec(7, True)
    assert spec.system == "sys" and spec.prompt == "q2" and spec.context == (("user", "q1"), ("assistant", "a1"))
    assert [m["role"] for m in spec.messages()] == ["system", "user", "assistant", "user"]
    assert spec.completion_prompt() == "sys\n\nq1\n\na1\n\nq2"

    with pytest.warns(UserWarning, match="1 of 3 conversations skipped: no user turn answered"):
        sg = read_dataset(sharegpt(tmp_path / "sg.json"))
    assert [(r.messages, r.output_length) for r in sg] == [
        ((("user", "what is a cache"),), 5),
        ((("system", "be brief"), ("user", "why")), 2),
    ]
    csv = tmp_path / "d.csv"
    csv.write_text('prompt,max_tokens\n"a, quoted prompt",3\nplain,\n')
    assert [(r.messages[0][1], r.max_tokens) for r in read_dataset(str(csv))] == [("a, quoted prompt", 3), ("plain", None)]


@pytest.mark.parametrize(("content", "name", "needle"), [
    ('{"prompt": "ok"}\n{"prompt": ""}\n', "d.jsonl", r"d\.jsonl:2: needs 'prompt'"),
    ('{"prompt": "ok"}\n\n{"prompt": "x", "max_tokens": -1}\n', "d.jsonl", r"d\.jsonl:3: max_tokens must be a positive integer"),
    ('{"prompt": "ok"}\n{oops\n', "d.jsonl", r"d\.jsonl:2: not valid JSON"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n', "d.jsonl", r"d\.jsonl:1: the last message must be from the user"),
    ("text,other\nx,y\n", "d.csv", r"d\.csv:1: a CSV dataset needs a 'prompt' column"),
    ("prompt,max_tokens\nx,3\ny,lots\n", "d.csv", r"d\.csv:3: max_tokens must be a positive integer, got 'lots'"),
    # infinity (JSON's Infinity, a CSV's "inf") overflowed int(): an internal error
    ('{"prompt": "x", "max_tokens": Infinity}\n', "d.jsonl", r"d\.jsonl:1: max_tokens must be a positive integer, got inf"),
    ("prompt,max_tokens\nx,inf\n", "d.csv", r"d\.csv:2: max_tokens must be a positive integer, got 'inf'"),
    ('{"prompt": "x", "max_tokens": 1e300}\n', "d.jsonl", r"d\.jsonl:1: max_tokens must be at most 10,000,000"),
    ('[{"conversations": [{"from": "human"}]}]', "d.json", r"d\.json: entry 0: each turn needs"),
    ("[]", "d.json", "the dataset has no prompts"),
    # an empty last user message was sent, where an empty 'prompt' is refused; a
    # malformed 'messages' beside a 'prompt' was ignored
    ('{"messages": [{"role": "user", "content": " "}]}\n', "d.jsonl", r"d\.jsonl:1: the last user message is empty"),
    ('{"prompt": "hi", "messages": 5}\n', "d.jsonl", r"d\.jsonl:1: give 'prompt' or 'messages', not both"),
    # an unclosed quote swallowed the rest of the file into one prompt; a row with more
    # or fewer fields than the header lost or lacked them
    ('prompt,max_tokens\nhello,5\n"unterminated,3\nnext,4\n', "d.csv", r"d\.csv:3: malformed CSV row"),
    ('prompt,max_tokens\n"a"b,5\n', "d.csv", r"d\.csv:2: malformed CSV row"),
    ("prompt,max_tokens\nhello,5\nhi,5,extra\n", "d.csv", r"d\.csv:3: 3 fields, but the header has 2"),
    ("prompt,max_tokens\nhello\n", "d.csv", r"d\.csv:2: 1 field, but the header has 2"),
    ("hello", "d.txt", "cannot tell the dataset format"),
])
def test_bad_files_name_the_file_line_and_problem(tmp_path: Path, content: str, name: str, needle: str) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(UsageError, match=needle):
        read_dataset(str(p))


def test_sampling_and_filters(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": " ".join(["w"] * n)} for n in range(1, 11)])
    without = DatasetWorkload(DatasetConfig(path).rows(), "without-replacement", None, seed=1)
    drawn = [len(str(s.prompt).split()) for s in without]
    assert sorted(drawn) == list(range(1, 11)) and drawn != list(range(1, 11))  # shuffled, each once
    assert without.exhausted and "ran out after its 10 prompts" in without.warnings()[0]
    again = DatasetWorkload(DatasetConfig(path).rows(), "without-replacement", None, seed=1)
    assert [len(str(s.prompt).split()) for s in again] == drawn  # seeded
    with_r = DatasetWorkload(DatasetConfig(path).rows(), "with-replacement", parse_length(4, "--output-tokens"))
    many = [next(with_r) for _ in range(100)]
    assert len({s.prompt for s in many}) == 10 and {s.max_tokens for s in many} == {4}
    assert with_r.warnings() == ["100 requests drawn (with replacement) from 10 distinct prompts of the 10 used: some "
                                 "prompts were sent more than once"]
    words = jsonl(tmp_path / "w.jsonl", [{"prompt": " ".join(["the"] * n)} for n in range(1, 11)])
    kept = DatasetConfig(words, min_input_tokens=3, max_input_tokens=5).rows(BuiltinTokenizer())
    assert [len(r.messages[0][1].split()) for r in kept] == [3, 4, 5]  # "the" is one token each
    with pytest.raises(UsageError, match="no prompt within"):
        DatasetConfig(words, min_input_tokens=50).rows(BuiltinTokenizer())
    with pytest.raises(UsageError, match="count tokens: give --tokenizer"):  # words are no tokens
        DatasetConfig(words, min_input_tokens=3).rows()
    with pytest.raises(UsageError, match="--sample"):
        DatasetConfig(path, sample="sometimes")  # type: ignore[arg-type]


def test_empirical_lengths_from_a_dataset(tmp_path: Path) -> None:
    path = sharegpt(tmp_path / "sg.json")
    inp = parse_length(f"empirical:{path}", "--input-tokens")
    out = parse_length(f"empirical:{path}", "--output-tokens")
    assert sorted(inp.values) == [3, 4] and sorted(out.values) == [2, 5]
    specs = WorkloadConfig(input_tokens=f"empirical:{path}").build(0)
    assert {next(specs).input_tokens for _ in range(50)} == {3, 4}  # type: ignore[call-overload]


def test_empirical_sharegpt_is_the_shipped_table_of_a_published_run() -> None:
    inp = parse_length("empirical:ShareGPT", "--input-tokens")
    out = parse_length("empirical:sharegpt", "--output-tokens")
    # the published run's totals (total_input_tokens / total_output_tokens of its result)
    assert len(inp.values) == 1280 and sum(inp.values) == 283459
    assert sum(out.values) == 233412 and 0 not in out.values  # requests with no text dropped
    assert max(inp.values) <= 1024  # vLLM's sampler caps prompts at 1,024 tokens
    specs = WorkloadConfig(input_tokens="empirical:sharegpt", output_tokens="empirical:sharegpt").build(0)
    drawn = [next(specs) for _ in range(200)]  # type: ignore[call-overload]
    assert all(s.input_tokens in inp.values and s.max_tokens in out.values for s in drawn)
    # each request's two lengths are one row's, as vLLM's sampler picks a prompt with its
    # own answer (drawn apart, most pairs would be no row's)
    rows = set(inp.pairs)
    assert len(rows) > 1000 and all((s.input_tokens, s.max_tokens) in rows for s in drawn)
    assert len({(s.input_tokens, s.max_tokens) for s in drawn}) > 150  # (not one row over and over)


def test_empirical_lengths_of_two_sources_or_one_side_are_drawn_apart(tmp_path: Path) -> None:
    path = sharegpt(tmp_path / "sg.json")
    from inferlab.workload.lengths import sample_pair

    rng = __import__("random").Random(0)
    inp, out = parse_length(f"empirical:{path}", "--input-tokens"), parse_length(f"empirical:{path}", "--output-tokens")
    assert {sample_pair(inp, out, rng) for _ in range(100)} == set(inp.pairs)  # one source: its rows
    other = parse_length("empirical:sharegpt", "--output-tokens")
    mixed = {sample_pair(inp, other, rng) for _ in range(100)}
    assert {i for i, _ in mixed} == {3, 4} and {o for _, o in mixed} <= set(other.values) and len(mixed) > 10


def test_sim_run_stops_when_the_dataset_runs_out(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": f"prompt number {i}", "max_tokens": 3} for i in range(5)])
    wl = WorkloadConfig(dataset=DatasetConfig(path)).build(0)
    records = simulate(Engine(EngineConfig()), LoadConfig(ClosedLoop(2), num_requests=8), wl)  # type: ignore[arg-type]
    assert len(records) == 5 and all(r.output_tokens == 3 for r in records)
    assert isinstance(wl, DatasetWorkload) and wl.exhausted


async def test_bench_sends_dataset_messages_and_lengths(tmp_path: Path) -> None:
    path = sharegpt(tmp_path / "sg.json")
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=4),
                      workload=WorkloadConfig(dataset=DatasetConfig(path, sample="with-replacement")))
    with EmbeddedServer(ServerConfig(EngineConfig())) as sim:
        s = (await bench_async(cfg, sim.url)).summary
    assert s.counts.completed == 4
    assert s.input_length_source == "prompt text as given"
    assert s.output_tokens in range(8, 21)  # 2 or 5 tokens each
    # the answers' lengths are words (no --tokenizer): said, as they were taken as tokens
    # silently (whether the client kept its schedule depends on the machine's load)
    assert [w for w in s.warnings if "fell behind" not in w and "client was likely the bottleneck" not in w
            and "conversations skipped" not in w and "drawn (with replacement)" not in w] == [
        "output lengths are the dataset answers' word counts (no --tokenizer): approximate, fewer tokens than the "
        "answers (words undercount tokens), each asked for exactly"]
    cfg = BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2),  # (lengths given: nothing to say)
                      workload=WorkloadConfig(dataset=DatasetConfig(path), output_tokens=3))
    words = WorkloadConfig(input_tokens=f"empirical:{path}", output_tokens=f"empirical:{path}")
    with EmbeddedServer(ServerConfig(EngineConfig())) as sim:
        assert not [w for w in (await bench_async(cfg, sim.url)).summary.warnings if "word counts" in w]
        s = (await bench_async(BenchConfig(load=LoadConfig(ClosedLoop(1), num_requests=2), workload=words), sim.url)).summary
    assert [w for w in s.warnings if "word counts" in w] == [
        f"--input-tokens empirical:{path}: the file's prompt lengths are word counts, taken as tokens (words "
        "undercount tokens)",
        f"--output-tokens empirical:{path}: its answers' lengths (a ShareGPT file's) are word counts, taken as tokens "
        "(words undercount tokens); its max_tokens/output_tokens are tokens"]


def test_cli_dataset_errors_and_exhaustion(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "inferlab", "sim", "run", *args],
                              capture_output=True, text=True, timeout=120)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"max_tokens": 3}\n')
    p = run("--dataset", str(bad), "-n", "2")
    assert p.returncode == 2 and f"{bad}:2: needs 'prompt'" in p.stderr and "Traceback" not in p.stderr
    good = jsonl(tmp_path / "d.jsonl", [{"prompt": f"p {i}", "max_tokens": 2} for i in range(3)])
    p = run("--dataset", good, "-n", "10", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["counts"]["completed"] == 3 and any("ran out" in w for w in s["warnings"])
    p = run("--min-input-tokens", "3", "-n", "2")
    assert p.returncode == 2 and "--min-input-tokens needs --dataset" in p.stderr


def test_line_breaks_inside_a_prompt_stay_in_it(tmp_path: Path) -> None:
    """A JSONL line ends at \\n only (JSON strings may hold U+2028 as it is), and a CSV row
    at a line break outside quotes: a quoted prompt keeps its line breaks, and a \\x0c
    in it does not split the row."""
    lines = tmp_path / "d.jsonl"
    lines.write_text(json.dumps({"prompt": "one\u2028two"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [r.messages for r in read_dataset(str(lines))] == [(("user", "one\u2028two"),)]
    table = tmp_path / "d.csv"
    table.write_text('prompt,max_tokens\r\n"first\nsecond\r\nthird",5\r\n"form\x0cfeed",6\r\nplain,7\r\n', encoding="utf-8", newline="")
    rows = read_dataset(str(table))
    assert [(r.messages[0][1], r.max_tokens) for r in rows] == [
        ("first\nsecond\r\nthird", 5), ("form\x0cfeed", 6), ("plain", 7),
    ]


def test_a_byte_order_mark_is_no_part_of_the_first_column(tmp_path: Path) -> None:
    """Spreadsheets save CSV with a UTF-8 byte-order mark: the header is still 'prompt'
    (and a JSONL file starting with one still parses)."""
    table = tmp_path / "d.csv"
    table.write_bytes(b"\xef\xbb\xbfprompt,max_tokens\nhello there,5\n")
    assert [(r.messages, r.max_tokens) for r in read_dataset(str(table))] == [((("user", "hello there"),), 5)]
    lines = tmp_path / "d.jsonl"
    lines.write_bytes(b'\xef\xbb\xbf{"prompt": "hi"}\n')
    assert [r.messages for r in read_dataset(str(lines))] == [(("user", "hi"),)]


async def test_rows_left_out_and_prompts_sent_again_are_in_the_summary(tmp_path: Path) -> None:
    """A length filter that kept 2 of 10 rows, and 6 requests drawn from those 2, said
    nothing in the summary; skipped ShareGPT conversations were said on stderr only."""
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": " ".join(["the"] * n), "max_tokens": 2} for n in range(1, 11)])
    wcfg = WorkloadConfig(dataset=DatasetConfig(path, sample="with-replacement", max_input_tokens=2))
    wl = wcfg.build(0, counter=BuiltinTokenizer())
    assert isinstance(wl, DatasetWorkload)
    records = simulate(Engine(EngineConfig()), LoadConfig(ClosedLoop(1), num_requests=6), wl)  # type: ignore[arg-type]
    assert len(records) == 6
    assert wl.warnings() == [
        f"{path}: 2 of 10 prompts kept: the others are outside --min-input-tokens/--max-input-tokens (1–2 tokens)",
        "6 requests drawn (with replacement) from 2 distinct prompts of the 2 used: some prompts were sent more than once",
    ]
    with pytest.warns(UserWarning, match="1 of 3 conversations skipped"):
        sg = WorkloadConfig(dataset=DatasetConfig(sharegpt(tmp_path / "sg.json")), output_tokens=2).build(0)
    assert isinstance(sg, DatasetWorkload) and any("1 of 3 conversations skipped" in w for w in sg.warnings())
