"""Validate the simulator against published measurements (``calibration.csv`` format).

Each CSV row is one published benchmark: engine, model, precision, GPU, TP, a load
scenario, and measured TTFT / ITL / TPOT / E2E / throughput with the statistic the
source reports. ``parse_rows`` turns each row into a ``Scenario`` or a ``Skipped`` with
the reason; ``simulate`` runs a scenario in virtual time and computes the same
statistics; ``validate`` does both for a file. Nothing is tuned per row:

- engine: model and GPU presets, TP, quantization and KV dtype from the row; the
  engine's documented scheduler defaults (``_scheduler_defaults``, version-aware for
  vLLM) under the flags the row states in ``engine_config``; one ``Efficiencies``
  override set per engine family (``FAMILY_EFFICIENCIES``);
- workload: fixed lengths; ``U[a,b]`` uniform; ShareGPT-like rows a clipped lognormal
  with the row's mean (``SHAREGPT_*``) at evenly spaced quantiles, seed 0; no two
  prompts share a prefix;
- load: ``offline`` and ``static`` (batch) = every request at t=0 through the engine
  API (no API cost); ``burst`` = every request at t=0 through the server; ``poisson``
  = seeded exponential gaps from t=0; ``constant`` = even gaps; ``closed`` = N users,
  each sending its next request when the previous one finishes.

Rows with huge offline/closed-loop request counts run on a prefix of their requests
(``_OUTPUT_TOKEN_BUDGET`` output tokens, at least ``_MIN_BATCHES`` full batches) and the
duration is extrapolated at the steady completion rate; latencies come from the prefix.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import random
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferlab._errors import InferlabError, UsageError
from inferlab.sim._engine import Engine, EngineConfig, RequestTimeline
from inferlab.sim._hardware import resolve_gpu, resolve_model
from inferlab.sim._steptime import (
    DEFAULT_EFFICIENCIES,
    RooflineStepTime,
    activation_reserve_bytes,
    kv_bytes_per_token,
    weight_bytes_per_rank,
)

# --- constants -----------------------------------------------------------------------------

# One Efficiencies override set per engine family; every row of a family uses it. The
# defaults in ``Efficiencies`` are vLLM V1's (CUDA graphs, ~0.7 ms host cost per step).
FAMILY_EFFICIENCIES: dict[str, dict[str, float]] = {
    "vllm": {},
    # vLLM V0 (< 0.8): scheduling, input preparation and output processing run between
    # GPU steps in the engine process (no overlap), about twice V1's host cost per step.
    "vllm-v0": {"cpu_step_s": 1.5e-3},
    # SGLang: the overlap scheduler hides most host work behind the GPU step.
    "sglang": {"cpu_step_s": 0.3e-3},
    # TensorRT-LLM: C++ batch manager (~1 us per sequence), overlap scheduler, XQA decode
    # attention streaming the (fp8) KV cache closer to peak bandwidth.
    "trtllm": {"cpu_step_s": 0.3e-3, "per_seq_s": 1e-6, "kv_stream": 0.85},
    # LMDeploy TurboMind: C++ persistent batch, FasterTransformer-style decode attention;
    # its 2023-24 releases all-reduce through NCCL (no custom all-reduce): ~25 us each.
    "lmdeploy": {
        "cpu_step_s": 0.3e-3,
        "per_seq_s": 1e-6,
        "kv_stream": 0.85,
        "allreduce_latency_s": 25e-6,
    },
    # Named engines without a set of their own (TGI, nano-vllm, ...): vLLM V1's, untuned.
    "generic": {},
}

# Scheduler defaults per family: max_num_seqs, max_num_batched_tokens, and for TRT-LLM /
# LMDeploy the fraction of free memory (after weights) given to the KV cache.
_SGLANG_DEFAULTS = {"max_num_seqs": 4096.0, "max_num_batched_tokens": 8192.0}  # chunked 8192
_LMDEPLOY_DEFAULTS = {"max_num_seqs": 128.0, "max_num_batched_tokens": 8192.0, "kv_free": 0.8}
_TRTLLM_DEFAULTS = {"max_num_seqs": 2048.0, "max_num_batched_tokens": 8192.0, "kv_free": 0.9}

# ShareGPT V3 through vLLM's sampler (prompt <= 1024, prompt + output <= 2048, both >= 4)
# has heavy-tailed lengths: lognormals with these shapes (coefficient of variation ~1.3
# and ~0.9); means from the row, or these defaults when it gives none.
SHAREGPT_MEAN_INPUT = 220.0
SHAREGPT_MEAN_OUTPUT = 200.0
SHAREGPT_SIGMA_INPUT = 1.0
SHAREGPT_SIGMA_OUTPUT = 0.8
_SHAREGPT_MAX_INPUT = 1024
_SHAREGPT_MAX_TOTAL = 2048

_OUTPUT_TOKEN_BUDGET = 1_000_000
_MIN_BATCHES = 4
_DEFAULT_CLOSED_LOOP_ROUNDS = 10  # requests per user when a closed-loop row gives no count
_SEED = 0

METRIC_CLASS = {
    "ttft_ms": "TTFT",
    "itl_ms": "TPOT/ITL",
    "tpot_ms": "TPOT/ITL",
    "e2e_latency_ms": "E2E",
    "output_tok_per_s": "throughput",
    "total_tok_per_s": "throughput",
    "req_per_s": "throughput",
}
METRIC_COLUMNS = tuple(METRIC_CLASS)
METRIC_CLASSES = ("throughput", "TTFT", "TPOT/ITL", "E2E")
TARGET_PCT = {"throughput": 10.0, "TTFT": 15.0, "TPOT/ITL": 15.0}


# --- data types ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lengths:
    """Token lengths: ``fixed`` (a), ``uniform`` [a, b], or ``sharegpt`` with mean a."""

    kind: str
    a: float
    b: float = 0.0

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


@dataclass(frozen=True)
class Measurement:
    """One published number: ``metric`` is a CSV column; ``stat`` is aggregate (the
    throughputs), mean, median or pNN."""

    metric: str
    stat: str
    value: float


@dataclass(frozen=True)
class Scenario:
    """A row the simulator can run; ``kind`` is offline|static|burst|poisson|constant|closed.

    ``concurrency`` is the batch (static) or user count (closed); ``engine_flags`` are the
    flags the row states, by vLLM name; ``empty_fraction`` is the share of requests the
    source counted with no output and TTFT = E2E = 0 in its means."""

    row_id: str
    family: str
    engine_label: str
    model: str
    gpu: str
    tp: int
    precision: str
    quantization: str | None
    kv_cache_dtype: str
    kind: str
    concurrency: int | None
    rate_rps: float | None
    num_requests: int
    input_len: Lengths
    output_len: Lengths
    measurements: tuple[Measurement, ...]
    engine_flags: tuple[tuple[str, float], ...]
    version: tuple[int, int] | None
    native_max_len: int
    via_server: bool
    empty_fraction: float = 0.0
    assumptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    """A row, or one metric of a row (``reason`` starts with the column), left out."""

    row_id: str
    engine: str
    model: str
    reason: str


@dataclass(frozen=True)
class Comparison:
    """Measured against predicted for one metric of one scenario."""

    scenario: Scenario
    metric: str
    stat: str
    measured: float
    predicted: float

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, in percent of the measurement."""
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def metric_class(self) -> str:
        return METRIC_CLASS[self.metric]


