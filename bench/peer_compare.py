"""inferlab bench next to another well-known load tester, against the same simulated server.

The peer is NVIDIA AIPerf (``aiperf`` on PyPI, no torch), installed into its own virtual
environment, never into inferlab's. For each tool a fresh ``inferlab sim serve`` starts
as a child process on a free loopback port (so both meet an empty prefix cache and the
same engine), the tool runs a fixed closed-loop workload, the server's own Prometheus
``/metrics`` are read as a neutral referee, and the server stops. The workload is the
same for both: streaming chat, ``--requests`` prompts of ``--input-tokens`` random
built-in words (one simulator token each), exactly ``--output-tokens`` output tokens
(``ignore_eos`` and ``min_tokens``), ``--concurrency`` users. AIPerf gets its prompts as
a ``single_turn`` JSONL file and counts tokens from the server's ``usage`` (as inferlab
does); it still insists on loading a tokenizer, so a tiny byte-level BPE is trained
offline on the Python standard library's sources (ChatML specials) and handed to it
as a local directory.

Metric names differ: AIPerf's "Inter Token Latency" is vLLM's and inferlab's TPOT,
(e2e − ttft) / (output_tokens − 1); inferlab's ``itl_ms`` is the gap between chunks.

    python bench/peer_compare.py --setup          # once: /tmp/peer-venv with aiperf
    python bench/peer_compare.py                  # 64 requests, c=8, 200 in / 128 out
    python bench/peer_compare.py --rounds 3       # alternate the order, report medians
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlab.workload.text import WORDS

PEER_VENV = Path("/tmp/peer-venv")
PEER_PACKAGE = "aiperf==0.13.0"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
SERVER_START_TIMEOUT_S = 60.0
SETUP_TIMEOUT_S = 900.0

_TRAIN_TOKENIZER = r"""
import json, pathlib, sys, sysconfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
files = sorted(str(p) for p in pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(files, trainers.BpeTrainer(
    vocab_size=8192, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>", "model_max_length": 32768,
    "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                     "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                     "<|im_start|>assistant\n{% endif %}"}))
"""


@dataclass(frozen=True)
class Workload:
    requests: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    seed: int
    rate_rps: float | None = None  # open loop at constant arrivals instead of closed loop


@dataclass(frozen=True)
class Result:
    """One tool's run: its own numbers (ms, tokens/s, requests/s) and the server's."""

    tool: str
    ttft_mean_ms: float
    ttft_p50_ms: float
    tpot_mean_ms: float
    output_tps: float
    request_rps: float
    completed: int
    prompt_tokens_mean: float
    server_ttft_mean_ms: float  # from the server's TTFT histogram: the neutral referee
    wall_s: float


# --- the server --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # loopback only
        return str(r.read().decode())


class SimServer:
    """``inferlab sim serve`` in a child process on a free loopback port."""

    def __init__(self, server_args: list[str]) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "inferlab", "sim", "serve", "--host", "127.0.0.1",
               "--port", str(port), *server_args]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read() if self._proc.stderr else ""
                raise RuntimeError(f"sim server exited: {err.strip()[-500:]}")
            try:
                _get(f"{self.url}/health", 1.0)
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("sim server did not answer /health in time") from None
                time.sleep(0.1)

    def server_ttft_mean_ms(self) -> float:
        """Mean TTFT the engine itself recorded (vllm:time_to_first_token_seconds)."""
        total = count = 0.0
        for line in _get(f"{self.url}/metrics").splitlines():
            if line.startswith("vllm:time_to_first_token_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:time_to_first_token_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        return 1e3 * total / count if count else float("nan")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# --- the two tools -------------------------------------------------------------------


def _prompts(w: Workload) -> list[str]:
    """``w.requests`` prompts of ``w.input_tokens`` random built-in words (the simulator
    tokenizes each word as one token), as inferlab's synthetic workload builds them."""
    rng = random.Random(w.seed)
    return [" ".join(rng.choices(WORDS, k=w.input_tokens)) for _ in range(w.requests)]


def _load_flags_inferlab(w: Workload) -> list[str]:
    if w.rate_rps is None:
        return ["--concurrency", str(w.concurrency)]
    return ["--rate", str(w.rate_rps), "--arrival", "constant"]


def _load_flags_aiperf(w: Workload) -> list[str]:
    if w.rate_rps is None:
        return ["--concurrency", str(w.concurrency)]
    return ["--request-rate", str(w.rate_rps), "--arrival-pattern", "constant"]


