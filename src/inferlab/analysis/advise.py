"""``inferlab advise``: evidence → a tuning checklist. Each recommendation says what
triggered it (a measurement), what to change (an engine flag, a gateway setting, or the
application), and what it should gain: predicted with the simulator where one applies
(``analysis.whatif``: the observed workload rerun in virtual time with the change; said
to be a prediction), else bounded from the measurement itself.

Sources: a run directory (config.json, requests.jsonl, summary.json; without a
summary.json, as a gateway's access log is, the summary is computed from the records as
``report`` computes it), a profile folder
(``profile.json``, ``analysis.profile``) or a folder of runs (a sweep: the knee across
them, and the rules on its heaviest run). ``--goal`` reorders the list: throughput,
latency (the default) or consistency (the tail).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from inferlab._errors import InferlabError, UsageError
from inferlab.analysis.fits import knee, paid
from inferlab.analysis.profile import (
    PROFILE_FILE,
    Profile,
    decode_quality,
    decode_quality_words,
    read_profile,
    signed_ms,
)
from inferlab.analysis.whatif import Routing, Simulated, WhatIf
from inferlab.client.serverid import FAMILY_OF_SOFTWARE
from inferlab.gateway.config import AdmissionConfig
from inferlab.gateway.routing import SPLIT
from inferlab.results.metrics import peak_overlap, request_metrics
from inferlab.results.provenance import (
    GATEWAY_KEY,
    VIRTUAL,
    engine_family_of,
    server_info,
    simulated_engine,
)
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import read_records, read_summary
from inferlab.results.sources import read_sweep_index
from inferlab.results.summary import OVERLOAD, Summary, summarize
from inferlab.results.telemetry import SERVER_METRICS_FILE, ServerMetrics
from inferlab.sim.engine.bands import band_of
from inferlab.sim.engine.config import release_local_label
from inferlab.sim.engine.families import EngineFamily, FamilyRules

Goal = Literal["throughput", "latency", "consistency"]
GOALS: tuple[Goal, ...] = ("throughput", "latency", "consistency")

#: A prompt this long, and this many times the median, is "long" beside the others.
LONG_PROMPT_TOKENS = 2048
LONG_PROMPT_RATIO = 8.0
#: A predicted change smaller than this share is not worth recommending.
MIN_GAIN = 0.05
#: System prompt + template tokens past this share of a prompt (or this many) are "long".
OVERHEAD_SHARE = 0.2
OVERHEAD_TOKENS = 500
#: Prompt tokens served from cache below this share, while prefixes are shared: unexploited.
LOW_HIT_RATE = 0.1
#: KV usage past this share, or any preemption: pressure.
KV_PRESSURE = 0.9
#: Under GUARANTEED_NO_EVICT (no preemption): pressure where twice the cache cuts TTFT p50 by this share.
KV_HELD_GAIN = 0.2
#: Sessions whose last turn's prompt is this many times the first's: growing context.
CONTEXT_GROWTH = 3.0
#: Outputs this long at p90 are long.
LONG_OUTPUT_TOKENS = 1024
#: Head-of-line inflation (profile) past this: blocking.
HOL_INFLATION = 1.5
#: A change that gives throughput up for latency (token admission, a cap on concurrency)
#: may cost at most this share of output tokens/s, per goal.
THROUGHPUT_SLACK: dict[Goal, float] = {"latency": 0.25, "consistency": 0.15, "throughput": 0.05}

@dataclass(frozen=True)
class _EngineFlags:
    """One engine's own names for the settings a recommendation changes (``{n}``: the
    value), so a TensorRT-LLM run is not told vLLM's flags."""

    budget: str  # the per-step token budget, chunking long prompts
    seqs: str  # the cap on running sequences
    prefix_on: str  # prefix caching on
    fp8: str  # fp8 weights
    kv_fp8: str  # a KV cache of half the bytes per token ("": the engine has none simulated)
    kv_share: str  # more memory for the KV cache
    kv_limits: str  # fewer tokens a request or sequences at once
    mix: str = ""  # prefill chunks in the same steps as decodes, where that is not the engine's default
    budget_default: int | None = None  # the budget the engine runs with unless told (None: it varies, or not known)
    kv_hardware: str = "a bigger GPU, or -tp 2"  # more room from the hardware ("": none to name)
    kv_blocks: str = ""  # a KV cache of {n} blocks, where the engine takes a count ("": not named)
    # where the cap is slots that split one context between them: the cap raised to {n}
    # with the context raised to {ctx} tokens, and why ("": the engine's sequences share
    # no fixed split of a context)
    slots_context: str = ""
    slots_split: str = ""


_VLLM_FLAGS = _EngineFlags(
    "vLLM --max-num-batched-tokens {n} (chunked prefill on: --enable-chunked-prefill)",
    "vLLM --max-num-seqs {n}",
    "vLLM --enable-prefix-caching (the V1 default; V0 needs it)",
    "vLLM --quantization fp8",
    "--kv-cache-dtype fp8 (half the bytes per token)", "a higher --gpu-memory-utilization",
    "a lower --max-model-len or --max-num-seqs",
)
_FAMILY_FLAGS = {
    "sglang": _EngineFlags(
        "SGLang --chunked-prefill-size {n}", "SGLang --max-running-requests {n}", "SGLang: drop --disable-radix-cache",
        "SGLang --quantization fp8",
        "--kv-cache-dtype fp8_e5m2 (half the bytes per token)", "a higher --mem-fraction-static",
        "a lower --context-length or --max-running-requests",
        "SGLang --enable-mixed-chunk (prefill chunks share steps with decodes)",
    ),
    "trtllm": _EngineFlags(
        "TensorRT-LLM --max_num_tokens {n} (trtllm-serve; chunked prefill on: enable_chunked_prefill in "
        "--extra_llm_api_options)",
        "TensorRT-LLM --max_batch_size {n}",
        "TensorRT-LLM's KV cache reuse (kv_cache_config: enable_block_reuse: true)",
        "an FP8 checkpoint quantized with TensorRT Model Optimizer",
        "fp8 KV (kv_cache_config dtype fp8: half the bytes per token)", "a higher kv_cache_free_gpu_mem_fraction",
        "a lower max_seq_len or max_batch_size",
    ),
    "llamacpp": _EngineFlags(
        "llama.cpp -b {n} (--batch-size: the prompt tokens one server step takes)", "llama.cpp --parallel {n} (its slots)",
        "llama.cpp's prompt cache (cache_prompt, on by default; --cache-reuse for shifted prefixes)",
        "a Q8_0 or 4-bit (Q4_K_M) GGUF",
        "a q8_0 KV cache (--cache-type-k q8_0 --cache-type-v q8_0)", "a larger --ctx-size (shared by the slots)",
        "fewer --parallel slots", budget_default=2048, slots_context="llama.cpp --parallel {n} --ctx-size {ctx}",
        slots_split="-c is the KV cache all the slots share, each slot given -c / --parallel of it unless --kv-unified, "
                    "so --parallel alone would shrink every slot's context and fail the requests that fit one now; "
                    "llama-server allocates the KV cache of the whole -c at start",
    ),
    "lmdeploy": _EngineFlags(
        "LMDeploy --max-prefill-token-num {n}, which prefills long prompts in pieces of {n} tokens (simulated as "
        "--enable-chunked-prefill --max-num-batched-tokens {n}: the lmdeploy family prefills whole prompts otherwise)",
        "LMDeploy --max-batch-size {n}", "LMDeploy --enable-prefix-caching",
        "an FP8 checkpoint, where your LMDeploy release serves one; predicted for fp8 weights, its 4-bit AWQ "
        "(--model-format awq) not simulated",
        "", "a higher --cache-max-entry-count", "a lower --session-len or --max-batch-size",
    ),
}
#: vLLM's CPU build (a real server that said so): no fp8 KV, no GPU to add. Its KV cache
#: is sized as vLLM 0.32.0's CPU build has it: vllm/platforms/cpu.py (lines 323-327)
#: reads VLLM_CPU_KVCACHE_SPACE, "# Legacy setting", into kv_cache_memory_bytes
#: (--kv-cache-memory-bytes); vllm/v1/worker/cpu_worker.py (lines 73-76, 213-251) gives
#: the cache those bytes where set, else the worker requests --gpu-memory-utilization ×
#: the NUMA node's total memory and the cache gets that less what the process holds
#: ("Auto set ... GiB for KV cache"); vllm/v1/core/kv_cache_utils.py (lines 2605-2624)
#: puts --num-gpu-blocks-override over either ("Overriding num_gpu_blocks=...").
_VLLM_CPU_FLAGS = replace(
    _VLLM_FLAGS, kv_fp8="",
    kv_share="more memory for it: --kv-cache-memory-bytes <bytes> (or the legacy VLLM_CPU_KVCACHE_SPACE=<GiB> in the "
             "server's environment), or, where neither is set, a higher --gpu-memory-utilization (on vLLM's CPU build "
             "the share of the node's memory the worker takes, its KV cache the rest of it past the model)",
    kv_hardware="", kv_blocks="--num-gpu-blocks-override {n}",
)
#: A real vLLM server that did not say which device it ran on: a GPU's flags, and the
#: CPU build's where it was that.
_VLLM_ANY_DEVICE_FLAGS = replace(
    _VLLM_FLAGS, kv_share="a higher --gpu-memory-utilization (vLLM's CPU build, which nothing in the run says it "
                          "was or was not, reads it as the share of the node's memory, unless --kv-cache-memory-bytes "
                          "or the legacy VLLM_CPU_KVCACHE_SPACE=<GiB> sets the cache's size)",
)
#: A server whose engine is not known (a real one): vLLM's names and SGLang's.
_ANY_FLAGS = _EngineFlags(
    "vLLM --max-num-batched-tokens {n} (chunked prefill on: --enable-chunked-prefill; SGLang --chunked-prefill-size {n})",
    "vLLM --max-num-seqs {n} (SGLang --max-running-requests {n})",
    "vLLM --enable-prefix-caching (the V1 default; V0 needs it); SGLang: drop --disable-radix-cache",
    "vLLM or SGLang --quantization fp8",
    "--kv-cache-dtype fp8 (vLLM; SGLang fp8_e5m2: half the bytes per token)",
    "a higher --gpu-memory-utilization (SGLang --mem-fraction-static)",
    "a lower --max-model-len or --max-num-seqs (SGLang --context-length or --max-running-requests)",
)


#: the server software a run recorded (``client.serverid``) -> its flags' family
_SOFTWARE_FAMILY = {**FAMILY_OF_SOFTWARE, "llama.cpp": "llamacpp"}


def _flags(engine: dict[str, Any] | None) -> _EngineFlags:
    """The flags of the engine a run simulated (its family's; behind the gateway, its
    upstreams' where they share one), or of any engine."""
    family = engine_family_of(engine)
    if family is None:
        return _ANY_FLAGS
    return _FAMILY_FLAGS.get(family, _VLLM_FLAGS)


def _server_flags(engine: dict[str, Any] | None, software: Any, engine_config: Any = None) -> _EngineFlags:
    """The flags of the server a run or a profile measured: the simulated engine's
    (``_flags``) where there is one, else the family of the software the server said it
    is (``client.serverid``'s record: ``{"name": "llama.cpp", ...}``), else of the engine
    inferlab started it as (``--engine``'s config: ``{"engine": "llamacpp", ...}``), else
    any engine's. A real vLLM's KV flags are its CPU build's where the run says it was
    that (``_vllm_cpu``), and name both a GPU's and the CPU build's where nothing says."""
    if engine is not None:
        return _flags(engine)
    name = software.get("name") if isinstance(software, dict) else None
    family = _SOFTWARE_FAMILY.get(str(name)) if name else None
    kind = engine_config.get("engine") if isinstance(engine_config, dict) else None
    if family is None and (kind in _FAMILY_FLAGS or kind == "vllm"):
        family = str(kind)
    if family == "vllm":
        return _VLLM_CPU_FLAGS if _vllm_cpu(software, engine_config) else _VLLM_ANY_DEVICE_FLAGS
    return _FAMILY_FLAGS.get(family, _VLLM_FLAGS) if family else _ANY_FLAGS


def _vllm_cpu(software: Any, engine_config: Any) -> str | None:
    """What says a real vLLM server was its CPU build, in words: a release it reported as
    ``+cpu`` (``client.serverid``), the engine config inferlab started it from recording
    that build's environment (``vllm_cpu_build``: ``cli.engine.recorded_spec``) or setting
    ``VLLM_TARGET_DEVICE=cpu`` or ``VLLM_CPU_KVCACHE_SPACE`` (read by that build alone);
    None where nothing does (a GPU's is then not ruled out either: not guessed)."""
    version = software.get("version") if isinstance(software, dict) else None
    if isinstance(version, str) and "cpu" in release_local_label(version).split("."):
        return f"the server said it is vLLM {version}"
    build = engine_config.get("vllm_cpu_build") if isinstance(engine_config, dict) else None
    if isinstance(build, str) and build:
        return f"inferlab started it from vLLM's CPU build in {build}"
    env = engine_config.get("env") if isinstance(engine_config, dict) else None
    pairs = env.items() if isinstance(env, dict) else (tuple(kv) for kv in env or () if isinstance(kv, list | tuple) and len(kv) == 2)
    said = dict(pairs) if isinstance(env, dict | list | tuple) else {}
    if str(said.get("VLLM_TARGET_DEVICE", "")).lower() == "cpu":
        return "its engine config set VLLM_TARGET_DEVICE=cpu"
    if "VLLM_CPU_KVCACHE_SPACE" in said:
        return f"its engine config set VLLM_CPU_KVCACHE_SPACE={said['VLLM_CPU_KVCACHE_SPACE']}"
    return None


def _stated_blocks(settings: dict[str, Any]) -> tuple[int, int | None] | None:
    """The KV blocks a real server stated it had, and their size in tokens (None where
    not stated): ``num_gpu_blocks``, or ``num_gpu_blocks_override`` as ``client.serverid``
    once labelled that count (and SGLang's pages); None where neither is stated (an
    SGLang server states its pool in tokens, ``kv_cache_tokens``: no block count)."""
    blocks = _count(settings.get("num_gpu_blocks")) or _count(settings.get("num_gpu_blocks_override"))
    return None if blocks is None else (blocks, _count(settings.get("block_size")))


def _blocks_words(blocks: int, size: int | None) -> str:
    """``_stated_blocks`` in words: "24 blocks of 128 tokens = 3,072 tokens"."""
    return f"{blocks:,} blocks" + (f" of {size:,} tokens = {blocks * size:,} tokens" if size else "")


#: The settings of an engine config (``engines.launch.EngineSpec``) that are server
#: settings in ``client.serverid``'s vocabulary (the same names).
_ENGINE_CONFIG_SETTINGS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
                           "gpu_memory_utilization", "tensor_parallel_size")


def _stated_settings(software: Any, engine_config: Any) -> dict[str, Any]:
    """A measured server's settings: those it stated (``client.serverid``'s
    ``settings``), over those of the engine config inferlab started it from (``bench
    --engine``, ``profile --engine``: what it was launched with; a setting left to the
    engine's default, None there, is left out); empty where neither says any."""
    launched = engine_config if isinstance(engine_config, dict) and engine_config.get("engine") != "sim" else {}
    out = {k: launched[k] for k in _ENGINE_CONFIG_SETTINGS if launched.get(k) is not None}
    override = _count_text(_extra_arg(launched, "--num-gpu-blocks-override"))
    if override is not None:  # (vLLM's, passed on in extra_args: the blocks the server then has)
        out["num_gpu_blocks_override"] = override
    stated = software.get("settings") if isinstance(software, dict) else None
    return {**out, **(stated if isinstance(stated, dict) else {})}