@dataclass
class Report:
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


class ScenarioError(InferlabError):
    """A row cannot be expressed; the message is the reason."""


# --- parsing cells -------------------------------------------------------------------------

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _number(cell: str) -> float | None:
    """The first number in a cell ('1,234.5 mean' -> 1234.5); None for empty/inf/n/a."""
    text = cell.strip().lower().replace(",", "")
    if not text or text.startswith(("inf", "n/a", "na", "-", "none", "?", "all", "open")):
        return None
    m = _NUM.search(text)
    return float(m.group()) if m else None


def _version(cell: str) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", cell)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _family(engine: str, version: tuple[int, int] | None) -> str:
    e = engine.lower()
    if not e.strip() or re.search(r"not stated|unknown|unspecified", e):
        raise ScenarioError("engine not stated: no engine family to take constants from")
    if re.search(r"llama\.?cpp|ollama|exllama|mlc|ctranslate|deepspeed|onnx|mlx", e):
        raise ScenarioError(f"engine {engine!r}: not a continuous-batching engine we model")
    if "sglang" in e:
        return "sglang"
    if re.search(r"tensorrt|trt-?llm|triton", e):
        return "trtllm"
    if re.search(r"lmdeploy|turbomind", e):
        return "lmdeploy"
    if "vllm" in e and "nano" not in e:
        return "vllm-v0" if version is not None and version < (0, 8) else "vllm"
    return "generic"


_MOE = re.compile(
    r"mixtral|moe|deepseek-?(v2|v3|r1)|-a\d+(\.\d+)?b|\d+x\d+b|dbrx|gpt-oss|llama-?4|"
    r"scout|maverick|jamba|arctic|grok|qwen3-(30|235)b|glm-4\.5|kimi"
)
# (family, billions) -> (preset, the checkpoint's own max_position_embeddings)
_MODELS: dict[tuple[str, str], tuple[str, int]] = {
    ("llama-3.1", "8"): ("Llama-3.1-8B", 131072),
    ("llama-3", "8"): ("Llama-3.1-8B", 8192),
    ("llama-3.1", "70"): ("Llama-3.1-70B", 131072),
    ("llama-3.3", "70"): ("Llama-3.1-70B", 131072),
    ("llama-3", "70"): ("Llama-3.1-70B", 8192),
    ("llama-2", "7"): ("Llama-2-7B", 4096),
    ("llama-2", "13"): ("Llama-2-13B", 4096),
    ("llama-2", "70"): ("Llama-2-70B", 4096),
    ("qwen2.5", "7"): ("Qwen2.5-7B-Instruct", 32768),
    ("qwen2.5", "32"): ("Qwen2.5-32B-Instruct", 32768),
    ("qwen3", "8"): ("Qwen3-8B", 40960),
    ("qwen3", "32"): ("Qwen3-32B", 40960),
}


