"""Behaviour snapshot: run a fixed set of inferlab commands and keep every output, so a
refactoring can be checked to change nothing.

    python bench/behaviour_snapshot.py run /tmp/snap-before      # on the old code
    python bench/behaviour_snapshot.py run /tmp/snap-after       # on the new code
    python bench/behaviour_snapshot.py compare /tmp/snap-before /tmp/snap-after

Each case is one command line (run with ``python -m inferlab`` or a script under
``bench/``) with its stdout, stderr, exit code and every file it wrote. Virtual-time
runs (``sim run``, validation, presets, tokens) must match byte for byte. Runs over
HTTP (``bench`` against the simulated server) vary in their timings, so they are
compared with every time field masked: exit code, config.json (but the port), the
summary's counts and token totals, and each record's non-time fields.

Inputs (traces in every format, datasets, a tokenizer) are generated into the
snapshot directory first, deterministically.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (name, command) — ``{in}`` is the inputs folder, ``{out}`` the case's output folder.
SIM = "sim run"
CASES: list[tuple[str, str]] = [
    # --- sim run: loads -------------------------------------------------------------
    ("sat_preempt", f"{SIM} --model Llama-3.1-8B --gpu L4 --rate inf -n 1500 --input-tokens uniform:200:2000 --output-tokens uniform:50:900 --max-model-len 4096 --out {{out}} --step-log {{steps}}"),
    ("closed_preempt", f"{SIM} --model Llama-3.1-8B --gpu L4 -c 96 -n 500 --input-tokens uniform:300:2500 --output-tokens uniform:100:900 --max-model-len 4096 --warmup 8 --out {{out}} --step-log {{steps}}"),
    ("closed_duration", f"{SIM} -c 8 --duration 20 --warmup 3 --input-tokens 700 --output-tokens 120 --out {{out}}"),
    ("poisson", f"{SIM} --rate 20 --duration 30 --warmup 5 --input-tokens lognormal:800:0.6 --output-tokens uniform:64:512 --out {{out}}"),
    ("gamma_cap", f"{SIM} --rate 50 --arrival gamma --burstiness 0.5 --max-concurrency 16 -n 400 --input-tokens 500 --output-tokens 100 --out {{out}}"),
    ("constant", f"{SIM} --rate 8 --arrival constant -n 100 --input-tokens 300 --output-tokens 60 --seed 7 --out {{out}}"),
    ("burst_served", f"{SIM} --rate inf --served -n 200 --input-tokens 1000 --output-tokens 100 --out {{out}}"),
    ("offline_flag", f"{SIM} -c 16 --offline -n 100 --input-tokens 1000 --output-tokens 100 --out {{out}}"),
    ("prefix_zipf_chat", f"{SIM} --api chat --prefix-groups 8 --prefix-tokens 2000 --suffix-tokens 100 --prefix-popularity zipf -n 300 --rate 10 --output-tokens 64 --out {{out}}"),
    ("prefix_one", f"{SIM} --prefix-tokens 700 -n 50 -c 4 --output-tokens 16 --out {{out}} --step-log {{steps}}"),
    ("natural_len", f"{SIM} --input-tokens 400 -n 80 -c 8 --out {{out}}"),
    ("fixed_prompt_chat", f"{SIM} --api chat -n 20 -c 4 --out {{out}}"),
    ("json_out", f"{SIM} --input-tokens 100 --output-tokens 10 -n 10 -c 2 --json"),
    ("sessions_closed", f"{SIM} --api chat --sessions 8 --turns 4 --think-time-s 1 --system-tokens 100 --context-window-tokens 2000 -c 4 --input-tokens 200 --output-tokens 50 --out {{out}} --step-log {{steps}}"),
    ("sessions_open", f"{SIM} --api chat --sessions 20 --rate 2 --turns 3 --input-tokens 150 --output-tokens 40 --out {{out}}"),
    ("sessions_duration", f"{SIM} --sessions 30 -c 6 --turns 5 --duration 15 --input-tokens 150 --output-tokens 80 --out {{out}}"),
    ("sessions_completions", f"{SIM} --sessions 4 --turns 3 --input-tokens 100 --output-tokens 20 --out {{out}}"),
    # --- sim run: traces and datasets --------------------------------------------------
    ("trace_inferlab", f"{SIM} --trace {{in}}/inferlab.jsonl --out {{out}}"),
    ("trace_inferlab_chat", f"{SIM} --api chat --trace {{in}}/inferlab.jsonl --speedup 2 --trace-start 1 --trace-end 30 --out {{out}}"),
    ("trace_azure", f"{SIM} --trace {{in}}/azure.csv --out {{out}}"),
    ("trace_burstgpt", f"{SIM} --trace {{in}}/burstgpt.csv -n 20 --warmup 2 --out {{out}}"),
    ("trace_mooncake", f"{SIM} --trace {{in}}/mooncake.jsonl --out {{out}}"),
    ("trace_vllm", f"{SIM} --trace {{in}}/vllm.json --gpu H100 --out {{out}}"),
    ("trace_vllm_starts", f"{SIM} --trace {{in}}/vllm_starts.json --out {{out}}"),
    ("trace_requests", f"{SIM} --trace {{in}}/requests.jsonl --duration 5 --out {{out}}"),
    ("trace_unsorted", f"{SIM} --trace {{in}}/unsorted.jsonl --out {{out}}"),
    ("dataset_jsonl", f"{SIM} --dataset {{in}}/data.jsonl -n 30 -c 4 --out {{out}}"),
    ("dataset_sharegpt_chat", f"{SIM} --api chat --dataset {{in}}/sharegpt.json --rate 5 -n 50 --sample with-replacement --max-input-tokens 200 --out {{out}}"),
    ("dataset_runs_out", f"{SIM} --dataset {{in}}/data.csv -n 100 -c 3 --output-tokens 12 --out {{out}}"),
    ("empirical", f"{SIM} --input-tokens empirical:sharegpt --output-tokens empirical:sharegpt -n 200 --rate 4 --out {{out}}"),
    ("empirical_file", f"{SIM} --input-tokens empirical:{{in}}/sharegpt.json --output-tokens empirical:{{in}}/sharegpt.json -n 40 -c 4 --out {{out}}"),
    ("tokenizer", f"{SIM} --tokenizer {{in}}/tok --input-tokens 300 --output-tokens 20 -n 20 -c 4 --out {{out}}"),
    ("tokenizer_chat", f"{SIM} --api chat --tokenizer {{in}}/tok --prefix-tokens 200 --suffix-tokens 30 --output-tokens 20 -n 20 -c 4 --out {{out}}"),
    # --- sim run: engines ---------------------------------------------------------------
    ("fam_vllm_v0_multistep", f"{SIM} --engine-family vllm-v0 --num-scheduler-steps 8 --rate 30 -n 300 --input-tokens 512 --output-tokens 128 --out {{out}} --step-log {{steps}}"),
    ("fam_vllm_v05", f"{SIM} --engine-family vllm-v0.5 --rate inf --served -n 300 --input-tokens 512 --output-tokens 128 --max-model-len 2048 --out {{out}}"),
    ("fam_sglang", f"{SIM} --engine-family sglang --rate 40 -n 300 --input-tokens 512 --output-tokens 128 --out {{out}} --step-log {{steps}}"),
    ("fam_trtllm", f"{SIM} --engine-family trtllm -c 64 -n 400 --input-tokens 1024 --output-tokens 256 -q fp8 --out {{out}}"),
    ("fam_lmdeploy", f"{SIM} --engine-family lmdeploy -c 32 -n 200 --input-tokens 1024 --output-tokens 128 --out {{out}}"),
    ("block1", f"{SIM} --block-size 1 --prefix-tokens 300 -n 100 -c 8 --output-tokens 30 --out {{out}}"),
    ("block128_nocache", f"{SIM} --block-size 128 --no-enable-prefix-caching --no-enable-chunked-prefill --max-model-len 4096 --max-num-batched-tokens 4096 -c 32 -n 200 --input-tokens 900 --output-tokens 200 --out {{out}}"),
    ("moe_tp2_awq", f"{SIM} --model Mixtral-8x7B -tp 2 -q awq --kv-cache-dtype fp8 --gpu A100 --rate 5 -n 60 --input-tokens 2000 --output-tokens 200 --out {{out}}"),
    ("overlap_budget", f"{SIM} --overlap-schedule --max-num-batched-tokens 512 --max-num-seqs 64 --rate 10 -n 150 --input-tokens 1500 --output-tokens 100 --out {{out}}"),
    ("gpu_text", f"{SIM} --gpu 'NVIDIA H100 80GB HBM3' --model Qwen/Qwen2.5-7B-Instruct-AWQ -n 30 -c 4 --input-tokens 200 --output-tokens 30 --out {{out}}"),
    ("efficiencies", f"{SIM} --efficiencies {{in}}/eff.json -n 30 -c 4 --input-tokens 200 --output-tokens 30 --out {{out}}"),
    ("slo", f"{SIM} --rate 30 -n 200 --input-tokens 800 --output-tokens 100 --slo-ttft-ms 200 --slo-tpot-ms 30 --out {{out}}"),
    # --- sim run: failures ---------------------------------------------------------------
    ("all_rejected", f"{SIM} --max-model-len 1024 --input-tokens 2000 --output-tokens 10 -n 5 -c 2 --out {{out}}"),
    ("some_rejected_cap", f"{SIM} --max-model-len 2048 --input-tokens uniform:500:3000 --output-tokens 10 -n 40 --rate 20 --max-concurrency 3 --out {{out}}"),
    ("bad_flag", f"{SIM} --rate -3 -n 5"),
    ("bad_model", f"{SIM} --model nope-7B -n 5"),
    ("conflict", f"{SIM} --trace {{in}}/azure.csv --input-tokens 5 -n 5"),
    # --- other commands -----------------------------------------------------------------
    ("presets", "sim presets"),
    ("presets_json", "sim presets --json"),
    ("tokens", "tokens --system 'You are a helpful assistant that answers briefly.' --prompt 'What is RAG?'"),
    ("tokens_json", "tokens --system @{in}/system.txt --prompt 'Explain prefix caching' --json --model Llama-3.1-8B --gpu A100"),
    ("tokens_dataset", "tokens --dataset {in}/data.jsonl --prefill-tps 5000"),
    ("validate_extra", "bench/validate_sim.py --csv {root}/bench/data/published_extra.csv"),
    ("validate_holdout", "bench/validate_sim.py --csv {root}/bench/data/published_holdout.csv"),
    ("validate_moe", "bench/validate_sim.py --csv {root}/bench/data/published_moe.csv"),
    ("validate_calibration", "bench/validate_sim.py --csv {calibration}"),
]

#: bench over HTTP against the simulated server: compared with timings masked.
HTTP_CASES: list[tuple[str, str]] = [
    ("http_default", "bench -n 12 -c 4 --out {out}"),
    ("http_completions", "bench --api completions --input-tokens 300 --output-tokens 20 -n 16 --rate 50 --out {out}"),
    ("http_sessions", "bench --sessions 3 --turns 2 --input-tokens 50 --output-tokens 8 --out {out}"),
    ("http_trace", "bench --trace {in}/azure.csv --speedup 20 --out {out}"),
    ("http_prefix", "bench --prefix-tokens 300 --suffix-tokens 20 --output-tokens 8 -n 10 -c 2 --out {out}"),
    ("http_nostream", "bench --no-stream --input-tokens 100 --output-tokens 10 -n 6 -c 2 --out {out}"),
]

TIME_KEYS = {
    "intended_send_ns", "send_ns", "ttfb_ns", "content_ns", "end_ns", "server_timeline",
}


def _calibration() -> str:
    return str(ROOT / "bench" / "data" / "calibration.csv")


def make_inputs(d: Path) -> None:
    """Every input file the cases read, deterministically."""
    import random

    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    t = 0.0
    lines = []
    for i in range(60):
        t += rng.expovariate(2.0)
        row: dict[str, object] = {"arrival_s": round(t, 4), "input_tokens": rng.randint(50, 1500), "output_tokens": rng.randint(5, 300)}
        if i % 5 == 0:
            row["session"] = f"s{i % 3}"
        elif i % 7 == 0:
            row["prefix_group"] = f"g{i % 2}"
            row["prefix_tokens"] = 40
        if i % 4 == 0:
            row["ttft_ms"], row["tpot_ms"], row["e2e_ms"] = 50.0 + i, 10.0, 900.0 + i
        lines.append(json.dumps(row))
    (d / "inferlab.jsonl").write_text("\n".join(lines) + "\n")
    unsorted = [json.loads(x) for x in lines[:20]]
    unsorted[3]["arrival_s"], unsorted[9]["arrival_s"] = unsorted[9]["arrival_s"], unsorted[3]["arrival_s"]
    (d / "unsorted.jsonl").write_text("".join(json.dumps(x) + "\n" for x in unsorted))
    az = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(40):
        az.append(f"2023-11-16 18:15:{46 + i // 4:02d}.{rng.randint(0, 9999999):07d},{rng.randint(10, 3000)},{rng.randint(1, 400)}")
    (d / "azure.csv").write_text("\n".join(az) + "\n")
    bg = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(50):
        bg.append(f"{i * 0.7:.1f},ChatGPT,{rng.randint(10, 2000)},{0 if i % 9 == 4 else rng.randint(1, 300)},0,Conversation log")
    (d / "burstgpt.csv").write_text("\n".join(bg) + "\n")
    mc = []
    for i in range(40):
        n = rng.randint(600, 3000)
        hashes = list(range(rng.randint(0, 3))) + [1000 + i * 10 + k for k in range(n // 512 + 1)]
        mc.append(json.dumps({"timestamp": i * 300, "input_length": n, "output_length": rng.randint(5, 200), "hash_ids": hashes}))
    (d / "mooncake.jsonl").write_text("\n".join(mc) + "\n")
    n = 30
    ins = [rng.randint(100, 1000) for _ in range(n)]
    outs = [rng.randint(2, 200) for _ in range(n)]
    result = {
        "model_id": "meta-llama/Llama-3.1-8B-Instruct", "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": 8,
        "input_lens": ins, "output_lens": outs, "ttfts": [0.03 + 0.001 * i for i in range(n)],
        "itls": [[0.01] * (o - 1) for o in outs],
    }
    (d / "vllm.json").write_text(json.dumps(result))
    result2 = dict(result, start_times=[100 + 0.25 * i for i in range(n)], max_concurrency=None, model_id="nope/unknown-model")
    (d / "vllm_starts.json").write_text(json.dumps(result2))
    data = [json.dumps({"prompt": " ".join(["word"] * rng.randint(5, 60)), "max_tokens": rng.randint(5, 50)}) for _ in range(20)]
    data += [json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is a cache " * rng.randint(1, 9)}]}) for _ in range(5)]
    (d / "data.jsonl").write_text("\n".join(data) + "\n")
    sg = []
    for _ in range(40):
        sg.append({"conversations": [{"from": "human", "value": "tell me about serving " * rng.randint(1, 40)}, {"from": "gpt", "value": "sure " * rng.randint(1, 300)}]})
    sg.append({"conversations": [{"from": "human", "value": "orphan"}]})
    (d / "sharegpt.json").write_text(json.dumps(sg))
    (d / "data.csv").write_text("prompt,max_tokens\n" + "".join(f"\"question {i} about latency\",{5 + i}\n" for i in range(10)))
    (d / "system.txt").write_text("You are a careful assistant. " * 40)
    (d / "eff.json").write_text(json.dumps({"weight_stream": 0.8, "cpu_step_s": 0.001}))
    _tokenizer(d / "tok")


def _tokenizer(d: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [Path(os.__file__).read_text()[:200_000]]
    tok.train_from_iterator(text, trainer)
    tok.save(str(d / "tokenizer.json"))


def _argv(cmd: str) -> list[str]:
    args = shlex.split(cmd)
    if args[0].endswith(".py"):
        return [sys.executable, str(ROOT / args[0]), *args[1:]]
    return [sys.executable, "-m", "inferlab", *args]


def run(snap: Path) -> None:
    """Run every case with ``snap`` as the working folder: paths in the outputs are
    relative to it, so two snapshots in different folders compare."""
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    make_inputs(snap / "inputs")
    # a requests.jsonl to replay: a closed loop's
    rq = "cases/_source"
    subprocess.run(_argv(f"sim run -c 6 -n 40 --input-tokens 400 --output-tokens 60 --out {rq}"), cwd=snap, check=True, capture_output=True)
    (snap / "inputs" / "requests.jsonl").write_text((snap / rq / "requests.jsonl").read_text())
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    for name, cmd in CASES + HTTP_CASES:
        out = snap / "cases" / name
        out.mkdir(parents=True, exist_ok=True)
        rel = f"cases/{name}"
        line = cmd.format(**{"in": "inputs", "out": f"{rel}/files", "steps": f"{rel}/steps.jsonl", "calibration": _calibration(), "root": str(ROOT)})
        started = time.perf_counter()
        p = subprocess.run(_argv(line), cwd=snap, capture_output=True, text=True, env=env, timeout=1800)
        (out / "stdout").write_text(p.stdout)
        (out / "stderr").write_text(p.stderr)
        (out / "rc").write_text(f"{p.returncode}\n")
        print(f"{name:<24} rc={p.returncode} {time.perf_counter() - started:6.1f} s", flush=True)


def _files(d: Path) -> Iterator[Path]:
    for p in sorted(d.rglob("*")):
        if p.is_file():
            yield p.relative_to(d)


def _masked_http(path: Path) -> object:
    """A bench-over-HTTP output with its timings masked."""
    text = path.read_text()
    if path.name == "requests.jsonl":
        recs = [json.loads(x) for x in text.splitlines() if x.strip()]
        return sorted(({k: v for k, v in r.items() if k not in TIME_KEYS} for r in recs), key=lambda r: r["index"])
    if path.name == "config.json":
        cfg = json.loads(text)
        cfg.get("resolved", {}).pop("url", None)
        return cfg
    if path.name == "summary.json":
        s = json.loads(text)
        return {k: s.get(k) for k in ("schema", "counts", "input_tokens", "output_tokens", "token_source",
                                       "prompt_overhead_tokens", "input_length_source", "interrupted")} | {"keys": list(s)}
    return None  # stdout/stderr: timings everywhere


def _untimed(text: str) -> str:
    return re.sub(r" in [0-9.]+ s$", "", text.rstrip("\n"))


def compare(a: Path, b: Path) -> int:
    bad = 0
    http = {n for n, _ in HTTP_CASES}
    for rel in sorted(set(_files(a / "inputs")) | set(_files(b / "inputs"))):
        pa, pb = a / "inputs" / rel, b / "inputs" / rel
        if not (pa.is_file() and pb.is_file() and pa.read_bytes() == pb.read_bytes()):
            print(f"inputs: {rel} differs (the snapshots ran on different inputs)")
            bad += 1
    for case in sorted(p.name for p in (a / "cases").iterdir() if p.is_dir()):
        da, db = a / "cases" / case, b / "cases" / case
        if not db.is_dir():
            print(f"{case}: missing in {b}")
            bad += 1
            continue
        fa, fb = set(_files(da)), set(_files(db))
        if fa != fb:
            print(f"{case}: files differ: {sorted(map(str, fa ^ fb))}")
            bad += 1
            continue
        for rel in sorted(fa):
            pa, pb = da / rel, db / rel
            if case in http:
                if rel.name == "rc":
                    same = pa.read_text() == pb.read_text()
                else:
                    same = _masked_http(pa) == _masked_http(pb)
            elif case.startswith("validate"):  # its last line says how long it took
                same = _untimed(pa.read_text()) == _untimed(pb.read_text())
            else:
                same = pa.read_bytes() == pb.read_bytes()
            if not same:
                print(f"{case}: {rel} differs")
                bad += 1
    print("identical" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "run":
        run(Path(argv[1]).resolve())
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