def _extra_arg(engine_config: dict[str, Any], flag: str) -> str | None:
    """The value an engine config's ``extra_args`` give ``flag`` (``--flag N`` or
    ``--flag=N``, the last one given); None where they do not give it."""
    args = engine_config.get("extra_args")
    args = [str(a) for a in args] if isinstance(args, list) else []
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _count_text(text: str | None) -> int | None:
    """``_count`` of a number written as text (an engine flag's value); None otherwise."""
    return _count(int(text)) if text is not None and text.strip().isdigit() else None


#: The engine's output, where inferlab started it (bench, profile --engine)
ENGINE_LOG = "engine.log"
#: vLLM's log line where --num-gpu-blocks-override replaces the blocks memory allowed
#: (vllm/v1/core/kv_cache_utils.py, 0.32.0, line 2620)
_OVERRIDE_LOG = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


def _memory_blocks(log: Path | None) -> int | None:
    """The KV blocks memory allowed a vLLM server that --num-gpu-blocks-override
    overrode, as its log (``engine.log``, where inferlab started it) says; None where
    there is no such log or line."""
    if log is None or not log.is_file():
        return None
    found = None
    with contextlib.suppress(OSError), log.open(errors="replace") as f:
        for line in f:
            if "Overriding num_gpu_blocks=" in line and (m := _OVERRIDE_LOG.search(line)):
                found = int(m.group(1))
    return found


def _engine_file_off(engine_config: Any) -> bool:
    """Whether the engine config inferlab started the server from turned prefix caching off."""
    return isinstance(engine_config, dict) and engine_config.get("enable_prefix_caching") is False


def _prefix_on(flags: _EngineFlags, engine_file: bool) -> str:
    """How to turn prefix caching on: in the engine file inferlab started the server
    from, where that turned it off (``engine_file``), else with the engine's own flag."""
    if engine_file:
        return f"enable_prefix_caching = true in your engine file (inferlab engine start / bench --engine; {flags.prefix_on})"
    return flags.prefix_on