def _model(cell: str) -> tuple[str, int]:
    """Preset and native max length for a model cell ('meta-llama/Meta-Llama-3-8B');
    a '(Llama-3.1-70B architecture)' hint is used when the name itself is unknown."""
    text = cell.lower().replace("_", "-").replace(" ", "-")
    if _MOE.search(text):
        raise ScenarioError(f"model {cell!r}: mixture-of-experts models are not simulated")
    name = text.split("(")[0].split("/")[-1].replace("meta-", "")
    for candidate in (name, text):
        m = re.search(r"(llama-?\d(?:\.\d)?|qwen\d(?:\.\d)?)-(\d+(?:\.\d+)?)b", candidate)
        if m is None:
            continue
        fam = re.sub(r"llama-?(\d)", r"llama-\1", m.group(1))
        if (fam, m.group(2)) in _MODELS:
            return _MODELS[fam, m.group(2)]
    try:  # any other preset, by HF id or name
        spec = resolve_model(cell.split("(")[0].strip())
    except UsageError:
        raise ScenarioError(f"model {cell!r}: no preset with its shapes") from None
    return spec.name, spec.max_position_embeddings


def _gpu(cell: str) -> str:
    t = cell.lower().replace(" ", "-")
    if "gh200" in t:
        raise ScenarioError(f"GPU {cell!r}: no preset (Grace Hopper)")
    if "h200" in t:
        return "H200-SXM-141GB"
    if "h100" in t:
        if re.search(r"pcie|nvl|94gb", t):
            raise ScenarioError(f"GPU {cell!r}: only the H100 SXM has a preset")
        return "H100-SXM-80GB"
    if "a100" in t:
        if re.search(r"40-?gb|pcie", t):
            raise ScenarioError(f"GPU {cell!r}: only the A100 SXM 80GB has a preset")
        return "A100-SXM-80GB"
    if "l40s" in t:
        return "L40S-48GB"
    if "4090" in t:
        return "RTX-4090-24GB"
    raise ScenarioError(f"GPU {cell!r}: no preset")


def _precision(weights: str, model_cell: str) -> tuple[str | None, str]:
    """(quantization flag, label) from the weight-precision cell and the model name."""
    w = f"{weights} {model_cell}".lower()
    if re.search(r"fp4|mxfp|nvfp|w4a8|int3|int2|gguf|q4_|bitsandbytes|nf4", w):
        raise ScenarioError(f"precision {weights!r}: not simulated")
    if "awq" in w:
        return "awq", "awq-int4"
    if "int4" in w or "w4a16" in w or ("gptq" in w and "int8" not in w):
        return "gptq", "int4"
    if "fp8" in w:
        return "fp8", "fp8"
    if "int8" in w or "w8a8" in w:
        return "int8", "int8"  # GPTQ-Int8 is weight-only; at batch 1 only the bytes matter
    if not weights.strip() or re.search(r"bf16|fp16|float16|bfloat16|half|auto", w):
        return None, "bf16"
    raise ScenarioError(f"precision {weights!r}: not recognised")


def _kv_dtype(cell: str) -> str:
    c = cell.lower()
    if "fp8" in c or "int8" in c:
        return "fp8"  # an int8 KV cache holds and streams the same bytes
    if not c.strip() or re.search(r"bf16|fp16|float16|bfloat16|auto|half", c):
        return "auto"
    raise ScenarioError(f"KV cache dtype {cell!r}: not simulated")


def _kind(scenario: str, concurrency: str, rate: str) -> str:
    s = f"{scenario} {concurrency}".lower()
    if re.search(r"offline|max_throughput|benchmark_throughput", s):
        return "offline"
    if "burst" in s or rate.strip().lower().startswith("inf"):
        return "burst"
    if "poisson" in s:
        return "poisson"
    if _number(rate) is not None:
        return "constant" if "constant" in s else "poisson"
    if re.search(r"closed|concurren", s):
        return "closed"
    if re.search(r"static|batch_latency|benchmark_latency|batch-?1|single", s):
        return "static"
    raise ScenarioError(f"scenario {scenario!r}: not recognised")


def _lengths(cell: str, dist: str, which: str) -> tuple[Lengths, str | None]:
    """A length cell ('128', 'U[100,1024]', '204.9 mean') read with the distribution text;
    the second value notes an assumption made."""
    c, d = cell.strip().lower(), dist.lower()
    m = re.search(r"u\s*\[\s*(\d+)\s*,\s*(\d+)\s*\]", c) or re.search(
        r"uniform\D*(\d+)\s*(?:-|to|,)\s*(\d+)", c
    )
    if m:
        return Lengths("uniform", float(m.group(1)), float(m.group(2))), None
    value = _number(c)
    dataset = re.search(r"sharegpt|dataset", d) or "mean" in c
    if value is not None:
        if dataset and not re.search(r"\bfixed\b(?![\s-]*seed)", d):
            return Lengths("sharegpt", value), None
        return Lengths("fixed", round(value)), None
    if "sharegpt" in d:
        # e.g. '~mean 200-250 in / ~180-250 out': the middle of the stated range.
        word = "in" if which == "input" else "out"
        r = re.search(r"(\d+)\s*(?:-\s*(\d+))?\s*" + word + r"\b", d)
        if r:
            lo, hi = float(r.group(1)), float(r.group(2) or r.group(1))
            return Lengths("sharegpt", (lo + hi) / 2), f"{which} mean {lo:g}-{hi:g} (text)"
        default = SHAREGPT_MEAN_INPUT if which == "input" else SHAREGPT_MEAN_OUTPUT
        return Lengths("sharegpt", default), f"{which} mean not given: ShareGPT {default:g}"
    raise ScenarioError(f"{which} length {cell!r}: missing or not understood")


