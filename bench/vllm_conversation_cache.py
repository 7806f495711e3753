"""Does a conversation's next turn find the last answer in the prefix cache? vLLM's own
code against the simulated server, on the same conversations.

    python bench/vllm_conversation_cache.py [--answers 20,120] [--out DIR]

vLLM V1 hashes every full KV block of a sequence, generated tokens included, so the next
turn of a chat, whose prompt holds the answer (re-tokenized from its text), finds prompt
and answer cached but for the answer's last token (no KV) and the partial block at the
end, as far as the answer's text
tokenizes back into the tokens written. The simulated engine does the same with the
answers its server writes (``block_manager.GeneratedTokens``). This script runs two
conversations of four turns each (60 new tokens a turn, answers of each length in
``--answers``, exact, closed loop of two users, the chat API) against vLLM's CPU build
(installed once per machine, as the opt-in ``-m vllm`` tests do) serving the tiny
generated model, with prefix caching, 32-token blocks (the CPU backend's smallest) and
``--enable-prompt-tokens-details``, then against the simulated server with the same
tokenizer, chat template and block size, and prints each turn's prompt and cached
tokens beside what the previous turn's prompt and answer fill in whole blocks.

The tiny model's answers are random tokens: decoded and tokenized again they need not
come back as the same tokens, and where they do not, vLLM's hits stop there. A real
model's answers are text, which does come back; the simulated model's answer (a passage
of prose) comes back whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from inferlab.engines.tinymodel import tiny_model
from inferlab.engines.vllm import VllmServer, hf_model, install_vllm
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.config import WorkloadConfig

BLOCK = 32  # vLLM's CPU attention takes block sizes in multiples of 32
FLAGS = ["--max-model-len", "4096", "--block-size", str(BLOCK), "--enable-prefix-caching",
         "--enable-prompt-tokens-details", "--dtype", "bfloat16", "--max-num-seqs", "8"]


def conversations(url: str, model: str, answer_tokens: int) -> RunResult:
    config = RunConfig(
        LoadConfig(ClosedLoop(2), num_requests=8),
        WorkloadConfig(sessions=2, turns=4, input_tokens=60, output_tokens=answer_tokens, exact_output=True),
        "chat",
    )

    async def go() -> RunResult:
        async with asyncio.timeout(900):
            return await run(config, HttpTarget(url, model, timeout_s=300.0, workers=1))

    return asyncio.run(go())


def turns(result: RunResult) -> list[dict[str, int | None]]:
    """Each turn: its session and turn, prompt, cached and output tokens, and the previous
    turn's prompt and answer in whole blocks (the answer's last token has no KV)."""
    rows: list[dict[str, int | None]] = []
    prev = None
    for r in sorted(result.records, key=lambda r: (r.session or 0, r.turn or 0)):
        full = None
        if r.turn and prev is not None and prev.input_tokens is not None and prev.output_tokens is not None:
            full = (prev.input_tokens + prev.output_tokens - 1) // BLOCK * BLOCK
        rows.append({"session": r.session, "turn": r.turn, "prompt": r.input_tokens, "cached": r.cached_tokens,
                     "output": r.output_tokens, "previous_in_blocks": full})
        prev = r
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", default="20,120", help="answer lengths, comma-separated")
    ap.add_argument("--out", type=Path, help="write the per-turn rows here as JSON")
    args = ap.parse_args()
    lengths = [int(x) for x in args.answers.split(",")]
    tiny = tiny_model()
    model_dir = hf_model(tiny)
    results: dict[str, dict[int, list[dict[str, int | None]]]] = {"vllm": {}, "simulator": {}}
    python = install_vllm()
    log = (args.out or Path(tempfile.mkdtemp(prefix="vllm-turns-"))) / "vllm.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with VllmServer(python, model_dir, name="tiny", flags=FLAGS, log_path=log) as server:
        for n in lengths:
            results["vllm"][n] = turns(conversations(server.url, "tiny", n))
    sim = ServerConfig(EngineConfig(block_size=BLOCK, max_model_len=4096), served_model_name="tiny",
                       tokenizer=str(model_dir), enable_prompt_tokens_details=True)
    with EmbeddedServer(sim) as server:
        for n in lengths:
            results["simulator"][n] = turns(conversations(server.url, "tiny", n))
    for n in lengths:
        print(f"answers of {n} tokens: prompt / cached (previous turn's prompt + answer in whole {BLOCK}-token blocks)")
        print(f"  {'session':>7} {'turn':>4} {'vLLM':>22} {'simulator':>22}")
        for v, s in zip(results["vllm"][n], results["simulator"][n], strict=True):
            cells = [f"{r['prompt']} / {r['cached']} ({r['previous_in_blocks'] if r['previous_in_blocks'] is not None else '-'})"
                     for r in (v, s)]
            print(f"  {v['session']:>7} {v['turn']:>4} {cells[0]:>22} {cells[1]:>22}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "turns.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