def run_inferlab(url: str, w: Workload, out_dir: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "inferlab", "bench", "--url", url, "--model", MODEL, "--api", "chat",
           *_load_flags_inferlab(w), "--num-requests", str(w.requests),
           "--input-tokens", str(w.input_tokens), "--output-tokens", str(w.output_tokens),
           "--seed", str(w.seed), "--out", str(out_dir), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"inferlab bench failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    summary: dict[str, Any] = json.loads(p.stdout)
    return summary


def run_aiperf(url: str, w: Workload, aiperf: Path, tokenizer_dir: Path, out_dir: Path,
               timeout_s: float) -> dict[str, Any]:
    data = out_dir / "prompts.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    exact = {"ignore_eos": True, "min_tokens": w.output_tokens}
    with data.open("w") as f:
        for text in _prompts(w):
            f.write(json.dumps({"text": text, "output_length": w.output_tokens, "extra": exact}) + "\n")
    cmd = [str(aiperf), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", str(tokenizer_dir), "--input-file", str(data),
           "--custom-dataset-type", "single_turn", "--dataset-sampling-strategy", "sequential",
           *_load_flags_aiperf(w), "--request-count", str(w.requests),
           "--use-server-token-count", "--random-seed", str(w.seed), "--ui-type", "none",
           "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot",
           "--output-artifact-dir", str(out_dir / "artifacts")]
    # aiperf 0.13 cannot load a local tokenizer directory under HF_HUB_OFFLINE (it asks the
    # hub cache for a snapshot); without it a path loads from disk and nothing is fetched.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["TMPDIR"] = str(out_dir)  # its dataset mmap caches go away with our work dir
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env,
                       cwd=out_dir)
    (out_dir / "aiperf.log").write_text(p.stdout + p.stderr)
    export = out_dir / "artifacts" / "profile_export_aiperf.json"
    if p.returncode != 0 or not export.exists():
        raise RuntimeError(f"aiperf failed ({p.returncode}); see {out_dir / 'aiperf.log'}")
    result: dict[str, Any] = json.loads(export.read_text())
    return result


def from_inferlab(s: dict[str, Any], server_ttft_ms: float, wall_s: float) -> Result:
    return Result(
        "inferlab", s["ttft_ms"]["mean"], s["ttft_ms"]["p50"], s["tpot_ms"]["mean"],
        s["output_token_throughput_tps"], s["request_throughput_rps"], s["counts"]["completed"],
        s["input_tokens"] / max(1, s["counts"]["completed"]), server_ttft_ms, wall_s,
    )


def from_aiperf(a: dict[str, Any], server_ttft_ms: float, wall_s: float) -> Result:
    return Result(
        "aiperf", a["time_to_first_token"]["avg"], a["time_to_first_token"]["p50"],
        a["inter_token_latency"]["avg"],  # AIPerf "ITL" = TPOT
        a["output_token_throughput"]["avg"], a["request_throughput"]["avg"],
        int(a["request_count"]["avg"]), a["input_sequence_length"]["avg"], server_ttft_ms, wall_s,
    )


# --- setup and the comparison --------------------------------------------------------