def _stat_for(metric: str, stat_cell: str) -> str:
    """mean|median|pNN for a latency column, from e.g. 'TTFT = mean; ITL = p50 ...'."""
    text = stat_cell.lower()
    key = {"e2e_latency_ms": "e2e", "ttft_ms": "ttft", "itl_ms": "itl", "tpot_ms": "tpot"}
    words = r"(mean|median|avg|average|p\d{2})"
    m = re.search(key[metric] + r"\w*\s*[=:]\s*" + words, text) or re.match(r"\s*" + words, text)
    if m is None:
        m = re.search(r"\b(median)\b", text) if "mean" not in text else None
    word = m.group(1) if m else "mean"
    if word in ("median", "p50"):
        return "median"
    return word if word.startswith("p") else "mean"


# Flags an engine_config cell may state, by any engine's name -> our (vLLM) name.
_FLAGS = {
    "max_num_seqs": r"max[_-](?:num[_-]seqs|running[_-]requests|batch[_-]size)",
    "max_num_batched_tokens": r"max[_-]num[_-](?:batched[_-])?tokens|chunked[_-]prefill[_-]size",
    "max_model_len": r"max[_-]model[_-]len|context[_-]length|max[_-]seq[_-]len",
    "gpu_memory_utilization": r"gpu[_-]memory[_-]utilization|mem[_-]fraction[_-]static",
    "kv_free": r"kv[_-]cache[_-]free[_-]gpu[_-]mem[_-]fraction",
    "cache_max_entry_count": r"cache[_-]max[_-]entry[_-]count",
}


def _engine_flags(cell: str) -> tuple[tuple[str, float], ...]:
    """Numeric flags stated in an engine_config cell; booleans as 1.0 / 0.0."""
    text = cell.lower()
    flags: dict[str, float] = {}
    for name, pat in _FLAGS.items():
        m = re.search(r"(?:" + pat + r")\s*[=:]?\s*(\d+(?:\.\d+)?)", text)
        if m:
            flags[name] = float(m.group(1))
    if re.search(
        r"enforce[_-]eager\s*[=:]?\s*true|--enforce-eager\b|disable[_-]cuda[_-]graph", text
    ):
        flags["enforce_eager"] = 1.0
    if re.search(r"no chunked prefill|enable[_-]chunked[_-]prefill\s*[=:]?\s*false", text):
        flags["enable_chunked_prefill"] = 0.0
    elif re.search(r"enable[_-]chunked[_-]prefill", text):
        flags["enable_chunked_prefill"] = 1.0
    return tuple(sorted(flags.items()))


def _unsupported_feature(row: dict[str, str]) -> str | None:
    text = " ".join(row.get(k, "") for k in ("scenario", "engine_config", "engine")).lower()
    spec = r"specul|eagle|medusa|\bmtp\b|draft[_ -]model|lookahead|n-?gram"
    if re.search(spec, text) and not re.search(
        r"\b(no|without|disabled?)\b[^;,.]{0,24}(" + spec + ")", text
    ):
        return "speculative decoding is not simulated"
    if re.search(r"disaggregat|pipeline[_ -]parallel|\bpp\s*=?\s*[2-9]|expert[_ -]parallel", text):
        return "disaggregated / pipeline / expert-parallel serving is not simulated"
    if re.search(r"lora|prefix[_ -]shar|shared[_ -]prefix|multi-?turn", text):
        return "LoRA / shared-prefix / multi-turn workloads are not simulated"
    return None


