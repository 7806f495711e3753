"""Reading a calibration CSV (``calibration.csv`` format) into scenarios.

Each CSV row is one published benchmark: engine, model, precision, GPU, TP, a load
scenario, and measured TTFT / ITL / TPOT / E2E / throughput with the statistic the
source reports. ``parse_rows`` turns each row into a ``Scenario`` or a ``Skipped`` with
the reason; nothing is tuned per row. Engine, model and GPU cells map onto our presets;
length cells read as fixed, ``U[a,b]`` uniform, or ShareGPT-like with a mean.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

from inferlab._errors import UsageError
from inferlab.sim.engine.dtypes import KVCacheDType, Quantization
from inferlab.sim.engine.families import EngineFamily, family_for_engine
from inferlab.sim.engine.hardware import gpu_from_text, resolve_model
from inferlab.sim.validation.scenario import (
    FIT,
    LATENCY_COLUMNS,
    METRIC_CLASS,
    METRIC_COLUMNS,
    SPLITS,
    Lengths,
    Measurement,
    PromptSharing,
    Scenario,
    ScenarioError,
    Skipped,
)

# Mean lengths of ShareGPT V3 through vLLM's sampler, for ShareGPT-like rows that state
# none (the shapes of the distributions are in ``validate``).
SHAREGPT_MEAN_INPUT = 220.0
SHAREGPT_MEAN_OUTPUT = 200.0
# Requests per user when a closed-loop row gives no count: a long run (vllm bench serve
# sends 1,000 prompts, AIPerf/genai-perf measure stable windows after the ramp-up), so
# the cold start (every user's first request at t = 0) weighs as little as in the source.
_DEFAULT_CLOSED_LOOP_ROUNDS = 100


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


def _family(engine: str, version: tuple[int, int] | None) -> EngineFamily:
    """The engine family whose rules a row runs with (``families.family_for_engine``); a
    row whose engine is not modelled, or not named, is not run."""
    try:
        return family_for_engine(engine, version)
    except UsageError as e:
        raise ScenarioError(str(e)) from e


# mixture-of-experts models the step-time model does not cover: latent attention
# (DeepSeek V2/V3/R1, Kimi), MXFP4 experts with attention sinks (gpt-oss), Llama 4's
# chunked attention, hybrids; the other MoE models run when they resolve to a preset
_MOE = re.compile(
    r"deepseek-?(v2|v3|r1)(?!-distill)|dbrx|gpt-oss|llama-?4|scout|maverick|jamba|arctic|grok|kimi"
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
        raise ScenarioError(f"model {cell!r}: this mixture-of-experts architecture is not simulated")
    name = text.split("(")[0].split("/")[-1].replace("meta-", "")
    for candidate in (name, text):
        m = re.search(r"(llama-?\d(?:\.\d)?|qwen\d(?:\.\d)?)-(\d+(?:\.\d+)?)b", candidate)
        if m is None:
            continue
        fam = re.sub(r"llama-?(\d)", r"llama-\1", m.group(1))
        if (fam, m.group(2)) in _MODELS:
            return _MODELS[fam, m.group(2)]
    plain = cell.split("(")[0].strip()
    # a quantized checkpoint has its base model's shapes: Qwen/Qwen3-14B-FP8, ...-AWQ
    base = re.sub(r"-(fp8(-dynamic|-static)?|awq|gptq(-int[48])?|int[48]|w4a16|w8a8)$", "", plain, flags=re.I)
    for candidate in (plain, base):
        try:  # any other preset, by HF id or name
            spec = resolve_model(candidate)
        except UsageError:
            continue
        return spec.name, spec.max_position_embeddings
    raise ScenarioError(f"model {cell!r}: no preset with its shapes")


def _gpu(cell: str) -> str:
    if re.search(r"g[hb]200", cell.lower()):
        raise ScenarioError(f"GPU {cell!r}: no preset (Grace Hopper / Grace Blackwell)")
    preset = gpu_from_text(cell)
    if preset is None:
        raise ScenarioError(f"GPU {cell!r}: no preset")
    return preset


def _precision(weights: str, model_cell: str) -> tuple[Quantization | None, str]:
    """(quantization, label) from the weight-precision cell and the model name."""
    w = f"{weights} {model_cell}".lower()
    if re.search(r"fp4|mxfp|nvfp|w4a8|int3|int2|gguf|q4_|bitsandbytes|nf4", w):
        raise ScenarioError(f"precision {weights!r}: not simulated")
    if "awq" in w:
        return Quantization.AWQ, "awq-int4"
    if "int4" in w or "w4a16" in w or ("gptq" in w and "int8" not in w):
        return Quantization.GPTQ, "int4"
    if "fp8" in w:
        return Quantization.FP8, "fp8"
    if "gptq" in w or "w8a16" in w:
        return Quantization.W8A16, "int8"  # GPTQ-Int8: 8-bit weights into bf16 GEMMs
    if "int8" in w or "w8a8" in w:
        return Quantization.INT8, "int8"
    if not weights.strip() or re.search(r"bf16|fp16|float16|bfloat16|half|auto", w):
        return None, "bf16"
    raise ScenarioError(f"precision {weights!r}: not recognised")


def _kv_dtype(cell: str) -> KVCacheDType:
    c = cell.lower()
    if "fp8" in c or "int8" in c:
        return KVCacheDType.FP8  # an int8 KV cache holds and streams the same bytes
    if not c.strip() or re.search(r"bf16|fp16|float16|bfloat16|auto|half", c):
        return KVCacheDType.AUTO
    raise ScenarioError(f"KV cache dtype {cell!r}: not simulated")


def _kind(scenario: str, concurrency: str, rate: str) -> str:
    # ('500 (no max-concurrency)' names no concurrency limit)
    s = re.sub(r"\b(?:no|without)\s+max-concurrency", "", f"{scenario} {concurrency}".lower())
    if re.search(r"offline|max_throughput|benchmark_throughput", s):
        return "offline"
    if re.search(r"closed|max-concurrency", s) and _number(concurrency) is not None:
        return "closed"  # vllm bench serve --max-concurrency N at rate inf: N users
    if re.search(r"burst(?!iness)", s) or rate.strip().lower().startswith("inf"):  # ("burstiness 1.0" is Poisson's)
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
    if re.match(r"(unknown|not stated|unspecified)\b", c):  # numbers after it are no length
        raise ScenarioError(f"{which} length {cell!r}: not known")
    m = re.search(r"u\s*\[\s*(\d+)\s*,\s*(\d+)\s*\]", c) or re.search(
        r"uniform\D*(\d+)\s*(?:-|to|,)\s*(\d+)", c
    )
    if m:
        return Lengths("uniform", float(m.group(1)), float(m.group(2))), None
    value = _number(c)
    # answers that stop at end of sequence below the limit the client set ('100.5 mean
    # (EOS; max_tokens 128)'): lengths that differ, at most that limit (``workload``).
    # One form only: a cell that names the limit or EOS otherwise is refused, not guessed
    if which == "output" and re.search(r"max[_ -]?tokens|(?<![_-])\beos\b", c):
        eos = re.fullmatch(r"(\d+(?:\.\d+)?) mean \(eos; max_tokens (\d+)\)", c)
        if eos is None:
            raise ScenarioError(
                f"{which} length {cell!r}: answers that stop at EOS are written 'MEAN mean (EOS; max_tokens N)'"
            )
        mean, limit = float(eos.group(1)), float(eos.group(2))
        if not 1 <= mean < limit:
            raise ScenarioError(f"{which} length {cell!r}: the mean of answers stopped at EOS must be below max_tokens")
        return Lengths("eos", mean, limit), (
            f"outputs stop at EOS: ShareGPT's answer lengths scaled to mean {mean:g}, at most {limit:g}"
        )
    # a measured mean of lengths drawn from a range the row states ('lengths uniform in
    # [1,1024]'; sglang.bench_serving's random_range_ratio 0): that range, keeping the
    # mean measured, when it is near the range's middle (within 10 %)
    u = re.search(r"uniform\s+in\s*\[\s*(\d+)\s*,\s*(\d+)\s*\]", d)
    if u and value is not None and "mean" in c:
        lo, hi = float(u.group(1)), float(u.group(2))
        if lo < hi and abs(value / ((lo + hi) / 2) - 1) <= 0.1:
            return Lengths("uniform", lo, hi, measured=value), None
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
    "num_scheduler_steps": r"num[_-]scheduler[_-]steps",
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
    if re.search(r"disable[_-]radix[_-]cache|no[_-]enable[_-]prefix[_-]caching|enable[_-]prefix[_-]caching\s*[=:]?\s*(false|0)\b", text):
        flags["enable_prefix_caching"] = 0.0
    elif re.search(r"enable[_-]prefix[_-]caching", text):
        flags["enable_prefix_caching"] = 1.0
    for m in re.finditer(r"(no|disable|enable)?[_-]?(overlap|async)[_-]schedul\w*", text):
        prefix, kind = m.group(1), m.group(2)
        if prefix is None and kind == "overlap":
            continue  # a mention, not a flag
        negated = prefix in ("no", "disable")
        set_false = re.match(r"\s*[=:]\s*(false|0)\b", text[m.end() :]) is not None
        flags["overlap_schedule"] = 0.0 if negated != set_false else 1.0
    return tuple(sorted(flags.items()))


# --- rows ----------------------------------------------------------------------------------


def _unsupported_feature(row: dict[str, str]) -> str | None:
    text = " ".join(row.get(k, "") for k in ("scenario", "engine_config", "engine")).lower()
    spec = r"specul|eagle|medusa|\bmtp\b|draft[_ -]model|lookahead|n-?gram"
    if re.search(spec, text) and not re.search(
        r"\b(no|without|disabled?)\b[^;,.]{0,24}(" + spec + ")", text
    ):
        return "speculative decoding is not simulated"
    if re.search(
        # (a pipeline of one stage is no pipeline: `--pipeline-parallel-size 1`, `PP=1`)
        r"disaggregat|pipeline[_ -]parallel(?![_ -]size\s*[=:]?\s*1\b)|\bpp\s*=?\s*[2-9]|expert[_ -]parallel"
        r"|\bep(?:[_-]size)?\b\s*[=:]?\s*(?:[2-9]|\d{2,}|\$)|\bep\d|attention[_ -]?dp(?![\"']?\s*[=:]\s*(?:false|0)\b)|dp[_ -]attention",
        text,
    ):
        return "disaggregated / pipeline / expert-parallel / attention-data-parallel serving is not simulated"
    if re.search(r"lora", text):
        return "LoRA workloads are not simulated"
    if re.search(r"prefix[_ -]shar|shared[_ -]prefix|multi-?turn", text) and not row.get("prefix_sharing", "").strip():
        return "shared-prefix / multi-turn workload whose sharing the prefix_sharing column does not state"
    return None


def prompt_sharing(cell: str) -> PromptSharing | None:
    """The ``prefix_sharing`` cell: ``prefix=P groups=G``, ``turns=T`` and/or ``rerun=R``
    (separated by spaces, commas or semicolons); empty: None. ``ScenarioError`` for
    anything else."""
    cell = cell.strip()
    if not cell:
        return None
    values: dict[str, int] = {}
    for part in re.split(r"[\s,;]+", cell):
        m = re.fullmatch(r"(prefix|groups|turns|rerun)=(\d+)", part)
        if m is None or m.group(1) in values:
            raise ScenarioError(
                f"prefix_sharing {cell!r}: expected prefix=TOKENS groups=N, turns=N and/or rerun=N, each once"
            )
        values[m.group(1)] = int(m.group(2))
    sharing = PromptSharing(
        values.get("prefix", 0), values.get("groups", 1), values.get("turns", 1), values.get("rerun", 0)
    )
    if sharing.groups < 1 or sharing.turns < 1 or (
        not sharing.prefix_tokens and sharing.turns == 1 and not sharing.reruns
    ):
        raise ScenarioError(
            f"prefix_sharing {cell!r}: shares nothing (prefix=0, turns=1 and rerun=0) or counts below 1"
        )
    return sharing


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
        # the stated mean counts the empty ones as 0: the others' mean is higher
        if output_len.measured is not None:
            output_len = dataclasses.replace(output_len, measured=output_len.measured / (1 - empty_fraction))
        elif output_len.kind != "uniform":
            output_len = dataclasses.replace(output_len, a=output_len.a / (1 - empty_fraction))

    split = row.get("split", "").strip() or FIT
    if split not in SPLITS:
        raise ScenarioError(f"split {split!r}: not one of {', '.join(SPLITS)}")

    sharing = prompt_sharing(row.get("prefix_sharing", ""))
    if sharing is not None:
        if sharing.prefix_tokens and sharing.prefix_tokens >= _min_len(input_len):
            raise ScenarioError(f"shared prefix of {sharing.prefix_tokens} tokens: not shorter than every prompt")
        if sharing.reruns and kind in ("offline", "static"):
            raise ScenarioError("prefix_sharing rerun=N: only for rows served through the API (not offline or static)")
        assumptions.append(sharing.describe())

    stat_cell = row.get("metric_stat", "")
    measurements = []
    for col in METRIC_COLUMNS:
        value = _number(row.get(col, ""))
        if value is not None and value > 0:
            stat = "aggregate" if METRIC_CLASS[col] == "throughput" else _stat_for(col, stat_cell)
            measurements.append(Measurement(col, stat, value))
    if not measurements:
        raise ScenarioError("no measured metric")
    distribution = distribution_cell(row.get("distribution", ""), kind, measurements)
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
        source_id=row.get("source_id", "").strip(),
        split=split,
        sharing=sharing,
        distribution=distribution,
    )


def distribution_cell(cell: str, kind: str, headline: Iterable[Measurement] = ()) -> tuple[Measurement, ...]:
    """The ``distribution`` cell: more statistics of the run's latencies, as
    ``METRIC STAT=VALUE ...`` groups separated by semicolons (``ttft_ms median=107.96
    p99=269.46; tpot_ms median=17.44``), STAT one of mean, median, p50 (read as median)
    or pNN, in the latency columns' unit (ms). ``ScenarioError`` for anything else, for a
    statistic the row's own column already holds (``headline``) and for a batch or an
    offline run (one latency per batch, or none per request)."""
    cell = cell.strip()
    if not cell:
        return ()
    if kind in ("static", "offline"):
        raise ScenarioError(f"distribution {cell!r}: a {kind} row has no per-request latencies")
    taken = {(m.metric, m.stat) for m in headline}
    out: list[Measurement] = []
    for group in filter(None, (g.strip() for g in cell.split(";"))):
        metric, *pairs = group.split()
        if metric not in LATENCY_COLUMNS or not pairs:
            raise ScenarioError(
                f"distribution {group!r}: expected one of {', '.join(LATENCY_COLUMNS)} and STAT=VALUE pairs"
            )
        for pair in pairs:
            m = re.fullmatch(r"(mean|median|p\d{2})=(\d+(?:\.\d+)?)", pair)
            if m is None or float(m.group(2)) <= 0:
                raise ScenarioError(f"distribution {group!r}: {pair!r} is not STAT=VALUE (mean, median, pNN; ms > 0)")
            stat = "median" if m.group(1) in ("median", "p50") else m.group(1)
            if (metric, stat) in taken:
                raise ScenarioError(f"distribution {group!r}: {metric} {stat} is given twice (or is the row's own column)")
            taken.add((metric, stat))
            out.append(Measurement(metric, stat, float(m.group(2))))
    return tuple(out)


def _min_len(lengths: Lengths) -> float:
    """The shortest prompt a length spec allows (ShareGPT: a handful of tokens)."""
    if lengths.kind == "uniform":
        return lengths.a
    return 4.0 if lengths.kind == "sharegpt" else lengths.a


def metric_skip_reason(row: dict[str, str], metric: str) -> str | None:
    """Why one measured metric of an expressible row is not comparable, or None."""
    notes = row.get("notes", "").lower()
    if metric == "itl_ms" and re.search(r"chunks? carry several tokens|itl \(chunk gap\)|\(multi-token chunks\)", notes):
        return "ITL is a gap between multi-token stream chunks; the simulator streams tokens"
    if metric == "itl_ms" and dict(_engine_flags(row.get("engine_config", ""))).get("num_scheduler_steps", 1) > 1:
        return "ITL is a gap between multi-step output chunks; the simulator streams tokens"
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
            # the distribution apart: a cell it cannot read leaves the row's headline in
            sc = parse_row({**row, "distribution": ""})
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
        try:
            cell = distribution_cell(row.get("distribution", ""), sc.kind, sc.measurements)
        except ScenarioError as e:
            skipped.append(Skipped(rid, eng, mdl, f"distribution: {e}"))
            cell = ()
        # a column left out is left out of the distribution too (said once, above, when
        # the row's own column has it)
        said = {m.metric for m in sc.measurements}
        spread = []
        for m in cell:
            reason = metric_skip_reason(row, m.metric)
            if not reason:
                spread.append(m)
            elif m.metric not in said:
                said.add(m.metric)
                skipped.append(Skipped(rid, eng, mdl, f"{m.metric} (distribution): {reason}"))
        if kept:
            scenarios.append(dataclasses.replace(sc, measurements=tuple(kept), distribution=tuple(spread)))
    return scenarios, skipped