def _count(value: Any) -> int | None:
    """``value`` where it is a positive int (a setting as a config states it); None otherwise."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


#: The per-step budget advised where no what-if chose one and the engine's is not known.
UNKNOWN_BUDGET_ADVICE = 512


def _smaller_budget(flags: _EngineFlags, known: int | None) -> str:
    """A smaller per-step token budget where no what-if chose one, in the engine's own
    flags: a quarter of the budget it ran with (``known``: stated by the server or its
    engine config, else its family's default), saying what it lowers; where neither is
    known, ``UNKNOWN_BUDGET_ADVICE``, said to be meant below the engine's current one.
    Never a value at or above the budget it ran with."""
    base = known or flags.budget_default
    if base is None:
        return (flags.budget.format(n=UNKNOWN_BUDGET_ADVICE)
                + ", where the engine runs with a larger budget (its default varies by release and GPU)")
    n = max(1, base // 4)
    return flags.budget.format(n=n) + f", down from {base:,}" + (" (its default)" if not known else "")


def _family_rules(engine: dict[str, Any]) -> FamilyRules:
    """The rules of the engine family a run simulated (``engine_family_of``: behind the
    gateway, its upstreams' where they share one); vLLM's where it names none or one not
    known."""
    with contextlib.suppress(UsageError):
        return EngineFamily.parse(engine_family_of(engine) or "vllm").rules
    return EngineFamily.VLLM.rules


#: Each rule's rank per goal (lower first).
PRIORITY: dict[str, dict[Goal, int]] = {
    "failures": {"latency": -1, "consistency": -1, "throughput": -1},
    "overload": {"latency": -1, "consistency": -1, "throughput": -1},
    "slo_out_of_reach": {"latency": 0, "consistency": 0, "throughput": 0},
    "head_of_line": {"latency": 1, "consistency": 1, "throughput": 8},
    "token_admission": {"latency": 2, "consistency": 2, "throughput": 10},
    "split_long_prompts": {"latency": 2, "consistency": 2, "throughput": 10},
    "prefix_caching": {"latency": 2, "consistency": 4, "throughput": 2},
    "kv_pressure": {"latency": 5, "consistency": 2, "throughput": 1},
    "concurrency_cap": {"latency": 4, "consistency": 3, "throughput": 3},
    "engine_cap": {"latency": 3, "consistency": 3, "throughput": 1},
    "template_overhead": {"latency": 3, "consistency": 7, "throughput": 5},
    "context_growth": {"latency": 6, "consistency": 5, "throughput": 4},
    "quantization": {"latency": 7, "consistency": 8, "throughput": 6},
    "response_cache": {"latency": 8, "consistency": 9, "throughput": 7},
    "long_outputs": {"latency": 9, "consistency": 6, "throughput": 9},
}


@dataclass
class Gain:
    """What a change should do to one metric: ``before`` → ``after``; ``kind`` says
    whether it is a simulator prediction or bounded from a measurement. A prediction
    names its metric class (``sim.engine.bands.METRIC_CLASSES``) and carries the
    simulator's validation error for it (``error_band``: its engine family in its load
    regime; None: never validated there)."""

    metric: str
    before: float
    after: float
    kind: str  # "prediction (simulator: ...)" or "estimate (from ...)"
    metric_class: str | None = None  # predictions only: TTFT, TPOT/ITL, E2E, throughput
    error_band: dict[str, Any] | None = None  # ``ErrorBand.to_json``

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def delta_pct(self) -> float | None:
        return None if self.before == 0 else 100 * (self.after - self.before) / self.before

    def band_text(self) -> str:
        """'prediction; simulated TTFT values ±32 % on 8 held-out vLLM V1 closed loop rows'
        (empty: no prediction): the band of each simulated value, not of the gain."""
        if self.metric_class is None:
            return ""
        if self.error_band is None:
            return f"prediction; {self.metric_class} not validated for this engine family and load regime"
        return f"prediction; simulated {self.metric_class} values {self.error_band['text']}"

    def text(self) -> str:
        pct = self.delta_pct
        band = self.band_text()
        return (f"{self.metric} {self.before:,.1f} → {self.after:,.1f}" + ("" if pct is None else f" ({pct:+.0f}%)")
                + (f" ({band})" if band else "") + f" [{self.kind}]")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "delta": self.delta, "delta_pct": self.delta_pct}


@dataclass
class Recommendation:
    """One item of the checklist."""

    rule: str
    title: str  # plain language
    evidence: str  # the measurement that triggered it
    change: str  # the exact flag, setting or application change
    gains: list[Gain] = field(default_factory=list)
    note: str = ""  # trade-offs, or why no prediction

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "title": self.title, "evidence": self.evidence, "change": self.change,
            "gains": [g.to_json() for g in self.gains], "note": self.note,
        }


@dataclass
class Advice:
    source: str
    kind: str  # run, profile, sweep
    goal: Goal
    recommendations: list[Recommendation]
    checked: list[str]  # every rule looked at
    # what it read came from inferlab's simulator (a sim run, runs or a profile against the
    # simulated server): every number it quotes, evidence included, is a prediction
    simulated: bool = False
    # rules not looked at, their evidence not measured (a profile's factors left out or failed)
    not_measured: list[str] = field(default_factory=list)
    # rules that could not judge the evidence they found (a what-if they need, not at hand): rule -> why
    not_checked: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "kind": self.kind, "goal": self.goal, "simulated": self.simulated,
            "recommendations": [r.to_json() for r in self.recommendations], "rules_checked": self.checked,
            "rules_not_measured": self.not_measured, "rules_not_checked": self.not_checked,
        }


class _NotJudged(Exception):
    """A rule found its trigger but cannot judge it (the what-if it needs is not at
    hand): listed as not checked, with ``why``, never as checked."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def advise(path: str | Path, goal: Goal = "latency") -> Advice:
    """Recommendations for a run directory, a profile folder or a folder of runs;
    ``UsageError`` for anything else."""
    if goal not in GOALS:
        raise UsageError(f"--goal {goal!r}: expected {', '.join(GOALS)}")
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory")
    if p.is_file() and p.name == PROFILE_FILE:
        p = p.parent
    not_measured: list[str] = []
    not_checked: dict[str, str] = {}
    if (p / PROFILE_FILE).exists():
        prof = read_profile(p)
        recs, checked, not_checked = _profile_rules(prof, p, goal)
        kind, simulated = "profile", prof.server.simulated
        not_measured = _not_measured(prof)
    elif (p / "summary.json").exists() or (p / "requests.jsonl").exists():
        run = _Run.read(p)
        simulated = server_info(run.config).simulated
        recs, checked, not_checked = _run_rules(run, goal)
        kind = "run" if (p / "summary.json").exists() else (
            "gateway access log" if "gateway" in run.config else "run without summary.json") + ": summary from its records"
    else:
        runs = sorted(d.parent for d in p.rglob("summary.json"))
        if not runs:
            raise UsageError(f"{p}: not a run directory (no requests.jsonl), a profile (no {PROFILE_FILE}) or a folder of runs")
        # (read as report and compare read it: a sweep.json that is not one is refused)
        index = read_sweep_index(p) if (p / "sweep.json").exists() else None
        read = [_Run.read(d) for d in runs]
        recs, checked, not_checked = _sweep_rules(read, goal, index)
        kind, simulated = "sweep", any(server_info(r.config).simulated for r in read)
    recs.sort(key=lambda r: (PRIORITY.get(r.rule, {}).get(goal, 99), -_size(r)))
    return Advice(str(p), kind, goal, recs, [c for c in checked if c not in not_measured and c not in not_checked],
                  simulated, not_measured, not_checked)


def _size(r: Recommendation) -> float:
    return max((abs(g.delta_pct or 0) for g in r.gains), default=0.0)


# --- a run's evidence -------------------------------------------------------------------


@dataclass
class _Run:
    dir: Path
    config: dict[str, Any]
    summary: Summary
    records: list[RequestRecord]  # measured, completed
    failed: list[RequestRecord] = field(default_factory=list)  # measured, failed (cancelled ones left out)

    @classmethod
    def read(cls, d: Path) -> _Run:
        """A run directory; without a summary.json (a gateway's access log) its summary
        computed from the records."""
        try:
            config = json.loads((d / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"{d}/config.json: cannot read it ({e})") from e
        if not isinstance(config, dict):
            raise UsageError(f"{d}/config.json: not a JSON object")
        everything = list(read_records(d / "requests.jsonl"))
        summary = read_summary(d / "summary.json") if (d / "summary.json").exists() else summarize(everything, config=config)
        records = [r for r in everything if r.ok and not r.warmup]
        failed = [r for r in everything if not r.ok and not r.warmup and r.error_kind is not ErrorKind.CANCELLED]
        return cls(d, config, summary, records, failed)

    def workload(self) -> dict[str, Any]:
        w = self.config.get("workload")
        return w if isinstance(w, dict) else {}

    def engine(self) -> dict[str, Any] | None:
        return simulated_engine(self.config)

    def flags(self) -> _EngineFlags:
        """The flags of the engine the run measured (``_server_flags``): the simulated
        engine's family's (behind inferlab gateway, its upstreams' where they share one),
        else the family of the software the server said it is, else of the engine config
        ``bench --engine`` started it from, else any engine's."""
        resolved = self.config.get("resolved")
        resolved = resolved if isinstance(resolved, dict) else {}
        engine = self.engine() or (resolved.get("engine") if self.gateway_engines() else None)
        return _server_flags(engine, self.server_software(), self.config.get("engine_config"))

    def gateway_engines(self) -> list[dict[str, Any]]:
        """The engines behind inferlab gateway in front of simulated servers, as the run
        recorded them (``resolved.engine.inferlab_gateway.engines``); empty otherwise."""
        resolved = self.config.get("resolved")
        engine = resolved.get("engine") if isinstance(resolved, dict) else None
        gateway = engine.get(GATEWAY_KEY) if isinstance(engine, dict) else None
        engines = gateway.get("engines") if isinstance(gateway, dict) else None
        return [e for e in engines if isinstance(e, dict)] if isinstance(engines, list) else []

    def server_settings(self) -> dict[str, Any]:
        """The engine flags of a measured server (``_stated_settings``): those it stated
        (``resolved.server_software.settings``, ``client.serverid``) over those of the
        engine config ``bench --engine`` started it from (``engine_config``); empty where
        neither says any."""
        return _stated_settings(self.server_software(), self.config.get("engine_config"))

    def server_software(self) -> Any:
        """What the measured server said it is (``resolved.server_software``,
        ``client.serverid``'s record); None where not recorded."""
        resolved = self.config.get("resolved")
        return resolved.get("server_software") if isinstance(resolved, dict) else None

    def engine_file_off(self) -> bool:
        """Whether prefix caching was off in the engine config ``bench --engine`` started
        the server from (then the change is made in that file)."""
        return self.engine() is None and _engine_file_off(self.config.get("engine_config"))

    def stated_budget(self) -> int | None:
        """The per-step token budget the server ran with, where its settings state one."""
        return _count(self.server_settings().get("max_num_batched_tokens"))

    def prefix_caching_off(self) -> str | None:
        """Where the run recorded its engine's prefix caching off, in words: the simulated
        engine's flags, a real server's stated settings, or the gateway's upstreams;
        None where it was on or not recorded."""
        engine = self.engine()
        if engine is not None:
            return "the engine ran with prefix caching off" if engine.get("enable_prefix_caching") is False else None
        if self.server_settings().get("enable_prefix_caching") is False:
            if self.engine_file_off():
                return ("the engine config inferlab started the server from (bench --engine) sets "
                        "enable_prefix_caching = false")
            return "the server states prefix caching off (its settings as the run recorded them)"
        upstreams = self.gateway_engines()
        off = sum(1 for e in upstreams if e.get("enable_prefix_caching") is False)
        if off:
            return f"{off} of the gateway's {len(upstreams)} upstream engines ran with prefix caching off"
        return None

    def concurrency(self) -> float | None:
        s = (self.config.get("load") or {}).get("schedule") or {}
        c = s.get("concurrency") or s.get("max_concurrency")
        return float(c) if c else None


def _inputs(records: Sequence[RequestRecord]) -> list[int]:
    return [r.input_tokens for r in records if r.input_tokens]


def _ttfts(records: Sequence[RequestRecord], keep: Callable[[RequestRecord], bool]) -> list[float]:
    out = []
    for r in records:
        if keep(r):
            t = request_metrics(r).ttft_ms
            if t is not None:
                out.append(t)
    return out


def _p(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _prediction(w: WhatIf, what: str) -> str:
    return f"prediction: simulator, {w.describe_engine()}, {w.method}, {what}"


def _predicted(metric: str, cls: str, before: float, after: float, kind: str, prediction: Any) -> Gain:
    """A gain the simulator predicted, with the validation error of its metric class
    ``cls`` for the simulated run whose summary's ``prediction`` is given (its engine
    family and load regime; none for a summary written before it had one)."""
    if not isinstance(prediction, dict):
        return Gain(metric, before, after, kind)
    band = band_of(prediction, cls, stat=_band_stat(metric))
    return Gain(metric, before, after, kind, cls, None if band is None else band.to_json())


def _band_stat(metric: str) -> str | None:
    """The statistic a gain's metric is ("TPOT p50 ms", "short requests' p99 TTFT ms"),
    for its error band: median or p99, each of which validation measured apart; None for
    a mean, a p90 or a throughput (the headline band)."""
    words = metric.split()
    if "p50" in words or "median" in words:
        return "median"
    return "p99" if "p99" in words else None


def _sim_gain(metric: str, cls: str, before: float, after: float, kind: str, sim: Simulated) -> Gain:
    """``_predicted`` for a what-if: the band of the run simulated with the change."""
    return _predicted(metric, cls, before, after, kind, sim.result.summary.prediction)


# --- rules on one run ---------------------------------------------------------------------


def _run_rules(run: _Run, goal: Goal) -> tuple[list[Recommendation], list[str], dict[str, str]]:
    """The items for one run, the rules checked, and those that found their trigger but
    could not judge it (``_NotJudged``: rule -> why)."""
    w = WhatIf(run.dir, run.config)
    rules: list[Callable[[_Run, WhatIf, Goal], Recommendation | None]] = [
        _failures, _overload, _slo_out_of_reach, _head_of_line, _token_admission, _split_long_prompts, _prefix_caching, _kv_pressure, _engine_cap_run, _template_overhead, _context_growth, _quantization, _response_cache, _long_outputs,
    ]
    out = []
    not_checked: dict[str, str] = {}
    for rule in rules:
        name = rule.__name__.strip("_")
        try:
            rec = rule(run, w, goal)
        except _NotJudged as e:
            not_checked[name] = e.why
            continue
        except InferlabError as e:  # a what-if the simulator refused: said, not hidden
            rec = Recommendation(name, f"(could not be checked: the {name.replace('_', ' ')} rule)", str(e), "")
        if rec is not None:
            out.append(rec)
    if any(r.rule == "overload" for r in out):
        _unbounded(out)
    _check_baseline(run, w, out)
    return out, [r.__name__.strip("_") for r in rules if r.__name__.strip("_") not in not_checked], not_checked


def _needs_what_if(w: WhatIf) -> None:
    """``_NotJudged`` where a rule that found its trigger has no what-if to judge it with."""
    if not w.available:
        raise _NotJudged(f"no what-if: {w.why_not}")


#: Gains in these, of a run whose queue grew without bound, are the run's length's.
_QUEUED_METRICS = ("TTFT", "E2E")


def _overload(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """An open loop that offered more requests than the server completed, its queue
    growing through the run (the summary's warning, ``results.summary.overload_warning``):
    no engine setting matters until the load fits, so this comes first."""
    warning = next((x for x in run.summary.warnings if x.startswith(OVERLOAD)), None)
    if warning is None:
        return None
    intended = sorted(r.intended_send_ns for r in [*run.records, *run.failed] if r.intended_send_ns is not None)
    offered = ((len(intended) - 1) / ((intended[-1] - intended[0]) / 1e9)
               if len(intended) >= 2 and intended[-1] > intended[0] else None)
    completed = run.summary.request_throughput_rps
    more = ""
    if offered and completed:
        # (each replica completes what this setup did: as many again as the offered rate needs)
        replicas = math.ceil(offered / completed * w.replicas)
        how = (f"sim run --replicas {replicas}" if run.config.get("command") == "sim run"
               else "inferlab gateway with one --upstream per replica")
        more = (f" (about {completed:,.1f} req/s here), or {replicas} replicas of this setup behind a router to serve "
                f"{offered:,.1f} req/s ({how})")
    return Recommendation(
        "overload", "More requests arrive than the server completes: its queue grows without bound", warning,
        f"send no more than the server completes{more}, or admission control at a gateway that turns the excess "
        "away (inferlab gateway [admission] mode = \"requests\" with a small queue_max: HTTP 503 at once) so the "
        "requests it lets through keep their latency",
        note="while the queue grows, every request waits longer than the one before: TTFT and E2E depend on how long "
             "the run went on, so no item here quotes a gain in them",
    )


#: A what-if's rerun whose baseline TTFT p50 is this many times the run's (or a fraction
#: as large), or whose mean prompt differs by ``BASELINE_PROMPT_SHARE``, is not the run.
BASELINE_FACTOR = 1.5
BASELINE_PROMPT_SHARE = 0.1


def _baseline_off(run: _Run, w: WhatIf) -> str | None:
    """How the what-if's rerun without a change (its baseline) differs from the run, in
    words; None where they agree (mean prompt tokens within ``BASELINE_PROMPT_SHARE``,
    TTFT p50 within ``BASELINE_FACTOR``). The rerun rebuilds the prompts with the
    simulator's own chat template and tokenizer, not the server's: a server whose
    template adds a long system text, or that turned requests away, ran another
    workload than the rerun does."""
    base = w.simulate()
    ran, rerun = _inputs(run.records), _inputs(base.records)
    said = []
    if ran and rerun:
        a, b = statistics.fmean(ran), statistics.fmean(rerun)
        if abs(b - a) > BASELINE_PROMPT_SHARE * a:
            said.append(f"its prompts average {b:,.0f} tokens against the run's {a:,.0f}")
    ttft_run, ttft_rerun = run.summary.ttft_ms, base.result.summary.ttft_ms
    if ttft_run is not None and ttft_rerun is not None and ttft_run.p50 > 0 and ttft_rerun.p50 > 0:
        ratio = ttft_rerun.p50 / ttft_run.p50
        if not 1 / BASELINE_FACTOR <= ratio <= BASELINE_FACTOR:
            said.append(f"its TTFT p50 is {ttft_rerun.p50:,.1f} ms against the run's {ttft_run.p50:,.1f} ms")
    return "; ".join(said) or None


def _check_baseline(run: _Run, w: WhatIf, recs: list[Recommendation]) -> None:
    """Where the what-if's baseline is not the run (``_baseline_off``), the gains
    predicted from it are dropped, and each item that had one says why: a gain from a
    baseline the run did not have is no gain of the run's."""
    if not w.available or not any(w.method in g.kind for r in recs for g in r.gains):
        return
    off = _baseline_off(run, w)
    if off is None:
        return
    _drop_gains(recs, lambda g: w.method in g.kind, (
        f"no predicted gain: the simulator's rerun of this run without the change is not the run ({off}; the rerun "
        "builds prompts with the simulator's own chat template, and leaves out what the server refused), so a gain "
        "from it would be from a baseline the run did not have"))


def _unbounded(recs: list[Recommendation]) -> None:
    """A run whose queue grew without bound (``_overload``): the TTFT and E2E gains of
    the other items are dropped, and each says why (they compare two latencies that
    grow with the run's length, so the gain does too)."""
    _drop_gains([r for r in recs if r.rule != "overload"],
                lambda g: any(m in (g.metric_class or g.metric) for m in _QUEUED_METRICS),
                "no TTFT or E2E gain quoted: the run offered more than the server completed, and in a queue that "
                "grows without bound those grow with the run's length")


def _drop_gains(recs: list[Recommendation], drop: Callable[[Gain], bool], why: str) -> None:
    """The gains ``drop`` picks left out of ``recs``; an item that lost any says ``why``."""
    for r in recs:
        kept = [g for g in r.gains if not drop(g)]
        if len(kept) < len(r.gains):
            r.gains = kept
            r.note = f"{r.note}; {why}" if r.note else why


def _itls(records: Sequence[RequestRecord], keep: Callable[[RequestRecord], bool]) -> list[float]:
    return [g for r in records if keep(r) for g in request_metrics(r).itl_ms]


#: A budget may cost the short requests' TTFT p90 this much at most.
HOL_TTFT_SLACK = 0.10


@dataclass(frozen=True)
class _Mixed:
    """A run whose prompts mix long ones with short: which are which."""

    threshold: float  # tokens: a prompt this long is long
    median: float
    long_n: int
    total: int

    def short(self, r: RequestRecord) -> bool:
        return bool(r.input_tokens) and (r.input_tokens or 0) <= self.threshold / 4

    def long(self, r: RequestRecord) -> bool:
        return (r.input_tokens or 0) >= self.threshold


def _mixed(run: _Run) -> _Mixed | None:
    """Long prompts (``LONG_PROMPT_TOKENS`` and ``LONG_PROMPT_RATIO`` × the shortest
    tenth's) beside short ones; None when the run has not both. (The shortest tenth, not
    the median: in a flood of long prompts the long ones are most of the requests.)"""
    inputs = _inputs(run.records)
    if len(inputs) < 4:
        return None
    median = statistics.median(inputs)
    shortest = statistics.quantiles(inputs, n=10, method="inclusive")[0]
    threshold = max(LONG_PROMPT_TOKENS, LONG_PROMPT_RATIO * shortest)
    long_n = sum(1 for x in inputs if x >= threshold)
    if long_n == 0 or long_n == len(inputs):
        return None
    return _Mixed(threshold, median, long_n, len(inputs))


def _slo_out_of_reach(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """An SLO the engine cannot meet at any load for a request of the run's median size:
    one such request, alone on the engine with nothing queued beside it
    (``WhatIf.alone``), already takes longer than the limit. No batching, admission or
    load setting goes below that floor; only a faster engine (GPU, tensor parallelism,
    quantization, a smaller model) or smaller requests do. A limit is judged only where
    the run missed it at its median too, and where the floor is below the run's own
    median (else the alone request is not the run's: prompts the run's cache served make
    TTFT and E2E shorter than an uncached one alone, so those are not judged then)."""
    slo = run.summary.slo
    if slo is None or (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms) == (None, None, None):
        return None
    _needs_what_if(w)  # (the floor is the simulator's)
    inputs = _inputs(run.records)
    outputs = [r.output_tokens for r in run.records if r.output_tokens]
    if not inputs or not outputs:
        return None
    size_in, size_out = round(statistics.median(inputs)), round(statistics.median(outputs))
    try:
        alone = w.alone(size_in, size_out)
    except InferlabError:
        return None
    floor = alone.result.summary
    s = run.summary
    cached = any(r.cached_tokens for r in run.records)
    beyond = [(name, cls, limit, got.p50, lone.p50, key) for name, cls, limit, got, lone, key in (
        ("TTFT", "TTFT", None if cached else slo.ttft_ms, s.ttft_ms, floor.ttft_ms, "ttft_ms"),
        ("TPOT", "TPOT/ITL", slo.tpot_ms, s.tpot_ms, floor.tpot_ms, "tpot_ms"),
        ("E2E", "E2E", None if cached else slo.e2e_ms, s.e2e_ms, floor.e2e_ms, "e2e_ms"),
    ) if limit is not None and got is not None and lone is not None and limit < lone.p50 <= got.p50]
    if not beyond:
        return None

    def met(key: str, limit: float) -> str:
        values = [v for r in run.records for v in [getattr(request_metrics(r), key)] if v is not None]
        share = sum(v <= limit for v in values) / len(values) if values else 0.0
        return f"; {share:.0%} of the run's requests met it" if share else ""

    evidence = (f"one request of the run's median size ({size_in:,} prompt and {size_out:,} answer tokens), alone on "
                "the engine with nothing queued beside it, already misses the SLO: "
                + "; ".join(f"{name} {lone:,.1f} ms against ≤ {limit:,g} ms (the run: p50 {got:,.1f} ms{met(key, limit)})"
                            for name, _, limit, got, lone, key in beyond))
    what = {n for n, *_ in beyond}
    engine = run.engine() or {}
    bits = str(engine.get("quantization") or "").lower()
    fewer = ([] if any(b in bits for b in ("awq", "gptq", "int4", "w4", "4bit", "nvfp4", "mxfp4"))
             else ["4-bit weights"] if bits not in ("", "none") else ["fp8 or 4-bit weights"])
    ways = (["a faster GPU or more tensor parallelism", *fewer, "a smaller model"]
            + (["shorter prompts (a shorter system prompt or context)"] if "TTFT" in what else [])
            + (["shorter answers (max_tokens)"] if "E2E" in what else []))
    kind = f"prediction: simulator, {w.describe_engine()}, one request of {size_in:,}/{size_out:,} tokens at a time"
    return Recommendation(
        "slo_out_of_reach", "The SLO is out of this engine's reach at any load, for a request of the median size",
        evidence,
        "no load, batching or admission setting meets it; only a faster engine or smaller requests do: "
        + ", ".join(ways) + "; or an SLO this engine can meet",
        [_sim_gain(f"{name} p50 ms: the run's, then one request alone (the floor)", cls, got, lone, kind, alone)
         for name, cls, _, got, lone, _key in beyond],
        "the floor is the simulator's for this model, GPU and engine flags: one request alone, its prompt not cached; "
        "requests smaller than the median may meet the SLO",
    )


def _head_of_line(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """Long prompts beside short ones: each long prefill is one long engine step that
    stalls every running stream (and delays the next arrivals). A smaller per-step budget
    splits it into chunks: shorter stalls. Chosen: the smallest candidate budget that
    keeps the short requests' TTFT p90 within ``HOL_TTFT_SLACK`` of the current one."""
    mix = _mixed(run)
    if mix is None:
        return None
    short, long = mix.short, mix.long
    ttft, itl = _ttfts(run.records, short), _itls(run.records, short)
    if len(ttft) < 2 or len(itl) < 2:
        return None
    evidence = (
        f"{mix.long_n} of {mix.total} prompts are {mix.threshold:,.0f}+ tokens (median {mix.median:,.0f}); the short ones' "
        f"streams stall: inter-token gap p99 {_p(itl, 0.99):,.0f} ms against a median of {statistics.median(itl):,.1f} ms; "
        f"their TTFT p90 {_p(ttft, 0.9):,.0f} ms against a p50 of {statistics.median(ttft):,.0f} ms"
    )
    engine = run.engine()
    flags = run.flags()
    change = (
        "a smaller per-step token budget, so long prompts are prefilled in chunks between the other streams' tokens: "
        "{budget}{seqs}; for the short requests' TTFT as well, admit by prompt tokens in flight at a gateway, so long "
        "prompts queue apart"
    )
    title = "Long prompts hold up the short ones (head-of-line blocking)"
    if not w.available or engine is None:
        if _p(itl, 0.99) < 4 * statistics.median(itl):
            return None
        return Recommendation(
            "head_of_line", title, evidence,
            change.format(budget=_smaller_budget(flags, run.stated_budget()), seqs=""), note=f"no prediction: {w.why_not}",
        )
    budget = int(engine.get("max_num_batched_tokens") or 8192)
    seqs = int(engine.get("max_num_seqs") or 256)
    # an engine whose prefill steps exclude decodes stalls every stream for each chunk
    # whatever its size: smaller chunks help only with the chunks in the decodes' steps
    mixing = engine.get("mixed_batches") is False and bool(flags.mix)
    base = w.simulate()
    base_ttft, base_itl = _ttfts(base.records, short), _itls(base.records, short)
    if not base_ttft or not base_itl:
        return None
    chosen = None
    rules = _family_rules(engine)  # (SGLang's budget bounds prompt chunks only: its cap stays)
    for candidate in (4096, 2048, 1024, 512):
        if candidate >= budget:
            continue
        changes: dict[str, Any] = {"max_num_batched_tokens": candidate, "enable_chunked_prefill": True,
                                   **({"max_num_seqs": min(seqs, candidate)} if rules.budget_bounds_decodes else {}),
                                   **({"mixed_batches": True} if mixing else {})}
        sim = w.simulate(changes)
        after_ttft = _ttfts(sim.records, short)
        if after_ttft and _p(after_ttft, 0.9) <= (1 + HOL_TTFT_SLACK) * _p(base_ttft, 0.9):
            chosen = (candidate, sim)
    if chosen is None:
        return None
    candidate, sim = chosen
    before, after = _p(base_itl, 0.99), _p(_itls(sim.records, short), 0.99)
    if (before - after) / before < MIN_GAIN:
        return None
    kind = _prediction(w, f"--max-num-batched-tokens {candidate} against {budget}" + (", mixed steps" if mixing else ""))
    gains = [
        _sim_gain("short requests' p99 inter-token gap ms", "TPOT/ITL", before, after, kind, sim),
        _sim_gain("short requests' mean TPOT ms", "TPOT/ITL", _mean_tpot(base.records, short), _mean_tpot(sim.records, short), kind, sim),
        _sim_gain("short requests' p90 TTFT ms", "TTFT", _p(base_ttft, 0.9), _p(_ttfts(sim.records, short), 0.9), kind, sim),
    ]
    long_before, long_after = _ttfts(base.records, long), _ttfts(sim.records, long)
    if long_before and long_after:
        gains.append(_sim_gain("long requests' mean TTFT ms", "TTFT", statistics.fmean(long_before), statistics.fmean(long_after), kind, sim))
    why_cap = ("vLLM: no more sequences than budget tokens" if not rules.default_seqs_follow_budget
               else "as simulated: no more sequences than budget tokens a step")
    seq_note = f"; with {flags.seqs.format(n=candidate)} ({why_cap})" if candidate < seqs and rules.budget_bounds_decodes else ""
    budget_text = flags.budget.format(n=candidate) + (f" with {flags.mix}" if mixing else "")
    return Recommendation(
        "head_of_line", title, evidence, change.format(budget=budget_text, seqs=seq_note), gains,
        f"the smallest budget tried (4096, 2048, 1024, 512) that keeps the short requests' TTFT p90 within {HOL_TTFT_SLACK:.0%}; "
        "long prompts take more, smaller steps, so their own TTFT grows",
    )


Setting = TypeVar("Setting")


def _lowest_short_ttft(
    tries: Iterable[tuple[Setting, Simulated]], mix: _Mixed, q: float, ok: Callable[[Simulated], bool] = lambda sim: True,
) -> tuple[float, Setting, Simulated] | None:
    """Of the what-ifs ``tries`` (a setting, the workload simulated with it) that refuse
    nothing, complete short requests and pass ``ok``, the one whose short
    requests' TTFT ``q``-quantile is lowest: (that quantile, its setting, its what-if);
    None: none qualified."""
    best: tuple[float, Setting, Simulated] | None = None
    for setting, sim in tries:
        ttft = _ttfts(sim.records, mix.short)
        if sim.result.summary.counts.failed or not ttft or not ok(sim):
            continue
        if best is None or _p(ttft, q) < best[0]:
            best = (_p(ttft, q), setting, sim)
    return best


def _token_admission(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """Long prompts beside short ones, the short ones' TTFT up: a gateway that admits by
    tokens in flight (``inferlab gateway``, its own admission code run in virtual time)
    holds the long prompts back while short requests pass, which a smaller engine budget
    cannot do (the engine serves its queue first come, first served). Tried: a budget of
    2, 3 or 4 of the largest request's reservation (prompt + output tokens) per engine;
    chosen: the lowest short-request TTFT p99 that keeps output tokens/s within the
    goal's ``THROUGHPUT_SLACK`` of the run's and refuses nothing with the
    gateway's default queue bound and timeout."""
    mix = _mixed(run)
    if mix is None:
        return None
    _needs_what_if(w)
    base = w.simulate()
    before = _ttfts(base.records, mix.short)
    base_tps = base.result.summary.output_token_throughput_tps
    if len(before) < 2 or not base_tps:
        return None
    largest = max((r.input_tokens or 0) + (r.output_tokens or 0) for r in base.records)
    # the gateway's own defaults for the rest (queue bound and timeout): the setting
    # recommended is the setting simulated, refusals included
    tries = ((k * largest, w.simulate(admission=AdmissionConfig(mode="tokens", max_tokens_in_flight=k * largest)))
             for k in (2, 3, 4))

    def keeps_throughput(sim: Simulated) -> bool:
        tps = sim.result.summary.output_token_throughput_tps
        return tps is not None and tps > 0 and tps >= (1 - THROUGHPUT_SLACK[goal]) * base_tps

    best = _lowest_short_ttft(tries, mix, 0.99, keeps_throughput)
    if best is None:
        return None
    p99_after, budget, sim = best
    p99_before = _p(before, 0.99)
    if (p99_before - p99_after) / p99_before < MIN_GAIN:
        return None
    kind = _prediction(w, f"inferlab gateway admitting by tokens, {budget:,} in flight per engine")
    gains = [
        _sim_gain("short requests' p99 TTFT ms", "TTFT", p99_before, p99_after, kind, sim),
        _sim_gain("output tok/s", "throughput", base_tps, sim.result.summary.output_token_throughput_tps or 0.0, kind, sim),
    ]
    long_before, long_after = _ttfts(base.records, mix.long), _ttfts(sim.records, mix.long)
    if long_before and long_after:
        gains.append(_sim_gain("long requests' mean TTFT ms", "TTFT", statistics.fmean(long_before), statistics.fmean(long_after), kind, sim))
    return Recommendation(
        "token_admission", "Let short requests past long prompts: admit by tokens in flight at a gateway",
        f"{mix.long_n} of {mix.total} prompts are {mix.threshold:,.0f}+ tokens; the short requests' TTFT p99 "
        f"{_p(_ttfts(run.records, mix.short), 0.99):,.0f} ms against a p50 of {statistics.median(_ttfts(run.records, mix.short)):,.0f} ms",
        f"inferlab gateway --upstream URL --config gateway.toml with [admission] mode = \"tokens\", "
        f"max_tokens_in_flight = {budget:,} (per engine; {budget // largest} of the largest requests at once), "
        # (the prediction counts prompts exactly; the gateway's default, 4 characters a
        # token, counts other prompts otherwise, and then another number of them fits)
        "tokenizer = \"upstream\" (prompts counted by the engine's own /tokenize, as the prediction counts them; "
        "an engine without one is counted at 4 characters a token, and then another number of them fits)",
        gains,
        f"long prompts wait at the gateway while short ones pass (a size-aware queue; a waiter older than starvation_s goes first), "
        f"so their own TTFT grows, and throughput may fall (allowed for the {goal} goal: {THROUGHPUT_SLACK[goal]:.0%}); "
        "predicted with the gateway's own admission code in front of the simulated engine",
    )


def _split_long_prompts(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """Long prompts beside short ones where a smaller budget offers nothing
    (``_head_of_line``), as when they are rare: each long prefill still stalls every
    stream on the engine it lands on, and the short requests that arrive meanwhile.
    Routing them to replicas of their own (``split-by-length``, the gateway's router)
    keeps the short ones from ever queueing behind them. Compared on as many engines
    both ways: the run's replicas, or two for a run on one engine (which adds one):
    least-outstanding against the split with 1 … N−1 replicas taking prompts of
    ``_mixed``'s threshold; chosen: the one that lowers the short requests' TTFT p90
    most, refusing nothing; recommended where it lowers that or their p99 inter-token
    gap by ``MIN_GAIN``."""
    mix = _mixed(run)
    if mix is None or w.router == SPLIT:
        return None
    _needs_what_if(w)
    if _head_of_line(run, w, goal) is not None:
        return None
    n = max(2, w.replicas)
    plain = w.simulate(routing=Routing(n, "least-outstanding"))
    ttft, itl = _ttfts(plain.records, mix.short), _itls(plain.records, mix.short)
    if len(ttft) < 2 or len(itl) < 2:
        return None
    threshold = math.ceil(mix.threshold)
    tries = ((routing, w.simulate(routing=routing)) for routing in (Routing(n, SPLIT, threshold, k) for k in range(1, n)))
    best = _lowest_short_ttft(tries, mix, 0.9)
    if best is None:
        return None
    _, routing, sim = best
    before = (_p(ttft, 0.9), _p(itl, 0.99))
    after = (_p(_ttfts(sim.records, mix.short), 0.9), _p(_itls(sim.records, mix.short), 0.99))
    if all((b - a) / b < MIN_GAIN for b, a in zip(before, after, strict=True)):
        return None
    k = routing.long_replicas
    kind = _prediction(w, f"{n} replicas, prompts of {threshold:,}+ tokens routed to {k} of them ({SPLIT}), against "
                          f"{n} behind least-outstanding")
    gains = [
        _sim_gain("short requests' p90 TTFT ms", "TTFT", before[0], after[0], kind, sim),
        _sim_gain("short requests' p99 inter-token gap ms", "TPOT/ITL", before[1], after[1], kind, sim),
    ]
    long_before, long_after = _ttfts(plain.records, mix.long), _ttfts(sim.records, mix.long)
    if long_before and long_after:
        gains += [
            _sim_gain("long requests' mean TTFT ms", "TTFT", statistics.fmean(long_before), statistics.fmean(long_after), kind, sim),
            _sim_gain("long requests' p90 TTFT ms", "TTFT", _p(long_before, 0.9), _p(long_after, 0.9), kind, sim),
        ]
    seen_ttft, seen_itl = _ttfts(run.records, mix.short), _itls(run.records, mix.short)
    evidence = (f"{mix.long_n} of {mix.total} prompts are {mix.threshold:,.0f}+ tokens (median {mix.median:,.0f}), and a "
                "smaller per-step budget gains nothing here (the head-of-line rule); each long prefill still holds up "
                "the engine it lands on")
    if len(seen_ttft) >= 2 and len(seen_itl) >= 2:
        evidence += (f": the short requests' TTFT p90 {_p(seen_ttft, 0.9):,.0f} ms against a p50 of "
                     f"{statistics.median(seen_ttft):,.0f} ms, their inter-token gap p99 {_p(seen_itl, 0.99):,.0f} ms "
                     f"against a median of {statistics.median(seen_itl):,.1f} ms")
    sim_flags = f"--replicas {n} --router {SPLIT} --long-prompt-tokens {threshold} --long-replicas {k}"
    gpus = (f"on the run's {n} replicas: no GPU added" if w.replicas == n else
            f"this adds a replica ({n} engines where the run had {w.replicas}); the gain is against the same {n} engines "
            "behind least-outstanding, so it is the split's, not the added GPU's")
    return Recommendation(
        "split_long_prompts", "Send the long prompts to a replica of their own", evidence,
        f"inferlab gateway over {n} replicas with [gateway] router = \"{SPLIT}\", long_prompt_tokens = {threshold}, "
        f"long_upstreams = [the URL{'s' if k > 1 else ''} of {k} of them] (in the simulator: sim run {sim_flags})",
        gains,
        f"{gpus}; the long prompts share {k} of the {n} replicas, so they queue behind each other and their own TTFT "
        "grows (above); each request waits for room on its own replicas, and goes to the others only when none of "
        "its own is up",
    )


def _mean_tpot(records: Sequence[RequestRecord], keep: Callable[[RequestRecord], bool]) -> float:
    values = [t for r in records if keep(r) for t in [request_metrics(r).tpot_ms] if t is not None]
    return statistics.fmean(values) if values else 0.0


def _shares_prefixes(run: _Run) -> str | None:
    wl = run.workload()
    if wl.get("prefix_groups") or wl.get("prefix_tokens"):
        return f"prompts share {wl.get('prefix_tokens') or '?'}-token prefixes in {wl.get('prefix_groups') or 1} group(s) (the workload)"
    if wl.get("sessions"):
        return f"{wl['sessions']} multi-turn sessions resend their history (the workload)"
    if wl.get("system_tokens"):
        return f"every prompt starts with the same {wl['system_tokens']}-token system prompt (the workload)"
    return None


def _hit_rate(run: _Run) -> tuple[float | None, str]:
    s = run.summary
    if s.cached_tokens is not None and s.input_tokens:
        return s.cached_tokens / s.input_tokens, "usage.cached_tokens"
    m = s.server_metrics
    if isinstance(m, ServerMetrics) and m.prefix_cache_hit_rate is not None:
        return m.prefix_cache_hit_rate, "the server's /metrics"
    return None, "unknown"


def _prefix_caching(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    shared = _shares_prefixes(run)
    if shared is None:
        return None
    rate, source = _hit_rate(run)
    off = run.prefix_caching_off()
    caching_off = off is not None
    if not caching_off and (rate is None or rate >= LOW_HIT_RATE):
        return None  # on and used (or nothing says otherwise)
    seen = "no hit rate reported" if rate is None else f"{rate:.0%} of prompt tokens served from cache ({source})"
    evidence = f"{shared}; {seen}" + (f"; {off}" if off else "")
    if caching_off:
        where = " for the engines behind the gateway" if run.engine() is None and run.gateway_engines() else ""
        change = f"turn prefix caching on{where}: {_prefix_on(run.flags(), run.engine_file_off())}"
        title = "Prompts share prefixes but prefix caching is off"
    else:
        change = ("keep shared text at the very start of every prompt (system prompt first, no per-request IDs or "
                  "timestamps before it), and route a session or prefix to the same replica at the gateway")
        title = "Prompts share prefixes but the cache is not hit"
        # the prefixes may not fit: then the cache evicts them before their next use, whatever the prompts' order
        wl = run.workload()
        prefixes = int(wl.get("prefix_tokens") or 0) * int(wl.get("prefix_groups") or (1 if wl.get("prefix_tokens") else 0))
        held = w.simulate().result.engine if w.available and prefixes else None
        if held is not None and prefixes > held.kv_capacity_tokens / 2:
            evidence += (f"; the shared prefixes are {prefixes:,} tokens and the KV cache holds {held.kv_capacity_tokens:,}, "
                         "the running requests' own tokens included: they are evicted before they are used again")
            change = ("give the cache room for the shared prefixes (more KV memory, fp8 KV, a bigger GPU or -tp 2), or "
                      "route each prefix group to one replica at the gateway so each replica holds fewer")
            title = "Prompts share prefixes but the KV cache is too small to keep them"
    if not w.available or not caching_off:
        return Recommendation("prefix_caching", title, evidence, change, note="" if w.available else f"no prediction: {w.why_not}")
    base, on = w.simulate(), w.simulate({"enable_prefix_caching": True})
    b, a = _ttfts(base.records, lambda r: True), _ttfts(on.records, lambda r: True)
    if not b or not a:
        return None
    kind = _prediction(w, "--enable-prefix-caching")
    return Recommendation(
        "prefix_caching", title, evidence, change,
        [_sim_gain("mean TTFT ms", "TTFT", statistics.fmean(b), statistics.fmean(a), kind, on),
         _sim_gain("p90 TTFT ms", "TTFT", _p(b, 0.9), _p(a, 0.9), kind, on)],
    )


def _kv_full(run: _Run, cap: int | None = None) -> list[str]:
    """What says a run's KV cache was full, in words: preemptions (the server's
    /metrics, the simulated server's timeline per request, or a sim run's own count in
    its summary), KV usage up to ``KV_PRESSURE`` (/metrics), or too little of it free to
    admit the next prompt (``_kv_admission``, below ``cap`` where given, else the run's
    own); empty where nothing does."""
    m = run.summary.server_metrics
    preempted = sum(int((r.server_timeline or {}).get("preemptions") or 0) for r in run.records)
    parts = []
    if isinstance(m, ServerMetrics) and m.available:
        if (m.counters.get("preemptions") or 0) > 0:
            parts.append(f"{m.counters['preemptions']:,.0f} preemptions (/metrics)")
        kv = m.gauges.get("kv_usage")
        if kv is not None and kv.max >= KV_PRESSURE:
            parts.append(f"KV cache up to {kv.max:.0%} full (/metrics)")
        admission = _kv_admission(run, cap)
        if admission:
            parts.append(admission)
    if preempted and not parts:
        parts.append(f"{preempted} preemptions (the simulated server's timeline)")
    counted = run.summary.prediction.get("preemptions") if isinstance(run.summary.prediction, dict) else None
    if not parts and isinstance(counted, int) and counted > 0:
        parts.append(f"{counted:,} preemptions (the simulated engine's count)")
    return parts


#: A real server's /metrics samples with requests waiting that the KV cache had no room
#: to admit: at least this share of those taken during the run, to be evidence.
KV_ADMISSION_SHARE = 0.25
#: The sequence cap counts as reached at this share of it (the gauge's max running).
CAP_REACHED = 0.9


def _kv_admission(run: _Run, cap: int | None = None) -> str | None:
    """Where a real server's cache was too full to admit the next prompt, in words: its
    /metrics samples (``server_metrics.jsonl``) with requests waiting while fewer ran than
    its cap (``cap``, else ``_seq_cap``; any number where neither is known), its KV usage leaving fewer
    free blocks (its stated blocks × (1 − usage)) than the run's median prompt needs
    (prompt tokens / block size, rounded up), in ``KV_ADMISSION_SHARE`` of the samples
    or more. None where the server stated no blocks of a known size, or nothing shows it."""
    stated = _stated_blocks(run.server_settings()) if run.engine() is None else None
    prompts = _inputs(run.records)
    if stated is None or not prompts:
        return None
    blocks, size = stated
    if size is None:
        return None
    prompt = statistics.median(prompts)
    need = math.ceil(prompt / size)
    cap = cap or _seq_cap(run)
    rows = _series(run.dir)
    during = [r for r in rows if all(isinstance(r.get(k), int | float) for k in ("waiting", "running", "kv_usage"))]
    held = [r for r in during if r["waiting"] >= 1 and (cap is None or r["running"] < cap)
            and blocks * (1 - r["kv_usage"]) < need]
    if not held or len(held) < KV_ADMISSION_SHARE * max(1, len(during)):
        return None
    worst = max(held, key=lambda r: r["kv_usage"])
    below = f"below its cap of {cap}" if cap is not None else "the server stated no cap on running requests"
    return (f"{len(held)} of {len(during)} /metrics samples had requests waiting (up to {max(r['waiting'] for r in held):,.0f}) "
            f"while {max(r['running'] for r in held):,.0f} at most ran ({below}), the KV cache up to "
            f"{worst['kv_usage']:.0%} used: about {blocks * (1 - worst['kv_usage']):,.1f} of its {blocks:,} blocks free, "
            f"fewer than the {need:,} blocks of {size:,} tokens a {prompt:,.0f}-token prompt (the run's median) needs: "
            "the cache too full to admit the next prompt")


def _series(d: Path) -> list[dict[str, Any]]:
    """A run's /metrics samples (``server_metrics.jsonl``); empty where it has none or
    they cannot be read."""
    out = []
    with contextlib.suppress(OSError), (d / SERVER_METRICS_FILE).open() as f:
        for line in f:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    out.append(row)
    return out


def _no_gauges(run: _Run) -> str | None:
    """Why a real server's KV usage is not known for a run, in words: /metrics not read,
    a /metrics that exposes none (``missing``: llama.cpp's, whose builds since its
    kv_cache_usage_ratio went name none; a longer run would not show it either), or no
    page sampled during the run (it ended before the first, at 1 s); None where it is
    known, or the run's engine is simulated (its own counts say)."""
    if run.engine() is not None or run.config.get("command") == "sim run":
        return None
    m = run.summary.server_metrics
    if not isinstance(m, ServerMetrics):
        return "the run did not read the server's /metrics"
    if not m.available:
        return f"the server's /metrics not available ({m.reason or 'no page'})"
    if "kv_usage" in m.gauges:
        return None
    if "kv_usage" in m.missing:
        whose = f"{m.server}'s" if m.server else "the server's"
        return f"{whose} /metrics exposes no KV usage" + (" nor preemptions" if "preemptions" in m.missing else "")
    return "no server metrics sampled during the run (it ended before the first sample, at 1 s)"


def _queue_bound(run: _Run) -> Gain | None:
    """What more KV room could gain a real server's run at most, from the measurement:
    the mean TTFT less the mean wait in the server's queue (``latency_breakdown``, from
    its /metrics), the only part of it that room to admit requests removes; None
    without a queue time."""
    b = run.summary.latency_breakdown
    queue = b.server_queue_ms if b is not None else None
    ttft = run.summary.ttft_ms
    if queue is None or ttft is None or queue.mean is None or queue.mean <= 0:
        return None
    return Gain("mean TTFT ms", ttft.mean, max(0.0, ttft.mean - queue.mean),
                f"bound from the measurement: at best, none of the wait in the server's queue (mean {queue.mean:,.1f} ms, "
                "its /metrics) is left; the recompute of preempted requests not counted")


def _kv_pressure(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    parts = _kv_full(run)
    if not parts and w.available and run.config.get("command") == "sim run":
        # a sim run written before its summary kept the engine's count: a rerun's
        engine_run = w.simulate().result.engine
        if engine_run is not None and engine_run.preemptions_total > 0:
            parts.append(f"{engine_run.preemptions_total:,} preemptions (the simulated engine's count)")
    preempts = bool(parts) and any("preemption" in p for p in parts)
    engine = run.engine()
    held = None
    if not parts and w.available and engine is not None and engine.get("capacity_scheduler_policy") == "GUARANTEED_NO_EVICT":
        # GUARANTEED_NO_EVICT never preempts: a full cache holds requests back instead,
        # seen as what a cache twice the size does to TTFT
        base = w.simulate()
        blocks = base.result.engine.num_kv_blocks if base.result.engine is not None else 0
        more = w.simulate({"num_gpu_blocks_override": 2 * blocks}) if blocks else None
        before = base.result.summary.ttft_ms
        after = more.result.summary.ttft_ms if more is not None else None
        if more is not None and before is not None and after is not None and after.p50 < (1 - KV_HELD_GAIN) * before.p50:
            parts.append(f"requests wait for KV room to reach their output limits (the GUARANTEED_NO_EVICT capacity "
                         f"policy never preempts): a cache twice the size ({2 * blocks:,} blocks) cuts TTFT p50 "
                         f"{before.p50:,.0f} → {after.p50:,.0f} ms (the simulated engine)")
            held = (before.p50, after.p50, more)
    if not parts:
        if (why := _no_gauges(run)) is not None:
            raise _NotJudged(why)
        return None
    family = str((engine or {}).get("engine_family") or "vllm")
    flags = run.flags()
    settings = run.server_settings() if engine is None else {}
    stated = _stated_blocks(settings)
    if stated is not None:
        parts.append(f"the server had {_blocks_words(*stated)} (its stated settings)")
    elif (pool := _count(settings.get("kv_cache_tokens"))) is not None:  # (SGLang's token pool)
        page = _count(settings.get("block_size"))
        parts.append(f"the server had a KV pool of {pool:,} tokens" + (f" in pages of {page:,}" if page else "")
                     + " (its stated settings)")
    cpu = _vllm_cpu(run.server_software(), run.config.get("engine_config")) if engine is None else None
    if cpu is not None and flags is _VLLM_CPU_FLAGS:
        parts.append(f"vLLM's CPU build ({cpu})")
    change, halves = _kv_room(engine, flags, settings, run.dir / ENGINE_LOG)
    if held is not None:
        policy = ("scheduler_config capacity_scheduler_policy: MAX_UTILIZATION" if family == "trtllm"
                  else "the simulator's --capacity-scheduler-policy MAX_UTILIZATION")
        change += f"; or admit more and preempt when the cache fills ({policy})"
    title = ("The KV cache is full: requests are preempted and recomputed" if preempts
             else "The KV cache is full: requests wait for room" if held is not None
             else "The KV cache is too full to admit the next prompt: requests wait for room"
             if any(p.endswith("too full to admit the next prompt") for p in parts) else "The KV cache is full")
    rec = Recommendation("kv_pressure", title, "; ".join(parts), change)
    if engine is None:  # (a real server: bounded from the measurement, no what-if)
        bound = _queue_bound(run)
        if bound is not None:
            rec.gains.append(bound)
        else:
            rec.note = ("no bound: the run has no server queue time (the server's /metrics queue histogram) to bound "
                        "a gain by")
    if held is not None:
        rec.gains.append(_sim_gain("TTFT p50 ms", "TTFT", held[0], held[1],
                                   _prediction(w, "a KV cache twice the size"), held[2]))
    if w.available and engine is not None and halves:
        base, fp8 = w.simulate(), w.simulate({"kv_cache_dtype": "fp8"})
        kind = _prediction(w, "--kv-cache-dtype fp8")
        e2e_b = [request_metrics(r).e2e_ms or 0 for r in base.records]
        e2e_a = [request_metrics(r).e2e_ms or 0 for r in fp8.records]
        if e2e_b and e2e_a:
            rec.gains.append(_sim_gain("p90 E2E ms", "E2E", _p(e2e_b, 0.9), _p(e2e_a, 0.9), kind, fp8))
        tb, ta = base.result.summary.output_token_throughput_tps, fp8.result.summary.output_token_throughput_tps
        if tb and ta:
            rec.gains.append(_sim_gain("output tokens/s", "throughput", tb, ta, kind, fp8))
    return rec


def _kv_room(engine: dict[str, Any] | None, flags: _EngineFlags, settings: dict[str, Any] | None = None,
             log: Path | None = None) -> tuple[str, bool]:
    """The change that gives an engine's KV cache more room, in its own flags, and
    whether fp8 KV (half the bytes per token) is among them. ``settings``: a real
    server's (``_stated_settings``), whose stated KV blocks a block count is sized from;
    where they give --num-gpu-blocks-override, that is the change (``_override_room``),
    ``log`` the server's log that may say what memory allowed."""
    override = _count((settings or {}).get("num_gpu_blocks_override")) if engine is None else None
    if override is not None:
        return _override_room(override, flags, log), False
    family = str((engine or {}).get("engine_family") or "vllm")
    fixed = (engine or {}).get("num_gpu_blocks_override") is not None  # (a pool of N blocks: no dtype or share moves it)
    halves = (engine is None or engine.get("kv_cache_dtype") in (None, "auto")) and bool(flags.kv_fp8) and not fixed
    room = [flags.kv_fp8 if halves else "", flags.kv_share, flags.kv_limits]
    stated = _stated_blocks(settings or {}) if engine is None else None
    if stated is not None and flags.kv_blocks:
        room.insert(2, f"e.g. {flags.kv_blocks.format(n=2 * stated[0])} (twice the {stated[0]:,} blocks it had)")
    if family == "lmdeploy":  # (its int8 KV is not simulated: named, no prediction)
        room.insert(0, "int8 KV (--quant-policy 8; not simulated)")
    change = "give the KV cache more room: " + ", ".join(r for r in room if r)
    change += f"; or {flags.kv_hardware}" if flags.kv_hardware else ""
    if fixed and engine is not None:
        change = (f"give the KV cache more room: more than the {engine['num_gpu_blocks_override']:,} blocks "
                  "--num-gpu-blocks-override fixes (while it is given, no dtype, memory share or GPU changes the cache)")
    return change, halves


def _override_room(blocks: int, flags: _EngineFlags, log: Path | None) -> str:
    """A real vLLM server's cache fixed at ``blocks`` by --num-gpu-blocks-override: the
    override is the change (vLLM allocates the blocks it names in place of those memory
    allows, ``_OVERRIDE_LOG``: no dtype or memory setting moves the cache while it is
    given), within what memory allows (the log's count where ``log`` has it); the other
    knobs only once it is removed."""
    allowed = _memory_blocks(log)
    within = (f"memory allowed {allowed:,} blocks (its log: \"Overriding num_gpu_blocks={allowed} with "
              f"num_gpu_blocks_override={blocks}\")" if allowed is not None else
              "vLLM allocates the blocks it names whatever memory it measured: its log's \"Overriding "
              "num_gpu_blocks=N with num_gpu_blocks_override=...\" gives N, the blocks memory allows")
    removed = ", ".join(r for r in (flags.kv_fp8, flags.kv_share) if r)
    return (f"give the KV cache more room: raise --num-gpu-blocks-override above the {blocks:,} blocks it fixes "
            f"(e.g. --num-gpu-blocks-override {2 * blocks}), within what memory allows ({within}); while it is given, "
            f"no dtype or memory setting changes the cache; once it is removed, the cache is sized by memory: {removed}"
            + (f"; or {flags.kv_limits}" if flags.kv_limits else ""))


def _overhead_cost(w: WhatIf, prompt_tokens: int, overhead: int) -> tuple[float, Simulated] | None:
    """The TTFT ms ``overhead`` of a ``prompt_tokens`` prompt costs one request alone on
    the run's engine (its prompt not cached), and the simulation with them; None where
    the engine is not simulated or refuses."""
    if not w.available or prompt_tokens <= overhead:
        return None
    try:
        full, less = w.alone(prompt_tokens, 1), w.alone(max(1, prompt_tokens - overhead), 1)
    except InferlabError:
        return None
    a, b = full.result.summary.ttft_ms, less.result.summary.ttft_ms
    return None if a is None or b is None else (max(0.0, a.p50 - b.p50), full)


def _alone_kind(w: WhatIf, prompt_tokens: int, overhead: int) -> str:
    """The kind of ``_overhead_cost``'s gain: one request alone, of the run's own mean
    prompt length, not the rerun (its baseline is not the run's workload rebuilt)."""
    return (f"prediction: simulator, {w.describe_engine()}, one request alone of {prompt_tokens:,} prompt tokens and "
            f"of {max(1, prompt_tokens - overhead):,}")


def _template_overhead(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """The chat template and the system prompt, prefilled again for every request: an
    item where they are many tokens (``OVERHEAD_TOKENS``, or ``OVERHEAD_SHARE`` of the
    prompt) and their cost is of consequence: on a simulated engine, one request's TTFT
    with and without them differs by ``MIN_GAIN`` of the run's TTFT p50 or more (a stock
    template of a few dozen tokens costs a fraction of a ms); elsewhere, the share alone
    says nothing of the cost, and ``OVERHEAD_TOKENS`` it must be. None where the prefix
    cache serves them already (a request's median cached tokens cover them); where
    prefix caching is off, turning it on is the change: they open every prompt
    unchanged, the prefix it serves after the first request."""
    s = run.summary
    template = s.prompt_overhead_tokens if isinstance(s.prompt_overhead_tokens, int) else 0
    system = int(run.workload().get("system_tokens") or 0)
    inputs = _inputs(run.records)
    if not inputs:
        return None
    mean_in = statistics.fmean(inputs)
    overhead = template + system
    if overhead < OVERHEAD_TOKENS and overhead < OVERHEAD_SHARE * mean_in:
        return None
    off = run.prefix_caching_off()
    cached = [r.cached_tokens for r in run.records if r.cached_tokens is not None]
    if off is None and cached and statistics.median(cached) >= 0.9 * overhead:
        return None  # (the prefix cache serves them: shortening them saves little)
    evidence = (f"{overhead:,} of a mean {mean_in:,.0f} prompt tokens are the system prompt ({system:,}) "
                f"and the chat template ({template:,}): {overhead / mean_in:.0%}")
    ttft = s.ttft_ms
    costed = _overhead_cost(w, round(mean_in), overhead)
    if costed is not None and ttft is not None and ttft.p50 > 0:
        cost = costed[0]
        if cost < MIN_GAIN * ttft.p50:
            return None  # (a few tokens' prefill beside the TTFT the run had)
        evidence += (f"; they cost a request about {cost:,.1f} ms of TTFT (one request alone on the simulated engine, "
                     f"with and without them), {cost / ttft.p50:.0%} of the run's TTFT p50 ({ttft.p50:,.1f} ms)")
    elif overhead < OVERHEAD_TOKENS:
        return None  # (a share of short prompts, at a cost not known: nothing says it matters)
    else:
        costed = None
        evidence += "; their TTFT cost not estimated (" + (w.why_not or "no TTFT measured") + ")"
    if off is not None:
        evidence += f"; {off}"
        rec = Recommendation(
            "template_overhead", "The system prompt and template are prefilled again for every prompt: prefix caching is off",
            evidence,
            f"turn prefix caching on, {_prefix_on(run.flags(), run.engine_file_off())}: the template and system prompt open every prompt "
            "unchanged, a prefix the cache serves after the first request; or shorten them (the application)",
        )
        if costed is not None:
            rec.gains.append(_sim_gain("TTFT ms the template and system prompt cost a request", "TTFT", costed[0], 0.0,
                                       _alone_kind(w, round(mean_in), overhead) + "; once cached, about nothing",
                                       costed[1]))
        return rec
    change = "shorten the system prompt and the template (the application): every request prefills those tokens, unless the prefix cache holds them"
    rec = Recommendation("template_overhead", "The system prompt and template are a large part of every prompt", evidence, change)
    if w.available and system:
        cut = max(0, system // 2)
        base, short = w.simulate(), w.simulate(workload={"system_tokens": cut})
        b, a = _ttfts(base.records, lambda r: True), _ttfts(short.records, lambda r: True)
        if b and a:
            if statistics.fmean(a) > 0.95 * statistics.fmean(b):  # (the prefix cache already serves it: little to win)
                return None
            rec.gains.append(_sim_gain("mean TTFT ms", "TTFT", statistics.fmean(b), statistics.fmean(a),
                                       _prediction(w, f"a {cut}-token system prompt instead of {system}"), short))
    if not rec.gains and costed is not None:
        rec.gains.append(_sim_gain("TTFT ms the template and system prompt cost a request", "TTFT", costed[0], 0.0,
                                   f"bound: at best, without them ({_alone_kind(w, round(mean_in), overhead)})",
                                   costed[1]))
    return rec


def _context_growth(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """Prompts that grow turn by turn: a sliding window over the history, where the
    what-if (sessions of the run's, with ``--context-window-tokens``) predicts it lowers
    mean TTFT by ``MIN_GAIN`` at least. A window changes where every later prompt
    starts, so the prefix cache no longer finds the history: where the cache serves
    it, the window costs TTFT, and nothing is advised."""
    by_turn: dict[int, list[int]] = {}
    for r in run.records:
        if r.turn is not None and r.input_tokens:
            by_turn.setdefault(r.turn, []).append(r.input_tokens)
    if len(by_turn) < 2:
        return None
    first, last = statistics.fmean(by_turn[min(by_turn)]), statistics.fmean(by_turn[max(by_turn)])
    if last < CONTEXT_GROWTH * first:
        return None
    evidence = f"prompts grow with the conversation: {first:,.0f} tokens at turn {min(by_turn)}, {last:,.0f} at turn {max(by_turn)}"
    window = int(2 * first)
    change = (f"compress the history (summarise earlier turns) or keep a sliding window of the last ~{window:,} tokens "
              f"(the application; inferlab models it with --context-window-tokens {window}); either changes where each "
              "later prompt starts, so the prefix cache no longer finds the history: it pays where the history is not "
              "served from the cache")
    rec = Recommendation("context_growth", "Multi-turn context keeps growing", evidence, change)
    if w.available and run.workload().get("sessions"):
        try:
            base, win = w.simulate(), w.simulate(workload={"context_window_tokens": window})
        except UsageError:  # (a window the run's exchanges do not fit: no prediction)
            return rec
        b, a = _ttfts(base.records, lambda r: True), _ttfts(win.records, lambda r: True)
        if b and a:
            before, after = statistics.fmean(b), statistics.fmean(a)
            if (before - after) / before < MIN_GAIN:
                return None  # the cache serves the history: a window would cost TTFT, not save it
            rec.gains.append(_sim_gain("mean TTFT ms", "TTFT", before, after,
                                       _prediction(w, f"--context-window-tokens {window}"), win))
    return rec


def _quantization(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    engine = run.engine()
    slo = run.summary.slo
    tpot = run.summary.tpot_ms
    if (engine is not None and engine.get("quantization")) or tpot is None:
        return None
    missed = slo is not None and slo.tpot_ms is not None and tpot.p90 > slo.tpot_ms
    if not missed and goal != "latency":
        return None  # for a latency target only: one missed, or latency the goal
    _needs_what_if(w)  # (what fp8 weights gain is the simulator's, and so are the weights it knows)
    if engine is None:
        return None
    base, fp8 = w.simulate(), w.simulate({"quantization": "fp8"})
    tb, ta = base.result.summary.tpot_ms, fp8.result.summary.tpot_ms
    if tb is None or ta is None or (tb.p50 - ta.p50) / tb.p50 < MIN_GAIN:
        return None
    why = f"TPOT p90 {tpot.p90:,.1f} ms" + (
        f" against an SLO of {slo.tpot_ms:g} ms" if missed and slo is not None else " (no TPOT SLO missed: shown because latency is the goal)"
    )
    kind = _prediction(w, "--quantization fp8")
    return Recommendation(
        "quantization", "Decode speed: fp8 weights (or a smaller model) for a latency target", why,
        f"serve fp8 weights of {engine.get('model')} ({run.flags().fp8}), or a smaller model",
        [_sim_gain("TPOT p50 ms", "TPOT/ITL", tb.p50, ta.p50, kind, fp8)], "check quality on your own evaluation first",
    )


#: Failed requests, as a share of those measured, past which they come first: the other
#: rules read the completed ones alone, which a run that lost these does not represent.
FAILED_SHARE = 0.05

#: (what an error message says, what to change), the first that matches
_FAILURE_CHANGES = (
    (("max-model-len", "max_model_len", "context length", "maximum context"),
     "prompts (with their answers) longer than the engine's context: a larger --max-model-len where the KV cache "
     "has room, or shorter prompts (truncate or summarise at the application)"),
    # (before "429": a server that turns requests away past its own queue answers 429 too,
    # as inferlab sim serve does past --max-waiting-requests)
    (("overloaded", "too many requests are waiting"),
     "the server turned them away with its queue of waiting requests full (not a key's limit): fewer requests at "
     "once or a lower rate, more replicas, or a longer queue on the server (inferlab sim serve --max-waiting-requests)"),
    (("429", "rate limit", "ratelimit"), "the key's rate limits refused them: raise its limits, or send them more slowly"),
    (("no upstream had room", "queue", "503"),
     "the gateway's admission turned them away: a larger admission budget or queue, more replicas, or fewer requests at once"),
    (("timed out", "timeout"), "they timed out: less load, or a longer --timeout where the server was still working"),
)


def _failures(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """Requests that failed, first: everything else is read from the completed ones."""
    c = run.summary.counts
    measured = c.completed + c.failed
    if not c.failed or c.failed < FAILED_SHARE * measured:
        return None
    examples = run.summary.error_examples
    said = "; ".join(f"{kind}: {message}" for kind, message in list(examples.items())[:2])
    unknown = "find why from the errors (requests.jsonl's error column) before tuning anything else"

    def cause(text: str) -> str:
        return next((what for words, what in _FAILURE_CHANGES if any(word in text for word in words)), unknown)

    # each failed request's own cause (one error kind holds many: a key's 429s and the
    # engine's 400s are both HTTP statuses), the commonest first
    causes = Counter(cause(f"{r.error_kind} {r.status} {r.error}".lower()) for r in run.failed)
    if not causes:  # (records not at hand: the summary's examples)
        causes = Counter({cause(" ".join([*examples, *examples.values()]).lower()): c.failed})
    change = causes.most_common(1)[0][0] if len(causes) == 1 else "; ".join(
        f"{n:,} of them: {what}" for what, n in causes.most_common())
    return Recommendation(
        "failures", "Requests failed",
        f"{c.failed:,} of {measured:,} requests failed ({said}); the other items read the {c.completed:,} that completed",
        change,
    )


def _engine_cap_run(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    """More requests in flight than the engine runs at once: the rest wait in its queue.
    Raising its cap to the run's concurrency is predicted where the engine is simulated,
    and advised where that gains (throughput, or E2E for the other goals). On a real
    server that stated its cap (or was started with one), a measured finding without a
    prediction (``_queued_at_cap``); on one that stated none, not judged."""
    cap, users = _seq_cap(run), run.concurrency()
    if users is None or users <= 1:
        return None
    if cap is None:
        if not w.available:
            raise _NotJudged("the server stated no cap on running requests, and no what-if: " + w.why_not)
        return None
    if users <= cap:
        return None
    if not w.available:
        return _queued_at_cap(run, w, cap, users)
    raised = int(users)
    gains = _raised_cap_gains(w, run.flags(), raised)
    if len(gains) < 2:
        return None
    tps, e2e = gains
    if tps.after < (1 + MIN_GAIN) * tps.before and e2e.after > (1 - MIN_GAIN) * e2e.before:
        return None  # (neither more throughput nor a shorter E2E worth the change)
    return _engine_cap_rec(
        "The engine's own cap on running requests holds the load back", run.flags(), raised,
        f"{users:g} requests in flight, but the engine runs at most {cap} at once ({run.flags().seqs.format(n=cap)}): "
        "the rest wait in its queue", gains, run.server_settings(), run.config.get("engine_config"),
    )


def _queued_at_cap(run: _Run, w: WhatIf, cap: int, users: float) -> Recommendation | None:
    """A real server's stated cap of ``cap`` running requests below the run's
    ``users`` in flight, and the run's own measurements showing requests beyond it (its
    records in flight at once, and /metrics' waiting requests where it was read):
    measured, with no prediction of what raising the cap gains (no what-if). None where
    they show none waiting, or fewer running than ``CAP_REACHED`` of the cap."""
    in_flight = peak_overlap((r.send_ns, r.end_ns) for r in run.records if r.send_ns is not None and r.end_ns is not None)
    if in_flight <= cap:
        return None
    m = run.summary.server_metrics
    waiting = m.gauges.get("waiting") if isinstance(m, ServerMetrics) and m.available else None
    running = m.gauges.get("running") if isinstance(m, ServerMetrics) and m.available else None
    if waiting is not None and waiting.max <= 0:
        return None  # (the server's own count says nothing waited: the stated cap is not what held them)
    if running is not None and running.max < CAP_REACHED * cap:
        return None  # (its running requests never reached the cap: something else, the KV cache, held the rest)
    flags = run.flags()
    seen = [f"up to {in_flight} requests in flight at once (the run's records)"]
    if waiting is not None:
        seen.append(f"the server's /metrics: up to {waiting.max:,.0f} waiting" + (
            f" beside {running.max:,.0f} running" if running is not None else ""))
    ttft, tpot = run.summary.ttft_ms, run.summary.tpot_ms
    if ttft is not None and tpot is not None:
        seen.append(f"TTFT p50 {ttft.p50:,.1f} ms against a TPOT p50 of {tpot.p50:,.1f} ms (the wait for a slot is in TTFT)")
    rec = _engine_cap_rec(
        "More requests in flight than the server runs at once: the rest wait in its queue", flags, int(users),
        f"{users:g} requests in flight, but the server runs at most {cap} at once ({flags.seqs.format(n=cap)}; stated "
        f"by the server or its engine config): " + "; ".join(seen), None, run.server_settings(),
        run.config.get("engine_config"),
    )
    rec.change += f"; or send at most {cap} at once (the client's concurrency), so requests wait at the client instead"
    rec.note = f"no prediction: {w.why_not}"
    return rec


def _raised_cap_gains(w: WhatIf, flags: _EngineFlags, raised: int) -> list[Gain]:
    """The run rerun with the engine's cap on running requests at ``raised``: its
    output tokens/s and E2E p50, predicted (none where the engine is not simulated)."""
    if not w.available:
        return []
    base, more = w.simulate(), w.simulate({"max_num_seqs": raised})
    kind = _prediction(w, flags.seqs.format(n=raised))
    sb, sm = base.result.summary, more.result.summary
    gains = []
    if sb.output_token_throughput_tps and sm.output_token_throughput_tps:
        gains.append(_sim_gain("output tokens/s", "throughput", sb.output_token_throughput_tps,
                               sm.output_token_throughput_tps, kind, more))
    if sb.e2e_ms is not None and sm.e2e_ms is not None:
        gains.append(_sim_gain("E2E p50 ms", "E2E", sb.e2e_ms.p50, sm.e2e_ms.p50, kind, more))
    return gains


def _engine_cap_rec(title: str, flags: _EngineFlags, raised: int, evidence: str,
                    gains: list[Gain] | None = None, settings: dict[str, Any] | None = None,
                    engine_config: Any = None) -> Recommendation:
    """The ``engine_cap`` item: raise the engine's cap on running requests to ``raised``
    (the evidence says what it was; ``settings`` and ``engine_config``, the server's, say
    a slot's context where its slots share one: ``_raise_cap``)."""
    return Recommendation("engine_cap", title, evidence, _raise_cap(flags, raised, settings or {}, engine_config),
                          gains or [])


def _raise_cap(flags: _EngineFlags, raised: int, settings: dict[str, Any], engine_config: Any) -> str:
    """The change that raises the engine's cap on running requests to ``raised``. Where
    its slots split one context (``_EngineFlags.slots_context``: llama.cpp's), the
    context is raised with them, to ``raised`` × a slot's context now (``settings``'
    ``max_model_len``: what the server or its engine config says a slot has): the cap
    alone would shrink every slot's, and requests that fit one now would fail."""
    if not flags.slots_context:
        return (f"raise the cap ({flags.seqs.format(n=raised)}) where its KV cache has room for that many requests "
                "(a capped engine leaves much of it unused)")
    slot = _count(settings.get("max_model_len"))
    if slot is None:
        return (f"raise the slots and the context with them, where memory has room for it: {flags.seqs.format(n=raised)}, "
                f"the context raised in proportion ({flags.slots_split})")
    change = (f"raise the slots and the context with them, where memory has room for it: "
              f"{flags.slots_context.format(n=raised, ctx=raised * slot)} ({raised} × the {slot:,} tokens a slot has now: "
              f"{flags.slots_split})")
    if isinstance(engine_config, dict) and engine_config.get("engine") == "llamacpp":
        change += (f"; in the engine file, max_num_seqs = {raised} with max_model_len = {slot} (inferlab passes "
                   "llama-server -c max_model_len × max_num_seqs)")
    return change


def _response_cache(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    if "workload" not in run.config:  # (a gateway's access log: what the prompts were is not known)
        return None
    wl = run.workload()
    if not wl.get("prompt") and (wl.get("input_tokens") or wl.get("trace") or wl.get("dataset") or wl.get("sessions") or wl.get("prefix_groups")):
        return None
    if not run.records or any(r.response_cache_hit for r in run.records):
        return None  # (a response cache in front of the engine answered repeats already)
    e2e = [request_metrics(r).e2e_ms for r in run.records]
    values = [x for x in e2e if x is not None]
    if len(values) < 2:
        return None
    return Recommendation(
        "response_cache", "Identical requests are computed again each time",
        f"every request sent the same prompt and parameters; each took {statistics.median(values):,.0f} ms E2E (median)",
        "answer repeats from a response cache at the gateway (keyed on the whole request; only for deterministic, temperature-0 requests)",
        [Gain("E2E ms of a repeat", statistics.median(values), 0.0, "estimate: a cache hit costs about nothing next to a generation")],
    )


def _long_outputs(run: _Run, w: WhatIf, goal: Goal) -> Recommendation | None:
    outs = [r.output_tokens for r in run.records if r.output_tokens]
    if len(outs) < 2:
        return None
    p90 = _p([float(x) for x in outs], 0.9)
    if p90 < LONG_OUTPUT_TOKENS:
        return None
    tpot = run.summary.tpot_ms
    cap = int(max(256, p90 / 2))
    rec = Recommendation(
        "long_outputs", "Long outputs dominate the time", f"output tokens p90 {p90:,.0f}",
        f"set max_tokens to what the application needs (e.g. {cap}), lower the temperature, and ask for concise answers in the prompt",
    )
    if tpot is not None:
        rec.gains.append(Gain("E2E ms of a p90-long answer", p90 * tpot.p50, cap * tpot.p50, f"estimate: output tokens × the measured TPOT p50 ({tpot.p50:.1f} ms)"))
    return rec


# --- a profile ----------------------------------------------------------------------------


def _profile_rules(p: Profile, folder: Path, goal: Goal = "latency",
                   ) -> tuple[list[Recommendation], list[str], dict[str, str]]:
    """The items for a profile, the rules checked, and those that could not judge what
    the profile measured (rule -> why)."""
    out: list[Recommendation] = []
    not_checked: dict[str, str] = {}
    # (a profile of the simulated server measured a simulation: its numbers are predictions)
    simulated = p.server.simulated
    measured = "prediction (the profile's decode runs against the simulated server)" if simulated else "measured (the profile's decode runs)"
    # (the kind of the other gains: bounds and estimates from the profile's own numbers)
    pre, seen = ("prediction, ", "simulated") if simulated else ("", "measured")
    hol = p.factor("head_of_line")
    if hol is not None and hol.measured and hol.data.get("inflation", 0) >= HOL_INFLATION:
        d = hol.data
        out.append(Recommendation(
            "head_of_line", "Long prompts hold up short ones (head-of-line blocking)",
            f"short requests' TTFT × {d['inflation']:.2f} beside {d['long_tokens']:,}-token prompts ({d['short_alone_ttft_ms']:,.0f} → {d['short_with_long_ttft_ms']:,.0f} ms)",
            "for the short requests' TTFT: admission by tokens in flight at a gateway (inferlab gateway, [admission] "
            "mode = \"tokens\"), so long prompts wait apart (an engine serves its queue first come, first served, so "
            "a smaller batching budget alone does not let them pass); for the stalls long prefills put in running "
            f"streams: a smaller budget of tokens a step, {_smaller_budget(_profile_flags(p), _count(_profile_settings(p).get('max_num_batched_tokens')))}",
            [Gain("short requests' TTFT ms (beside long prompts)", d["short_with_long_ttft_ms"], d["short_alone_ttft_ms"], f"{pre}bound: at best, TTFT as {seen} alone")],
        ))
    pc = p.factor("prefix_cache")
    if pc is not None and pc.measured and pc.data.get("saved_ms", 0) <= 0.05 * pc.data.get("ttft_unique_ms", 1):
        d = pc.data
        rec = Recommendation(
            "prefix_caching", "Shared prefixes are not served from cache",
            f"a shared {d['prefix_tokens']:,}-token prefix saved {signed_ms(d['saved_ms'])} ms TTFT ({d['ttft_shared_ms']:,.0f} vs {d['ttft_unique_ms']:,.0f} ms)",
            f"turn prefix caching on: {_profile_prefix_on(p)}",
        )
        shared = folder / "prefix" / "shared"
        if (shared / "summary.json").exists():
            with contextlib.suppress(InferlabError):
                run = _Run.read(shared)
                w = WhatIf(shared, run.config)
                if w.available:
                    b, a = w.simulate(), w.simulate({"enable_prefix_caching": True})
                    tb, ta = _ttfts(b.records, lambda r: True), _ttfts(a.records, lambda r: True)
                    if tb and ta:
                        rec.gains.append(_sim_gain("median TTFT ms of the shared-prefix prompts", "TTFT", statistics.median(tb),
                                                   statistics.median(ta), _prediction(w, "--enable-prefix-caching"), a))
                    _check_baseline(run, w, [rec])
        out.append(rec)
    dec = p.factor("decode")
    # (the knee found again from the ladder's points: a profile written before ``fits.knee``
    # required every higher concurrency to stop paying kept a knee its points do not show)
    pts = {r["concurrency"]: r for r in dec.data.get("points", [])} if dec is not None and dec.measured else {}
    k = knee(sorted(pts), [pts[c]["output_tps"] or 0.0 for c in sorted(pts)], [None] * len(pts)).knee_concurrency
    said = dec.data.get("quality") if dec is not None else None
    quality: dict[str, Any] = said if isinstance(said, dict) else decode_quality(list(pts.values()))
    short = decode_quality_words(quality)
    if dec is not None and k:
        top = max(pts)
        cap = _count(_profile_settings(p).get("max_num_seqs"))
        past = _ladder_runs(folder, dec.runs, k)
        full = _kv_full_runs(past, cap) if top > k else []
        running = _most_running(past)
        found: Recommendation | None = None
        if full:  # (the cache, not the GPU or the cap, made the knee: a cap gives it no room)
            found = _ladder_kv_rec(p, folder, full, pts, k, top)
        elif top > k and cap is not None and _cap_made_knee(cap, k, running):
            flags = _profile_flags(p)
            ran = "" if running is None else f", and up to {running:,.0f} ran (/metrics)"
            found = _engine_cap_rec(
                "The engine's own cap on running requests is the knee", flags, max(top, 2 * cap),
                f"the engine runs at most {cap} request{'' if cap == 1 else 's'} at once ({flags.seqs.format(n=cap)}){ran}; past it the rest "
                f"wait in its queue: output {pts[k]['output_tps']:,.0f} tokens/s at concurrency {k} vs "
                f"{pts[top]['output_tps']:,.0f} at {top}", None, _profile_settings(p), p.engine_config,
            )
        elif top > k and goal != "throughput":  # (a cap gives throughput up for latency: not for that goal)
            found = _ladder_cap_rec(p, pts, k, top, measured, dec.data.get("output_tokens"), goal)
        if found is not None:
            found.evidence += f"; the decode points are {short}" if short else ""
            out.append(found)
    elif dec is not None and dec.measured and short:  # (no knee: from points too short to say there is none)
        for rule in ("concurrency_cap", "engine_cap"):
            not_checked[rule] = f"no knee measured, and the decode points are {short}"
    if dec is not None and dec.measured and not any(r.rule == "kv_pressure" for r in out):
        unsampled = _ladder_unsampled(folder, dec.runs)
        if unsampled:
            not_checked["kv_pressure"] = unsampled
    rc = p.factor("response_cache")
    if rc is not None and rc.measured and not rc.data.get("detected"):
        out.append(Recommendation(
            "response_cache", "No response cache: identical requests are generated again",
            f"a repeated request took {rc.data['ratio']:.0%} of a fresh one's E2E ({rc.data['e2e_repeat_ms']:,.0f} ms)",
            "if your traffic repeats identical deterministic requests, answer them from a cache at the gateway",
            [Gain("E2E ms of a repeat", rc.data["e2e_repeat_ms"], 0.0, f"{pre}estimate: a cache hit costs about nothing next to a generation")],
        ))
    tp = p.factor("template")
    pf = p.factor("prefill")
    if tp is not None and tp.measured and tp.data.get("ttft_cost_ms") and pf is not None and pf.measured:
        cost = tp.data["ttft_cost_ms"]
        tokens = tp.data["overhead_tokens"]
        fit = pf.data["fit"]
        overhead = fit["overhead_ms"]
        # the TTFT of a short (128-token) prompt with the template, by the prefill fit:
        # what the template's share is judged against
        short = max(0.0, overhead) + (cost + 128 * 1000 / fit["prefill_tps"] if fit.get("prefill_tps") else cost)
        # the prefix cache factor: a shared prefix that saved TTFT means the cache serves
        # the template too (it opens every prompt unchanged); one that saved none, off
        cache_on = pc is not None and pc.measured and pc.data.get("saved_ms", 0) > 0.05 * pc.data.get("ttft_unique_ms", 1)
        cache_off = pc is not None and pc.measured and not cache_on
        # (a prefill line the profile found not to be trusted: its cost per token is said
        # with its caveats wherever it is a gain's basis)
        quality = pf.data.get("quality") or {}
        caveat = "" if quality.get("trusted", True) else (
            "; the prefill rate behind it is not to be trusted: " + "; ".join(quality.get("caveats", [])))
        if tokens >= OVERHEAD_TOKENS and cost >= MIN_GAIN * short and not cache_on:
            evidence = (f"{tokens} tokens per request, {cost:.1f} ms of prefill each, {cost / short:.0%} of a "
                        f"128-token prompt's TTFT ({short:,.0f} ms by the prefill fit; fixed overhead {overhead:.0f} ms)"
                        + caveat)
            if cache_off:
                out.append(Recommendation(
                    "template_overhead", "The chat template is prefilled again for every prompt: prefix caching looks off",
                    evidence + "; a shared prefix saved no TTFT (the prefix cache factor)",
                    f"turn prefix caching on, {_profile_prefix_on(p)}: the template opens every prompt unchanged, "
                    "a prefix the cache serves after the first request; or a leaner chat template (the application or "
                    "--chat-template)",
                    [Gain("TTFT ms of the template's tokens", cost, 0.0,
                          f"{pre}estimate: its tokens × the {seen} prefill cost{caveat}; once cached, about nothing")],
                ))
            else:
                out.append(Recommendation(
                    "template_overhead", "The chat template adds many tokens to every prompt", evidence,
                    "use a leaner chat template (the application or --chat-template)",
                    [Gain("TTFT ms of the template's tokens", cost, 0.0, f"{pre}estimate: its tokens × the {seen} prefill cost{caveat}")],
                    "" if pc is not None and pc.measured else "whether the prefix cache serves it was not measured "
                    "(the prefix cache factor): where it does, the template costs little",
                ))
    return out, list(_PROFILE_EVIDENCE), not_checked


def _profile_flags(p: Profile) -> _EngineFlags:
    """The flags of the server a profile measured (``_server_flags``): a real server's
    by the software it said it is, or the engine config it was started from, as a run's are."""
    return _server_flags(p.engine, p.server_software, p.engine_config)


def _profile_prefix_on(p: Profile) -> str:
    """How to turn the profiled server's prefix caching on (``_prefix_on``)."""
    return _prefix_on(_profile_flags(p), p.engine is None and _engine_file_off(p.engine_config))


def _profile_settings(p: Profile) -> dict[str, Any]:
    """The settings of the server profiled: its simulated engine's, else those a real
    server stated over its engine config's (``_stated_settings``)."""
    return p.engine if p.engine is not None else _stated_settings(p.server_software, p.engine_config)


def _improves(g: Gain) -> bool:
    """Whether a gain is one by ``MIN_GAIN`` at least: more of a throughput, less of a
    time."""
    pct = g.delta_pct
    if pct is None:
        return False
    more = "tokens/s" in g.metric or "tok/s" in g.metric or "req/s" in g.metric
    return pct >= 100 * MIN_GAIN if more else pct <= -100 * MIN_GAIN


def _kv_full_runs(runs: Sequence[tuple[int, _Run]], cap: int | None = None,
                  ) -> list[tuple[int, list[str], _Run]]:
    """The runs (concurrency, run) whose KV cache was full (``_kv_full``, admission
    judged below ``cap``), in the order given, each run once: (concurrency, what says
    so, the run)."""
    seen: set[Path] = set()
    out = []
    for c, run in runs:
        if run.dir not in seen and (parts := _kv_full(run, cap)):
            out.append((c, parts, run))
        seen.add(run.dir)
    return out


def _ladder_runs(folder: Path, runs: Sequence[str], least: int = 0) -> list[tuple[int, _Run]]:
    """The decode ladder's runs at concurrency ``least`` or more, lowest first; runs no
    longer in the folder left out."""
    found = []
    for name in runs:
        with contextlib.suppress(InferlabError):
            run = _Run.read(folder / name)
            c = run.concurrency()
            if c is not None and c >= least:
                found.append((int(c), run))
    return sorted(found, key=lambda f: f[0])


def _most_running(runs: Sequence[tuple[int, _Run]]) -> float | None:
    """The most requests the server's /metrics saw running in the runs (concurrency,
    run); None where none of them sampled it."""
    seen = [g.max for _, run in runs
            if isinstance(m := run.summary.server_metrics, ServerMetrics) and m.available
            and (g := m.gauges.get("running")) is not None]
    return max(seen) if seen else None


def _cap_made_knee(cap: int, knee_at: float, running: float | None) -> bool:
    """Whether the engine's own cap on running requests made a knee at ``knee_at``: the
    cap at or below it, and the running requests (the most /metrics saw at the knee or
    past it) up to ``CAP_REACHED`` of it, where they were seen. Checked after the KV
    cache (``_kv_full_runs``): a cache full before the cap leaves the cap unreached."""
    return cap <= knee_at and (running is None or running >= CAP_REACHED * cap)


def _ladder_unsampled(folder: Path, runs: Sequence[str]) -> str | None:
    """Why the KV rule cannot judge a real server's decode ladder, in words: none of its
    runs knew the server's KV usage (``_no_gauges``: each ended before /metrics' first
    sample, or it was not read) nor counted a preemption; None where one did, or the
    server is simulated."""
    ladder = _ladder_runs(folder, runs)
    whys = [_no_gauges(run) for _, run in ladder]
    if not ladder or any(w is None for w in whys) or any(_kv_full(run) for _, run in ladder):
        return None
    return f"none of the decode runs knew the server's KV usage: at concurrency {ladder[-1][0]}, {whys[-1]}"


def _ladder_kv_rec(p: Profile, folder: Path, full: list[tuple[int, list[str], _Run]], pts: dict[int, Any],
                   k: int, top: int) -> Recommendation:
    """The decode ladder's knee where its runs show the KV cache full (``_knee_kv_rec``)."""
    change, _ = _kv_room(p.engine, _profile_flags(p), _profile_settings(p), folder / ENGINE_LOG)
    return _knee_kv_rec(
        f"output {pts[k]['output_tps']:,.0f} tokens/s at concurrency {k} vs {pts[top]['output_tps']:,.0f} at {top}, "
        f"TTFT p50 {pts[k]['ttft_ms_p50']:,.0f} → {pts[top]['ttft_ms_p50']:,.0f} ms", change, full)


def _knee_kv_rec(numbers: str, change: str, full: list[tuple[int, list[str], _Run]]) -> Recommendation:
    """A knee (a profile's decode ladder, or a folder of runs) whose runs at it or past it
    show the KV cache full (``full``, lowest concurrency first): room for the cache is the
    change (``change``; a cap on requests in flight would only queue the rest), with a
    cache twice the size predicted at the highest of them where the engine is simulated,
    else bounded by its server's queue time. ``numbers``: what the knee's runs measured."""
    first, last = full[0], full[-1]
    said = "; ".join(f"at concurrency {c:g}: {', '.join(parts)}" for c, parts, _ in (full if len(full) <= 2 else [first, last]))
    rec = Recommendation(
        "kv_pressure", "The KV cache is the limit past the knee: requests are preempted or wait for room",
        f"{numbers}, while the KV cache is full ({said})",
        change + "; a cap on requests in flight gives the cache no room: it only makes the rest wait for a slot",
    )
    run = last[2]
    w = WhatIf(run.dir, run.config)
    if not w.available:  # (a real server: bounded from the measurement at the top concurrency)
        bound = _queue_bound(run)
        if bound is not None:
            bound.metric = f"{bound.metric} at concurrency {last[0]:g}"
            rec.gains.append(bound)
        rec.note = ("no prediction: the simulator has no model of this server" + (
            "" if bound is not None else "; no bound: its runs past the knee have no server queue time (/metrics)"))
        return rec
    base = w.simulate()
    blocks = base.result.engine.num_kv_blocks if base.result.engine is not None else 0
    if not blocks:
        return rec
    more = w.simulate({"num_gpu_blocks_override": 2 * blocks})
    kind = _prediction(w, f"a KV cache twice the size ({2 * blocks:,} blocks), at concurrency {last[0]}")
    sb, sm = base.result.summary, more.result.summary
    if sb.ttft_ms is not None and sm.ttft_ms is not None:
        rec.gains.append(_sim_gain(f"TTFT p50 ms at concurrency {last[0]}", "TTFT", sb.ttft_ms.p50, sm.ttft_ms.p50, kind, more))
    if sb.output_token_throughput_tps and sm.output_token_throughput_tps:
        rec.gains.append(_sim_gain(f"output tokens/s at concurrency {last[0]}", "throughput", sb.output_token_throughput_tps,
                                   sm.output_token_throughput_tps, kind, more))
    return rec


def _ladder_cap_rec(p: Profile, pts: dict[int, Any], k: int, top: int, measured: str,
                    output_tokens: Any, goal: Goal) -> Recommendation | None:
    """A cap on requests in flight at the decode ladder's knee ``k``, for the latency of
    the running streams: what it gives (TPOT) and gives up (throughput), measured, and
    what it costs the requests it holds back (TTFT, estimated); None where nothing it
    gives is worth it (``_improves``), or where it gives up more of the throughput
    measured at ``top`` than the goal's ``THROUGHPUT_SLACK``."""
    at_k, at_top = pts[k], pts[top]
    gains = [Gain("TPOT p50 ms", at_top["tpot_ms_p50"], at_k["tpot_ms_p50"], measured),
             Gain("output tokens/s", at_top["output_tps"], at_k["output_tps"], measured)]
    if not any(_improves(g) for g in gains):
        return None
    if at_k["output_tps"] < (1 - THROUGHPUT_SLACK[goal]) * at_top["output_tps"]:
        return None  # (its own numbers give up more throughput than the goal allows)
    # the held-back requests wait for a slot: {top} users through {k} slots complete
    # as {k} users do (Little's law), so each waits about (top/k - 1) answers at k
    e2e_k = at_k.get("e2e_ms_p50")
    if e2e_k is None and at_k.get("ttft_ms_p50") is not None and isinstance(output_tokens, int):
        e2e_k = at_k["ttft_ms_p50"] + at_k["tpot_ms_p50"] * max(0, output_tokens - 1)
    ttft_cost = ""
    if e2e_k is not None and at_k.get("ttft_ms_p50") is not None and at_top.get("ttft_ms_p50") is not None:
        capped = at_k["ttft_ms_p50"] + (top / k - 1) * e2e_k
        gains.append(Gain(f"TTFT p50 ms of {top} users through {k} slots (the held-back requests wait for one)",
                          at_top["ttft_ms_p50"], capped,
                          f"estimate: Little's law, TTFT at {k} + ({top}/{k} − 1) × E2E p50 at {k} ({e2e_k:,.0f} ms)"))
        ttft_cost = f"; a cap that queues the rest moves their wait into TTFT: about {capped:,.0f} ms p50 at {top} users"
    return Recommendation(
        "concurrency_cap", "Past the knee, more concurrency adds latency, not throughput",
        f"output {at_k['output_tps']:,.0f} tokens/s at concurrency {k} vs {at_top['output_tps']:,.0f} at {top}; "
        f"TPOT {at_k['tpot_ms_p50']:.1f} → {at_top['tpot_ms_p50']:.1f} ms",
        f"cap requests in flight at about {k}: a gateway's max concurrency, or {_profile_flags(p).seqs.format(n=k)}",
        gains,
        f"the cap gives the running streams their TPOT at {k}{ttft_cost}; a gateway that turns the rest away "
        "(HTTP 503) instead keeps TTFT but refuses them",
    )


#: Each profile rule and the factors it reads (all of them measured, or it was not looked at).
_PROFILE_EVIDENCE = {
    "head_of_line": ("head_of_line",), "prefix_caching": ("prefix_cache",), "concurrency_cap": ("decode",),
    "engine_cap": ("decode",), "kv_pressure": ("decode",), "response_cache": ("response_cache",),
    "template_overhead": ("template", "prefill"),
}


def _not_measured(p: Profile) -> list[str]:
    """The profile rules whose factors the profile did not measure (left out by
    --factors, out of budget, or failed): not checked, whatever no item says."""
    measured = {f.name for f in p.factors if f.measured}
    return [rule for rule, factors in _PROFILE_EVIDENCE.items() if not set(factors) <= measured]


# --- a folder of runs ---------------------------------------------------------------------


def _axis_values(runs: list[_Run], index: dict[str, Any] | None) -> dict[Path, dict[str, Any]]:
    """Each run's values of the folder's axes other than the load, from its point's
    params in the sweep index (a tune's: the flags it searched); a run the index has no
    point for (or a folder without one) is left out."""
    axis = (index or {}).get("load_axis")
    params = {str(p.get("dir")): p.get("params") or {} for p in (index or {}).get("points", []) if p.get("dir")}
    out: dict[Path, dict[str, Any]] = {}
    for r in runs:
        rel = next((d for d in params if r.dir.as_posix().endswith(d.rstrip("/"))), None)
        if rel is not None:
            out[r.dir] = {k: v for k, v in params[rel].items() if k not in (axis, "concurrency", "rate")}
    return out


def _sweep_groups(runs: list[_Run], axes: dict[Path, dict[str, Any]]) -> list[list[_Run]]:
    """The runs of one setting each, apart from the load: a sweep's runs of another
    engine flag or workload are another server's or workload's, never one knee's points.
    By their values of the sweep's other axes (``_axis_values``) where known, else by the
    engine each run simulated and its workload."""
    groups: dict[str, list[_Run]] = {}
    for r in runs:
        if r.dir in axes:
            key = json.dumps(axes[r.dir], sort_keys=True, default=str)
        else:
            engine = r.engine()
            key = json.dumps([engine, {k: v for k, v in r.workload().items() if k != "prompt_salt"}],
                             sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _seq_cap(run: _Run) -> int | None:
    """The cap on running sequences the run's engine had: the simulated engine's, else
    the server's settings (``_Run.server_settings``: stated, or its engine config's);
    None where not known."""
    return _count((run.engine() or run.server_settings()).get("max_num_seqs"))


def _engine_cap(a: _Run, b: _Run, cap: int, ta: float, tb: float, running: float | None = None) -> Recommendation:
    """The knee of a sweep whose engine capped running sequences at ``cap``, at or below
    the knee's concurrency, and reached it (``running``: the most /metrics saw, where it
    did): more clients only queue in the engine; raising the cap (KV room permitting)
    is the change, predicted where the engine is simulated."""
    ca, cb = a.concurrency() or 1, b.concurrency() or 1
    raised = max(int(cb), 2 * cap)
    flags = b.flags()
    ran = "" if running is None else f", and up to {running:,.0f} ran (/metrics)"
    return _engine_cap_rec(
        "The engine's own cap on running requests is the knee", flags, raised,
        f"the engine runs at most {cap} requests at once ({flags.seqs.format(n=cap)}){ran}; past it the rest wait in its "
        f"queue: concurrency {ca:g} → {cb:g}, output {ta:,.0f} → {tb:,.0f} tokens/s ({a.dir.name}, {b.dir.name})",
        _raised_cap_gains(WhatIf(b.dir, b.config), flags, raised), b.server_settings(), b.config.get("engine_config"),
    )


#: engine settings that move with the cap on running requests: the cap, and the KV
#: cache's size (the simulator's, a server's stated), which the room kept for that many
#: sequences' activations sets
_WITH_CAP = frozenset({"max_num_seqs", "kv_cache_blocks", "kv_cache_tokens", "num_gpu_blocks"})


def _besides_cap(run: _Run, axes: dict[Path, dict[str, Any]]) -> dict[str, Any]:
    """What ``run`` ran with besides its load and its cap: its values of the folder's
    other axes (``_axis_values``), else, in a folder without an index, its engine's
    settings (simulated, or the server's) less those that move with the cap."""
    if run.dir in axes:
        return {k: v for k, v in axes[run.dir].items() if k != "max_num_seqs"}
    return {k: v for k, v in (run.engine() or run.server_settings()).items() if k not in _WITH_CAP}


def _measured_cap(rec: Recommendation, base: _Run, runs: list[_Run], axes: dict[Path, dict[str, Any]]) -> Recommendation:
    """An ``engine_cap`` item for ``base`` where the folder itself measured a higher
    cap at the same concurrency and workload, every other setting as ``base`` had it
    (another group of its axis, a tune's trial of that cap: a run on another GPU or
    budget is no measure of the cap): the best of those replaces the raise it names,
    its gain measured; where none did better, the item says so and advises keeping the
    cap. Unchanged where none was measured."""
    cap, users, tps = _seq_cap(base), base.concurrency(), base.summary.output_token_throughput_tps
    if cap is None or users is None or not tps:
        return rec
    same = _besides_cap(base, axes)
    higher = [(k, r) for r in runs if (k := _seq_cap(r)) is not None and k > cap and r.concurrency() == users
              and r.workload() == base.workload() and r.summary.output_token_throughput_tps
              and _besides_cap(r, axes) == same]
    if not higher:
        return rec
    k, best = max(higher, key=lambda kr: kr[1].summary.output_token_throughput_tps or 0)
    flags, tb = base.flags(), best.summary.output_token_throughput_tps or 0
    said = "simulated" if server_info(best.config).simulated else "measured"  # (a simulator's numbers are predictions)
    kind = f"{said} in this folder: {flags.seqs.format(n=k)} at concurrency {users:g} ({best.dir.name})"
    gains = [Gain("output tokens/s", tps, tb, kind)]
    if base.summary.e2e_ms is not None and best.summary.e2e_ms is not None:
        gains.append(Gain("E2E p50 ms", base.summary.e2e_ms.p50, best.summary.e2e_ms.p50, kind))
    seen = f"{said} in this folder: {flags.seqs.format(n=k)} at concurrency {users:g}: {tb:,.0f} vs {tps:,.0f} tokens/s"
    if tb > (1 + MIN_GAIN) * tps:
        return _engine_cap_rec(rec.title, flags, k, f"{rec.evidence}; {seen}", gains, base.server_settings(),
                               base.config.get("engine_config"))
    return Recommendation(
        "engine_cap", "A higher cap on running requests was measured here, and gained nothing", f"{rec.evidence}; {seen}",
        f"keep the cap ({flags.seqs.format(n=cap)}): this folder {said} {flags.seqs.format(n=k)} no better", gains,
    )


def _sweep_rules(runs: list[_Run], goal: Goal, index: dict[str, Any] | None = None,
                 ) -> tuple[list[Recommendation], list[str], dict[str, str]]:
    out: list[Recommendation] = []
    pairs = []
    axes = _axis_values(runs, index)
    for group in _sweep_groups(runs, axes):
        by_c = sorted((r for r in group if r.concurrency() and r.summary.output_token_throughput_tps),
                      key=lambda r: r.concurrency() or 0)
        pairs += [(a, b, by_c[i + 1:]) for i, (a, b) in enumerate(itertools.pairwise(by_c))]
    for a, b, higher in pairs:
        ta, tb = a.summary.output_token_throughput_tps or 0, b.summary.output_token_throughput_tps or 0
        la, lb = a.summary.e2e_ms, b.summary.e2e_ms
        ca, cb = a.concurrency() or 1, b.concurrency() or 1
        # (the profile's knee, ``fits.knee``: no higher load bought KNEE_GAIN per doubling over this one)
        past_knee = not any(paid(ca, ta, r.concurrency() or 1, r.summary.output_token_throughput_tps or 0)
                            for r in higher)
        if ta and past_knee and la is not None and lb is not None and lb.p50 > 1.2 * la.p50:
            server = server_info(a.config)
            simulated = server.kind == VIRTUAL  # (error bands: virtual time only)
            source = ("prediction (the sweep's runs, simulated in virtual time)" if simulated
                      else f"prediction (the sweep's runs against {server.where})" if server.simulated
                      else "measured (the sweep's runs)")
            # (as on a profile: the KV cache first, the cap only where the running requests reached it)
            cap = _seq_cap(b)
            past = [(int(r.concurrency() or 1), r) for r in (a, *higher)]  # (``higher`` begins with b)
            full = _kv_full_runs(past, cap)
            running = _most_running(past)
            if full:  # (the cache, not the cap, made this knee: a cap gives it no room)
                out.append(_knee_kv_rec(
                    f"concurrency {ca:g} → {cb:g}: output {ta:,.0f} → {tb:,.0f} tokens/s, E2E p50 {la.p50:,.0f} → "
                    f"{lb.p50:,.0f} ms ({a.dir.name}, {b.dir.name})",
                    _kv_room(b.engine(), b.flags(), b.server_settings() if b.engine() is None else {},
                             b.dir / ENGINE_LOG)[0], full))
                break
            if cap is not None and _cap_made_knee(cap, ca, running):  # (the engine's own cap made this knee: past it requests queue in it)
                out.append(_measured_cap(_engine_cap(a, b, cap, ta, tb, running), b, runs, axes))
                break
            if goal == "throughput":
                break  # (a cap gives throughput up for latency: not for this goal)
            if ta < (1 - THROUGHPUT_SLACK[goal]) * tb:
                continue  # (a cap that gives up more throughput than the goal allows)
            out.append(Recommendation(
                "concurrency_cap", "Past the knee, more concurrency adds latency, not throughput",
                f"concurrency {ca:g} → {cb:g}: output {ta:,.0f} → {tb:,.0f} tokens/s, E2E p50 {la.p50:,.0f} → {lb.p50:,.0f} ms ({a.dir.name}, {b.dir.name})",
                f"keep about {ca:g} requests in flight: fewer clients at once, or a gateway admission limit that turns "
                f"the rest away (inferlab gateway's [admission] mode = \"requests\", max_requests_in_flight = {ca:g}, queue_max = 0: HTTP 503 at once); a limit that only queues them ({a.flags().seqs.format(n=f'{ca:g}')}) moves their wait "
                "into its queue, and their E2E with it",
                [_predicted("E2E p50 ms", "E2E", lb.p50, la.p50, f"{source}: the requests in flight at {ca:g}, not those "
                            "held back", a.summary.prediction),
                 _predicted("output tokens/s", "throughput", tb, ta, f"{source}: the throughput given up", a.summary.prediction)]
                if simulated else
                [Gain("E2E p50 ms", lb.p50, la.p50, f"{source}: the requests in flight at {ca:g}, not those held back"),
                 Gain("output tokens/s", tb, ta, f"{source}: the throughput given up")],
            ))
            break
    # the run rules on each setting's heaviest point (another engine flag or workload is
    # another server's evidence); the same change for several settings is said once
    recs: list[Recommendation] = []
    checked: list[str] = []
    not_checked: dict[str, str] = {}
    said: set[tuple[str, str]] = set()
    for group in _sweep_groups(runs, axes):
        heaviest = max(group, key=lambda r: (r.concurrency() or 0, r.summary.counts.completed))
        found, judged, unjudged = _run_rules(heaviest, goal)
        checked += [c for c in judged if c not in checked]
        not_checked |= {rule: f"{heaviest.dir.name}: {why}" for rule, why in unjudged.items() if rule not in not_checked}
        for r in found:
            if (r.rule, r.change) in said or (r.rule in ("engine_cap", "kv_pressure") and any(o.rule == r.rule for o in out)):
                continue
            said.add((r.rule, r.change))
            r = _measured_cap(r, heaviest, runs, axes) if r.rule == "engine_cap" else r
            r.evidence = f"{heaviest.dir.name}: {r.evidence}"
            recs.append(r)
    return out + recs, ["concurrency_cap", "engine_cap", *checked], not_checked