def parse_row(row: dict[str, str]) -> Scenario:
    """One CSV row as a Scenario; raises ``ScenarioError`` with the reason it cannot be."""
    feature = _unsupported_feature(row)
    if feature:
        raise ScenarioError(feature)
    version = _version(row.get("engine_version", ""))
    family = _family(row.get("engine", ""), version)
    model, native_max_len = _model(row.get("model", ""))
    gpu = _gpu(row.get("gpu", ""))
    quantization, precision = _precision(row.get("weight_precision", ""), row.get("model", ""))
    kv = _kv_dtype(row.get("kv_cache_dtype", ""))
    tp = int(_number(row.get("tp", "")) or 1)
    num_gpus = int(_number(row.get("num_gpus", "")) or tp)
    if num_gpus != tp:
        raise ScenarioError(f"num_gpus {num_gpus} != tp {tp}: replicas / PP not simulated")
    conc_cell, rate_cell = row.get("batch_or_concurrency", ""), row.get("request_rate_rps", "")
    kind = _kind(row.get("scenario", ""), conc_cell, rate_cell)
    dist = row.get("length_distribution", "")
    input_len, note_in = _lengths(row.get("input_len", ""), dist, "input")
    output_len, note_out = _lengths(row.get("output_len", ""), dist, "output")
    assumptions = [n for n in (note_in, note_out) if n]

    if re.match(r"\s*\d+\s*(-|to|\.\.)\s*\d+", conc_cell):
        raise ScenarioError(f"a range of concurrencies ({conc_cell!r}), not one scenario")
    concurrency = _number(conc_cell)
    if concurrency is None and "(" in conc_cell:
        concurrency = _number(conc_cell.split("(", 1)[1])  # 'all at once (320)'
    num_requests = _number(row.get("num_requests", ""))
    rate = _number(rate_cell)
    if kind in ("static", "closed") and not (concurrency and concurrency >= 1):
        raise ScenarioError(f"{kind} scenario without a batch size / concurrency")
    if kind == "static":
        num_requests = concurrency
    elif kind == "closed" and num_requests is None:
        num_requests = (concurrency or 1) * _DEFAULT_CLOSED_LOOP_ROUNDS
        assumptions.append(f"{_DEFAULT_CLOSED_LOOP_ROUNDS} requests per user")
    elif kind in ("offline", "burst"):
        num_requests, concurrency = num_requests or concurrency, None
    if kind in ("poisson", "constant") and not rate:
        raise ScenarioError(f"open-loop scenario without a rate ({rate_cell!r})")
    if not num_requests:
        raise ScenarioError("number of requests missing")

    # Sources that count requests which generated no text in their means (TTFT = E2E = 0,
    # 0 output tokens): the same share of simulated requests is counted the same way.
    empty = re.search(r"0 generated tokens.*?:\s*~?(\d+)\s*/\s*(\d+)", row.get("notes", ""))
    empty_fraction = (
        int(empty.group(1)) / int(empty.group(2)) if empty and int(empty.group(2)) else 0.0
    )
    if 0 < empty_fraction < 1:
        assumptions.append(f"{empty_fraction:.0%} of requests empty, counted as 0 like the source")
        if output_len.kind != "uniform":
            output_len = dataclasses.replace(output_len, a=output_len.a / (1 - empty_fraction))

    stat_cell = row.get("metric_stat", "")
    measurements = []
    for col in METRIC_COLUMNS:
        value = _number(row.get(col, ""))
        if value is not None and value > 0:
            stat = "aggregate" if METRIC_CLASS[col] == "throughput" else _stat_for(col, stat_cell)
            measurements.append(Measurement(col, stat, value))
    if not measurements:
        raise ScenarioError("no measured metric")
    engine_cell = row.get("engine", "")
    return Scenario(
        row_id=row.get("row_id", "?").strip(),
        family=family,
        engine_label=engine_cell.split("(")[0].strip(),
        model=model,
        gpu=gpu,
        tp=tp,
        precision=precision,
        quantization=quantization,
        kv_cache_dtype=kv,
        kind=kind,
        concurrency=int(concurrency) if concurrency is not None else None,
        rate_rps=rate if kind in ("poisson", "constant") else None,
        num_requests=int(num_requests),
        input_len=input_len,
        output_len=output_len,
        measurements=tuple(measurements),
        engine_flags=_engine_flags(row.get("engine_config", "")),
        version=version,
        native_max_len=native_max_len,
        via_server=kind in ("burst", "poisson", "constant")
        or (kind == "closed" and not re.search(r"offline|python api", engine_cell.lower())),
        empty_fraction=empty_fraction,
        assumptions=tuple(assumptions),
    )


def metric_skip_reason(row: dict[str, str], metric: str) -> str | None:
    """Why one measured metric of an expressible row is not comparable, or None."""
    notes = row.get("notes", "").lower()
    if metric == "itl_ms" and re.search(r"chunks? carry several tokens|itl \(chunk gap\)", notes):
        return "ITL is a gap between multi-token stream chunks; the simulator streams tokens"
    if metric == "itl_ms" and re.search(r"itl[^.;]*truncated", notes):
        return "ITL value truncated in the source"
    return None


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows as dicts of stripped-of-None cells."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        return [{k: v or "" for k, v in r.items() if k} for r in csv.DictReader(f)]


def parse_rows(rows: Iterable[dict[str, str]]) -> tuple[list[Scenario], list[Skipped]]:
    """Every row as a Scenario (without its incomparable metrics) or a Skipped."""
    scenarios: list[Scenario] = []
    skipped: list[Skipped] = []
    for row in rows:
        rid, eng, mdl = row.get("row_id", "?"), row.get("engine", ""), row.get("model", "")
        try:
            sc = parse_row(row)
        except ScenarioError as e:
            skipped.append(Skipped(rid, eng, mdl, str(e)))
            continue
        except (ValueError, ArithmeticError, LookupError) as e:  # a cell we misread
            skipped.append(Skipped(rid, eng, mdl, f"unparseable row: {e!r}"))
            continue
        kept = []
        for m in sc.measurements:
            reason = metric_skip_reason(row, m.metric)
            if reason:
                skipped.append(Skipped(rid, eng, mdl, f"{m.metric}: {reason}"))
            else:
                kept.append(m)
        if kept:
            scenarios.append(dataclasses.replace(sc, measurements=tuple(kept)))
    return scenarios, skipped


# --- the engine ----------------------------------------------------------------------------


def _scheduler_defaults(sc: Scenario, declared_len: int) -> dict[str, float]:
    """The engine's documented defaults (not fitted) for the scheduler sizes."""
    if sc.family == "vllm-v0":
        # V0: 256 sequences; chunked prefill only when max_model_len > 32K, at 512 tokens a
        # step; otherwise a prefill step takes up to max(max_model_len, 2048) tokens.
        chunked = declared_len > 32000
        return {
            "max_num_seqs": 256,
            "enable_chunked_prefill": float(chunked),
            "max_num_batched_tokens": 512 if chunked else max(declared_len, 2048),
        }
    if sc.family in ("vllm", "generic"):
        # V1: larger budgets on >= 70 GiB GPUs other than the A100; the LLM class
        # (offline) gets twice the server's token budget.
        gpu = resolve_gpu(sc.gpu)
        big = gpu.hbm_bytes >= 70 * 2**30 and not gpu.name.startswith("A100")
        tokens = (16384 if big else 8192) if sc.kind in ("offline", "static") else 0
        return {
            "max_num_seqs": 1024 if big else 256,
            "max_num_batched_tokens": tokens or (8192 if big else 2048),
        }
    if sc.family == "sglang":
        return dict(_SGLANG_DEFAULTS)
    if sc.family == "lmdeploy":  # benchmark scripts raise max_batch_size to the concurrency
        d = dict(_LMDEPLOY_DEFAULTS)
        d["max_num_seqs"] = max(d["max_num_seqs"], float(sc.concurrency or 0))
        return d
    return dict(_TRTLLM_DEFAULTS)