def setup(venv: Path) -> None:
    """Create ``venv`` and install the peer into it from PyPI (not into inferlab's venv)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PEER_PACKAGE], check=True,
                   timeout=SETUP_TIMEOUT_S)


def train_tokenizer(venv: Path, out: Path) -> None:
    """A tiny byte-level BPE (ChatML specials) from stdlib sources, with the peer's
    ``tokenizers`` (inferlab's venv need not have it). Offline, about a second."""
    if not (out / "tokenizer.json").exists():
        subprocess.run([str(venv / "bin" / "python"), "-c", _TRAIN_TOKENIZER, str(out)],
                       check=True, timeout=300, capture_output=True)


def one_run(tool: str, w: Workload, server_args: list[str], work: Path, venv: Path,
            tokenizer_dir: Path, timeout_s: float) -> Result:
    """Run ``tool`` against a fresh server (new engine, empty prefix cache)."""
    server = SimServer(server_args)
    try:
        out = Path(tempfile.mkdtemp(prefix=f"{tool}-", dir=work))
        t0 = time.monotonic()
        if tool == "aiperf":
            a = run_aiperf(server.url, w, venv / "bin" / "aiperf", tokenizer_dir, out, timeout_s)
            return from_aiperf(a, server.server_ttft_mean_ms(), time.monotonic() - t0)
        s = run_inferlab(server.url, w, out, timeout_s)
        return from_inferlab(s, server.server_ttft_mean_ms(), time.monotonic() - t0)
    finally:
        server.close()


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"


def report(peer: list[Result], ours: list[Result], w: Workload, limit: float) -> None:
    def med(rs: list[Result], field: str) -> float:
        return statistics.median(getattr(r, field) for r in rs)

    rows = [
        ("TTFT mean (ms)", "ttft_mean_ms", True),
        ("TTFT p50 (ms)", "ttft_p50_ms", True),
        ("TPOT mean (ms)  [AIPerf: ITL]", "tpot_mean_ms", True),
        ("output tokens/s", "output_tps", True),
        ("requests/s", "request_rps", True),
        ("server TTFT mean (ms)  [/metrics]", "server_ttft_mean_ms", False),
        ("prompt tokens / request", "prompt_tokens_mean", False),
        ("completed requests", "completed", False),
    ]
    load = f"concurrency {w.concurrency}" if w.rate_rps is None else f"open loop, constant {w.rate_rps} req/s"
    print(f"\nworkload: {w.requests} requests, {load}, "
          f"{w.input_tokens} words in / {w.output_tokens} tokens out, streaming chat; "
          f"{len(ours)} round(s), medians")
    head = f"{'metric':36} {'aiperf':>10} {'inferlab':>10} {'peer/ours':>10}  within {limit:.0%}"
    print(head)
    print("-" * len(head))
    for label, field, checked in rows:
        p, o = med(peer, field), med(ours, field)
        ratio = p / o if o else float("nan")
        verdict = ("yes" if abs(ratio - 1) <= limit else "NO") if checked else ""
        print(f"{label:36} {_fmt(p):>10} {_fmt(o):>10} {ratio:>10.3f}  {verdict}")
    if len(ours) > 1:
        print("\nper round, aiperf / inferlab: TTFT mean ms (server's own), output tok/s")
        for i, (p, o) in enumerate(zip(peer, ours, strict=True)):
            print(f"  {i + 1}: {p.ttft_mean_ms:.2f} ({p.server_ttft_mean_ms:.2f}) / "
                  f"{o.ttft_mean_ms:.2f} ({o.server_ttft_mean_ms:.2f})   "
                  f"{p.output_tps:.1f} / {o.output_tps:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-venv", type=Path, default=PEER_VENV)
    ap.add_argument("--setup", action="store_true", help=f"create --peer-venv and pip install {PEER_PACKAGE}")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=200)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--rate", type=float, help="open loop: constant arrivals at this many req/s "
                    "(instead of --concurrency users)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="repeat, alternating which tool goes first")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per tool run")
    ap.add_argument("--limit", type=float, default=0.15, help="agreement asked for (0.15 = 15%%)")
    ap.add_argument("--keep", type=Path, help="keep raw outputs (summaries, AIPerf exports) here")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra 'inferlab sim serve' flag (repeatable), e.g. --server-arg=--gpu=A100")
    args = ap.parse_args()

    venv: Path = args.peer_venv
    if args.setup:
        setup(venv)
    if not (venv / "bin" / "aiperf").exists():
        print(f"no aiperf in {venv}; run: python bench/peer_compare.py --setup", file=sys.stderr)
        return 2
    w = Workload(args.requests, args.concurrency, args.input_tokens, args.output_tokens, args.seed,
                 args.rate)
    work = Path(tempfile.mkdtemp(prefix="peer-compare-"))
    try:
        tokenizer_dir = work / "tokenizer"
        train_tokenizer(venv, tokenizer_dir)
        peer: list[Result] = []
        ours: list[Result] = []
        for i in range(args.rounds):
            order = ["aiperf", "inferlab"] if i % 2 == 0 else ["inferlab", "aiperf"]
            for tool in order:
                r = one_run(tool, w, args.server_arg, work, venv, tokenizer_dir, args.timeout)
                print(f"round {i + 1} {tool:8}: ttft {r.ttft_mean_ms:.2f} ms, tpot {r.tpot_mean_ms:.2f} ms, "
                      f"{r.output_tps:.1f} tok/s, {r.completed} done in {r.wall_s:.1f} s", file=sys.stderr)
                (peer if tool == "aiperf" else ours).append(r)
        report(peer, ours, w, args.limit)
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
            (args.keep / "results.json").write_text(json.dumps(
                {"workload": w.__dict__, "aiperf": [r.__dict__ for r in peer],
                 "inferlab": [r.__dict__ for r in ours]}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