def _trtllm_bench_sizes(sc: Scenario, kv_tokens: int) -> tuple[int, int]:
    """trtllm-bench's max_batch_size / max_num_tokens heuristic for the mean ISL / OSL."""
    isl, osl = sc.input_len.mean, sc.output_len.mean
    raw_bs = min(kv_tokens / (isl + osl), 4096)
    raw_tok = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    else:
        step = 128 if raw_bs < 1024 else 256
        bs = step * math.ceil(raw_bs / step)
    if raw_tok < 4096:
        tok = max(2048, 256 * math.ceil(raw_tok / 256))
    else:
        step = 512 if raw_tok < 8192 else 1024
        tok = step * math.ceil(raw_tok / step)
    return bs, tok


def build_engine(sc: Scenario, max_total_len: int) -> Engine:
    """The simulated engine for a scenario whose longest request holds ``max_total_len``
    tokens; raises ``ValueError`` if the engine would refuse the configuration."""
    flags = dict(sc.engine_flags)
    declared_len = int(flags.get("max_model_len", sc.native_max_len))
    sched = _scheduler_defaults(sc, declared_len)
    sched.update({k: v for k, v in flags.items() if k in sched or k == "enable_chunked_prefill"})
    chunked = bool(sched.get("enable_chunked_prefill", 1.0))
    model, gpu = resolve_model(sc.model), resolve_gpu(sc.gpu)
    max_model_len = min(max_total_len, model.max_position_embeddings)
    batched = int(sched["max_num_batched_tokens"])
    eager = bool(flags.get("enforce_eager", 0.0))
    config = EngineConfig(
        model=sc.model,
        gpu=sc.gpu,
        tensor_parallel_size=sc.tp,
        max_model_len=max_model_len,
        gpu_memory_utilization=flags.get("gpu_memory_utilization", 0.9),
        max_num_batched_tokens=batched if chunked else max(batched, max_model_len),
        max_num_seqs=int(sched["max_num_seqs"]),
        enable_prefix_caching=False,  # no prompt shares a prefix: skip the hashing
        enable_chunked_prefill=chunked,
        enforce_eager=eager,
        quantization=sc.quantization,
        kv_cache_dtype=sc.kv_cache_dtype,
        api_overhead_s=EngineConfig.api_overhead_s if sc.via_server else 0.0,
    )
    if "kv_free" in sched:
        config = _size_like_trtllm(sc, config, sched, flags)
    eff = dataclasses.replace(DEFAULT_EFFICIENCIES, **FAMILY_EFFICIENCIES[sc.family])
    step = RooflineStepTime(
        model, gpu, sc.tp, "auto", sc.quantization, sc.kv_cache_dtype, eager, eff
    )
    itl = any(m.metric == "itl_ms" for m in sc.measurements)
    return Engine(config, step, record_token_times=itl)


def _size_like_trtllm(
    sc: Scenario, config: EngineConfig, sched: dict[str, float], flags: dict[str, float]
) -> EngineConfig:
    """KV cache and batch limits of TRT-LLM and LMDeploy: the cache is a fraction of the
    memory left after weights and activations (old TurboMind: a count of 128-token
    blocks); TRT-LLM admits a request only with room for its whole sequence
    (GUARANTEED_NO_EVICT), and trtllm-bench sizes the batch from the workload."""
    model, gpu = resolve_model(sc.model), resolve_gpu(sc.gpu)
    block_bytes = kv_bytes_per_token(model, sc.tp, sc.kv_cache_dtype) * config.block_size
    free = (
        gpu.hbm_bytes
        - weight_bytes_per_rank(model, sc.tp, sc.quantization)
        - activation_reserve_bytes(model, sc.tp, config.max_num_batched_tokens, config.max_num_seqs)
    )
    entries = flags.get("cache_max_entry_count", sched["kv_free"])
    if entries > 1:
        blocks = int(entries * 128 // config.block_size)
    else:
        blocks = max(0, int(entries * free // block_bytes))
    config = dataclasses.replace(config, num_gpu_blocks_override=blocks)
    if sc.family != "trtllm":
        return config
    kv_tokens = blocks * config.block_size
    seqs, tokens = config.max_num_seqs, config.max_num_batched_tokens
    if sc.kind == "offline":
        bs, tok = _trtllm_bench_sizes(sc, kv_tokens)
        seqs = seqs if "max_num_seqs" in flags else bs
        tokens = tokens if "max_num_batched_tokens" in flags else tok
    fit = max(1, int(kv_tokens // (sc.input_len.mean + sc.output_len.mean)))
    return dataclasses.replace(config, max_num_seqs=min(seqs, fit), max_num_batched_tokens=tokens)


# --- the workload ---------------------------------------------------------------------------


def _lognormal_lengths(
    mean: float, sigma: float, caps: Sequence[int], rng: random.Random
) -> list[int]:
    """Lognormal lengths clipped to [4, caps[i]] whose mean is ``mean``, at evenly spaced
    quantiles in shuffled order: a typical sample, not a random one, since the tail of a
    small sample decides how long an offline batch runs."""
    n = len(caps)
    unit = statistics.NormalDist()
    z = [unit.inv_cdf((i + 0.5) / n) for i in range(n)]
    rng.shuffle(z)

    def draw(mu: float) -> list[int]:
        return [
            max(4, min(cap, round(math.exp(mu + sigma * x))))
            for x, cap in zip(z, caps, strict=True)
        ]

    lo, hi = -5.0, 12.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.fmean(draw(mid)) < mean else (lo, mid)
    return draw((lo + hi) / 2)


def workload(sc: Scenario) -> list[tuple[int, int]]:
    """``(prompt_len, output_len)`` per request; deterministic (seed 0)."""
    n = sc.num_requests
    rng = random.Random(_SEED)
    inp, out = sc.input_len, sc.output_len
    if inp.kind == "sharegpt":
        ins = _lognormal_lengths(inp.a, SHAREGPT_SIGMA_INPUT, [_SHAREGPT_MAX_INPUT] * n, rng)
    else:
        ins = [_draw(inp, rng) for _ in range(n)]
    if out.kind == "sharegpt":
        caps = [max(4, _SHAREGPT_MAX_TOTAL - i) for i in ins]
        outs = _lognormal_lengths(out.a, SHAREGPT_SIGMA_OUTPUT, caps, rng)
    else:
        outs = [_draw(out, rng) for _ in range(n)]
    for k in _empty_indices(sc, n):
        outs[k] = 1  # prefilled, then an end-of-sequence token: no text
    return list(zip(ins, outs, strict=True))


def _draw(spec: Lengths, rng: random.Random) -> int:
    if spec.kind == "uniform":
        return rng.randint(int(spec.a), int(spec.b))
    return max(1, round(spec.a))


def _empty_indices(sc: Scenario, n: int) -> range:
    """The requests that generate no text, spread evenly over the workload."""
    count = round(sc.empty_fraction * n)
    return range(0, n, n // count) if count else range(0)


# --- running --------------------------------------------------------------------------------


@dataclass
class _Run:
    timelines: list[RequestTimeline]
    gaps_s: list[float]  # every inter-token gap of every request
    num_requests: int  # the row's count (more than len(timelines) when run on a prefix)
    empty: frozenset[int]  # requests the source counts as empty


def _serve(
    engine: Engine,
    jobs: Sequence[tuple[int, int]],
    arrivals_s: Sequence[float] | None,
    users: int,
) -> list[RequestTimeline]:
    """Serve ``jobs`` open loop at ``arrivals_s``, or closed loop with ``users`` (when
    ``arrivals_s`` is None), in virtual time; returns the timelines in job order."""
    if arrivals_s is not None:
        pending = sorted(zip(arrivals_s, range(len(jobs)), strict=True))
    else:
        pending = [(0.0, i) for i in range(min(users, len(jobs)))]
    next_job, head, now = len(pending), 0, 0.0
    while head < len(pending) or engine.has_work():
        while head < len(pending) and pending[head][0] <= now:
            arrival, i = pending[head]
            engine.add_request(str(i), range(jobs[i][0]), jobs[i][1], arrival)
            head += 1
        if not engine.has_work():
            now = pending[head][0]
            continue
        result = engine.step(now, token_events=False)
        assert result is not None  # has_work() was True
        now += result.duration_s
        if arrivals_s is None:
            for _ in result.finished:  # each user sends its next request at once
                if next_job < len(jobs):
                    pending.append((now, next_job))
                    next_job += 1
    return [engine.timeline(str(i)) for i in range(len(jobs))]


def _gaps_s(timelines: Iterable[RequestTimeline]) -> list[float]:
    """Every inter-token gap of every request (timelines with token times recorded)."""
    gaps: list[float] = []
    for t in timelines:
        times = t.token_times_s
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    return gaps


def _run(sc: Scenario) -> _Run:
    jobs = workload(sc)
    engine = build_engine(sc, max(i + o for i, o in jobs))
    n = len(jobs)
    if sc.kind in ("offline", "closed"):
        mean_out = statistics.fmean(o for _, o in jobs)
        mean_len = statistics.fmean(i + o for i, o in jobs)
        batch = min(engine.config.max_num_seqs, engine.kv_capacity_tokens / mean_len)
        keep = max(int(_OUTPUT_TOKEN_BUDGET / mean_out), int(_MIN_BATCHES * batch) + 1)
        if sc.kind == "closed":
            keep = max(keep, _MIN_BATCHES * (sc.concurrency or 1))
        jobs = jobs[:keep]
    arrivals: list[float] | None
    if sc.kind == "closed":
        arrivals = None
    elif sc.kind in ("poisson", "constant"):
        rate = sc.rate_rps or 1.0
        rng = random.Random(_SEED)
        gaps = [rng.expovariate(rate) if sc.kind == "poisson" else 1 / rate for _ in jobs]
        arrivals = [0.0, *_cumsum(gaps[:-1])]
    else:
        arrivals = [0.0] * len(jobs)
    timelines = _serve(engine, jobs, arrivals, sc.concurrency or 1)
    empty = frozenset(k for k in _empty_indices(sc, n) if k < len(jobs))
    return _Run(timelines, _gaps_s(timelines), n, empty)


def _cumsum(xs: Iterable[float]) -> list[float]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return out


def _finished(t: RequestTimeline) -> float:
    assert t.finished_s is not None  # every request runs to completion
    return t.finished_s


def _duration_s(run: _Run) -> float:
    """First arrival to last completion, extrapolated at the steady completion rate (between
    the first tenth of completions and the last admission) for a run on a prefix."""
    tls = run.timelines
    start = min(t.arrival_s for t in tls)
    finishes = sorted(_finished(t) for t in tls)
    elapsed = finishes[-1] - start
    n = len(tls)
    if run.num_requests <= n:
        return elapsed
    t_a = finishes[max(0, n // 10 - 1)]
    t_b = max(t.scheduled_s or 0.0 for t in tls)
    inside = sum(1 for f in finishes if t_a < f <= t_b)
    rate = inside / (t_b - t_a) if t_b > t_a and inside >= 2 else n / elapsed
    return elapsed + (run.num_requests - n) / rate


def _stat(values: Sequence[float], stat: str) -> float:
    if not values:
        raise ValueError("no simulated values for this statistic")
    if stat == "mean":
        return statistics.fmean(values)
    q = 50 if stat == "median" else int(stat[1:])
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def predict(sc: Scenario, run: _Run, m: Measurement) -> float:
    """The simulated value of ``m``: same unit, same statistic. Static batches report the
    whole batch (its prefill for TTFT, its latency for E2E), like benchmark_latency."""
    tls, empty = run.timelines, run.empty
    first = [t.first_token_s or 0.0 for t in tls]
    if METRIC_CLASS[m.metric] == "throughput":
        mean_in = statistics.fmean(t.prompt_tokens for t in tls)
        mean_out = statistics.fmean(0 if k in empty else t.output_tokens for k, t in enumerate(tls))
        per_request = {"output_tok_per_s": mean_out, "total_tok_per_s": mean_in + mean_out}
        return run.num_requests * per_request.get(m.metric, 1.0) / _duration_s(run)
    if m.metric == "ttft_ms":
        if sc.kind == "static":
            return 1000 * max(first)
        ttfts = [
            0.0 if k in empty else f - t.arrival_s
            for k, (f, t) in enumerate(zip(first, tls, strict=True))
        ]
        return 1000 * _stat(ttfts, m.stat)
    if m.metric == "e2e_latency_ms":
        if sc.kind == "static":
            return 1000 * max(_finished(t) for t in tls)
        e2es = [0.0 if k in empty else _finished(t) - t.arrival_s for k, t in enumerate(tls)]
        return 1000 * _stat(e2es, m.stat)
    if m.metric == "tpot_ms":
        tpots = [
            (_finished(t) - f) / (t.output_tokens - 1)
            for f, t in zip(first, tls, strict=True)
            if t.output_tokens > 1
        ]
        return 1000 * _stat(tpots, m.stat)
    return 1000 * _stat(run.gaps_s, m.stat)  # itl_ms: every gap, pooled over requests


def simulate(sc: Scenario) -> tuple[dict[str, float], int]:
    """Predicted value per measured metric, and how many of the row's requests were
    simulated (fewer when the duration was extrapolated); ``ValueError`` if the engine
    cannot run the scenario."""
    run = _run(sc)
    return {m.metric: predict(sc, run, m) for m in sc.measurements}, len(run.timelines)


def validate(path: str | Path, row_ids: Iterable[str] | None = None) -> Report:
    """Parse and simulate every row of a calibration file (or only ``row_ids``)."""
    rows = load_rows(path)
    if row_ids is not None:
        wanted = {r.strip() for r in row_ids}
        rows = [r for r in rows if r.get("row_id", "").strip() in wanted]
    scenarios, skipped = parse_rows(rows)
    report = Report(skipped=skipped)
    for sc in scenarios:
        try:
            predicted, simulated = simulate(sc)
        except (ValueError, ArithmeticError, LookupError, InferlabError) as e:
            reason = f"the simulated engine cannot run it: {e}"
            report.skipped.append(Skipped(sc.row_id, sc.engine_label, sc.model, reason))
            continue
        if simulated < sc.num_requests:
            note = f"ran {simulated:,} of {sc.num_requests:,} requests, duration extrapolated"
            sc = dataclasses.replace(sc, assumptions=(*sc.assumptions, note))
        for m in sc.measurements:
            report.comparisons.append(
                Comparison(sc, m.metric, m.stat, m.value, predicted[m.metric])
            )
    return report


def summarize(comparisons: Sequence[Comparison]) -> dict[str, tuple[float, int, int]]:
    """Per metric class present: (median over rows of the row's mean |error| %, rows,
    values). A row that reports three throughputs of one run counts once, not three times."""
    out: dict[str, tuple[float, int, int]] = {}
    for cls in METRIC_CLASSES:
        by_row: dict[str, list[float]] = {}
        for c in comparisons:
            if c.metric_class == cls:
                by_row.setdefault(c.scenario.row_id, []).append(abs(c.error_pct))
        if by_row:
            median = statistics.median(statistics.fmean(v) for v in by_row.values())
            out[cls] = (median, len(by_row), sum(len(v) for v in by_row.values()))
    return out
