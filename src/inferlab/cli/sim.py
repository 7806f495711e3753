"""``inferlab sim``: the simulated engine over HTTP (``serve``) and in virtual time (``run``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from inferlab._clock import LONGEST_S
from inferlab._errors import InferlabError, RunFailedError, UsageError
from inferlab.cli.common import (
    FLOAT,
    FloatRange,
    OneNamePerSetting,
    console,
    finish_run,
    given,
    install_stop_signals,
    load_config,
    load_options,
    refused_option,
    run_guarded,
    serve_until_stopped,
    slo_config,
    table_percentiles,
    workload_config,
)
from inferlab.gateway.config import ADMISSION_KEYS, AdmissionConfig
from inferlab.gateway.routing import ROUTERS, SPLIT, replicas_words
from inferlab.load.run import RunResult
from inferlab.report.console import render_summary
from inferlab.results.provenance import GATEWAY, PREDICTION, server_info, simulated_engine
from inferlab.results.runfiles import dumps
from inferlab.results.summary import Summary
from inferlab.sim.engine.bands import (
    CALIBRATED_WITH,
    RELEASE_SWITCHES,
    SIZED_WITH,
    CalibratedAs,
    calibrated_as,
    calibration_mismatch,
    served_by,
    unvalidated_why,
)
from inferlab.sim.engine.config import BLOCK_SIZES, memory_share_refused, resolve
from inferlab.sim.engine.dtypes import CapacityPolicy, DType, KVCacheDType, Quantization
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.sim.engine.families import EngineFamily
from inferlab.sim.engine.sizing import size_engine


@click.group()
def sim() -> None:
    """The simulated inference engine (vLLM-like scheduler on a roofline cost model)."""


# `sim serve` (the embedded default behind `bench`) starts as the common vLLM example;
# `sim run` answers what-ifs with vLLM's own defaults unless a flag says otherwise.
SERVE_DEFAULTS: dict[str, Any] = {"max_model_len": 4096, "max_num_batched_tokens": 8192, "enforce_eager": True}
RUN_DEFAULTS: dict[str, Any] = {"max_model_len": None, "max_num_batched_tokens": None, "enforce_eager": False}


def _ms_to_s(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback: a value given in ms, kept in seconds (None stays None)."""
    return None if value is None else value / 1e3


def _budget(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A click callback for the token budget: below 1 refused, with SGLang's -1 (its
    --chunked-prefill-size's "no chunking") pointed at the flag that says it here."""
    if value is not None and value < 1:
        raise click.BadParameter(
            f"{value}: the token budget per step must be at least 1 (SGLang's --chunked-prefill-size -1, "
            "no chunking, is --no-enable-chunked-prefill here)"
        )
    return value


def _block_size(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """A click callback: a block size the engines take (a sweep's list checked item by item)."""
    if value is not None and value not in BLOCK_SIZES:
        raise click.BadParameter(f"{value}: a KV block holds {', '.join(map(str, BLOCK_SIZES))} tokens")
    return value


def _parsed(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback reading a flag value with ``parse`` (an enum's, over its alias
    table); exit 2 with the accepted names for any other."""

    def read(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except UsageError as e:
            raise click.BadParameter(str(e)) from None

    return read


def _named(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """As ``_parsed``, but the name given comes through (stripped), checked: the engine
    reads it (``EngineConfig.quantization_name``: vLLM runs a checkpoint or not by it)."""
    check = _parsed(parse)

    def read(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        check(ctx, param, value)
        return None if value is None else value.strip()

    return read


_ADMISSION = AdmissionConfig()


def admission_config(kw: dict[str, Any]) -> AdmissionConfig | None:
    """The gateway's admission ``sim run`` puts in front of its engines (None: none).
    ``UsageError`` for an admission flag that has no effect in the mode given."""
    mode = kw["admission"]
    for name in ADMISSION_KEYS["tokens"] + ADMISSION_KEYS["requests"]:
        if given(name) and (mode is None or name not in ADMISSION_KEYS[mode]):
            modes = " or ".join(m for m, keys in ADMISSION_KEYS.items() if name in keys)
            raise UsageError(f"--{name.replace('_', '-')} acts with --admission {modes} (given: {mode or 'none'})")
    if mode is None:
        return None
    return AdmissionConfig(mode=mode, **{name: kw[name] for name in {*ADMISSION_KEYS["tokens"], *ADMISSION_KEYS["requests"]}})


def engine_options(defaults: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """vLLM's engine flags; ``defaults`` sets the context length, token budget and eager mode."""
    d = EngineConfig()
    auto_len = "the model's context length, capped to what the KV cache holds"
    auto_budget = "the family's; vLLM's for the GPU: 8192 on H100/H200 (16384 with --rate inf), 2048 elsewhere (8192)"
    opts = [
        click.option("--model", default=d.model, show_default=True, help="Preset name, HF id, or a config.json path."),
        click.option("--gpu", default=d.gpu, show_default=True, help="H100, H200, A100, L40S, RTX4090 (also H100-PCIe, H100-NVL, H800, H20, A100-40G, A100-PCIe, A800, L4, A10, B200), or a JSON file."),
        click.option("--tensor-parallel-size", "-tp", "--tp-size", "--tp", "--tp_size", "tensor_parallel_size", type=click.IntRange(min=1), default=d.tensor_parallel_size, show_default=True, help="GPUs the model is split over; adds two all-reduces per layer. (--tp-size: SGLang's name; --tp: SGLang's and LMDeploy's; --tp_size: TensorRT-LLM's.)"),
        click.option("--max-model-len", "--context-length", "--max_seq_len", "--session-len", "max_model_len", type=click.IntRange(min=1), default=defaults["max_model_len"], show_default=defaults["max_model_len"] or auto_len, help="Longest prompt + output accepted; longer requests get HTTP 400. (--context-length: SGLang's name; --max_seq_len: TensorRT-LLM's; --session-len: LMDeploy's.)"),
        click.option("--gpu-memory-utilization", "--mem-fraction-static", "gpu_memory_utilization", type=FloatRange(min=0, max=1, min_open=True), default=d.gpu_memory_utilization, show_default=True, help="Share of GPU memory for weights, activations and the KV cache (vLLM's and SGLang's way; --mem-fraction-static: SGLang's name, read the same way, activations inside the share; trtllm and lmdeploy refuse it: --kv-cache-free-gpu-mem-fraction)."),
        click.option("--kv-cache-free-gpu-mem-fraction", "--cache-max-entry-count", "--kv_cache_free_gpu_memory_fraction", "--kv_cache_free_gpu_mem_fraction", "kv_cache_free_fraction", type=FLOAT, default=None, show_default="the family's: 0.9 trtllm, 0.8 lmdeploy", help="trtllm and lmdeploy only: the KV cache's share of the GPU memory left after weights and activations (TensorRT-LLM's kv_cache_free_gpu_mem_fraction: --kv_cache_free_gpu_memory_fraction for trtllm-serve, --kv_cache_free_gpu_mem_fraction for trtllm-bench; LMDeploy's --cache-max-entry-count); those families take it where vLLM and SGLang take --gpu-memory-utilization, which they refuse."),
        click.option("--max-num-batched-tokens", "--chunked-prefill-size", "--max_num_tokens", "max_num_batched_tokens", type=int, default=defaults["max_num_batched_tokens"], callback=_budget, show_default=defaults["max_num_batched_tokens"] or auto_budget, help="Token budget per step, shared by decodes and prefill chunks (sglang: prefill chunks only, every running request decodes). (--chunked-prefill-size: SGLang's name, its -1 refused: --no-enable-chunked-prefill says it; --max_num_tokens: TensorRT-LLM's.)"),
        click.option("--max-num-seqs", "--max-running-requests", "--max_batch_size", "--max-batch-size", "max_num_seqs", type=click.IntRange(min=1), default=None, show_default="the family's; vLLM's for the GPU: 1024 on H100/H200, 256 elsewhere", help="Most sequences running at once. (--max-running-requests: SGLang's name; --max_batch_size: TensorRT-LLM's; --max-batch-size: LMDeploy's.)"),
        click.option("--block-size", "--page-size", "--cache-block-seq-len", "block_size", type=int, callback=_block_size, default=d.block_size, show_default=True, help="Tokens per KV-cache block (1, 8, 16, 32, 64 or 128). (--page-size: SGLang's name; --cache-block-seq-len: LMDeploy's.)"),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", " /--disable-radix-cache", "enable_prefix_caching", default=None, show_default="the family's: on, except vllm-v0/v0.5 and lmdeploy", help="Reuse KV blocks of shared prompt prefixes. (--disable-radix-cache: SGLang's name for off.)"),
        click.option("--enable-chunked-prefill/--no-enable-chunked-prefill", default=None, show_default="the family's: on, except vllm-v0/v0.5 (only above 32,768 tokens of context) and lmdeploy", help="Split long prompts over steps."),
        click.option("--mixed-batches/--no-mixed-batches", "--enable-mixed-chunk/--no-enable-mixed-chunk", "mixed_batches", default=None, show_default="the family's: mixed for vllm, trtllm, lmdeploy and vllm-v0 with chunked prefill; apart for sglang", help="A step mixes decodes with a prefill chunk (vLLM V1; SGLang's --enable-mixed-chunk, its name here too), or runs prefill steps and decode steps apart (SGLang's default; vLLM V0 without chunked prefill)."),
        click.option("--num-scheduler-steps", type=click.IntRange(min=1), default=1, show_default=True, help="vLLM 0.6 multi-step scheduling (--engine-family vllm-v0 or vllm-v0.5; refused for the others): a decode batch runs this many steps before the scheduler runs again; new requests wait for the group to end."),
        click.option("--overlap-schedule/--no-overlap-schedule", "--async-scheduling/--no-async-scheduling", " /--disable-overlap-schedule", "overlap_schedule", default=None, show_default="the family's: on for sglang and vllm (as vLLM 0.14 on)", help="The host schedules the next step while the GPU runs this one (SGLang's overlap scheduler, off with its --disable-overlap-schedule; --async-scheduling: vLLM's name): a request arriving mid-step waits one step more; the host's cost per step is still counted in the step."),
        click.option("--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl", default=None, show_default="the family's: on for vllm (as vLLM 0.19 on)", help="Admit a waiting or preempted request only when free KV blocks hold its whole current sequence, not just its first chunk (vLLM's flag)."),
        click.option("--reserve-outputs/--no-reserve-outputs", default=None, show_default="the family's: on for sglang", help="SGLang's admission: a waiting request is admitted only while free KV blocks hold its prompt and its whole output (up to 4,096 tokens) beyond what the running requests are estimated to generate (SGLang's new_token_ratio, which falls with each decode step and rises after a preemption); off: when its first chunk fits, as vLLM before 0.19."),
        click.option("--capacity-scheduler-policy", metavar="[GUARANTEED_NO_EVICT|MAX_UTILIZATION]", default=None, callback=_parsed(CapacityPolicy.parse), show_default="the family's: GUARANTEED_NO_EVICT for trtllm, MAX_UTILIZATION for the others", help="TensorRT-LLM's capacity scheduler (its scheduler_config): GUARANTEED_NO_EVICT admits a waiting request only while free KV blocks hold what it and every running request need to reach their output limits, so nothing is preempted; MAX_UTILIZATION admits on the first chunk and preempts when the cache fills, as vLLM does. STATIC_BATCH is refused (run a static batch as --rate inf -n B --max-num-seqs B)."),
        click.option("--evict-unhashed-first/--no-evict-unhashed-first", default=None, show_default="the family's: on for vllm (as vLLM 0.24 on)", help="A freed KV block without a prefix hash (a partly filled tail) goes to the front of the free queue, reused before cached blocks; off: every freed block goes to the back."),
        click.option("--num-gpu-blocks-override", type=click.IntRange(min=1), default=None, help="KV cache of exactly N blocks instead of what memory holds, as vLLM's flag: the vllm family keeps one as its null block (N - 1 hold tokens)."),
        click.option("--enforce-eager/--no-enforce-eager", "--disable-cuda-graph", "enforce_eager", default=defaults["enforce_eager"], show_default=True, help="Eager mode (no CUDA graphs): more CPU time per step. (--disable-cuda-graph: SGLang's name.)"),
        click.option("--dtype", default=d.dtype.value, show_default=True, callback=_parsed(DType.parse), help="Activation and unquantized weight type: auto, bfloat16 (bf16), float16 (fp16, half)."),
        click.option("--quantization", "-q", default=None, callback=_named(Quantization.parse), help="Weight quantization: fp8 or int8 (W8A8; w8a8 means int8), w8a16 (GPTQ-Int8), awq or gptq (int4 W4A16; gptq/gptq_marlin/marlin with an 8-bit checkpoint: w8a16), none (bf16 weights); vLLM's names (awq_marlin, gptq_marlin, modelopt, ...) are read as these. Default: the checkpoint's (its config's quantization_config, or a name ending -AWQ, -FP8, -GPTQ-Int4); with a quantized checkpoint, a name vLLM refuses is refused: vLLM runs one with its config's own method or that method's kernels (an AWQ one: awq, awq_marlin, marlin; a GPTQ one: gptq, gptq_marlin, marlin; a compressed-tensors one: no other name, fp8 included), and this tool's own names (int4, w8a16, none, ...) must name its scheme."),
        click.option("--kv-cache-dtype", default=d.kv_cache_dtype.value, show_default=True, callback=_parsed(KVCacheDType.parse), help="auto or fp8 (fp8_e4m3, fp8_e5m2): fp8 halves KV-cache bytes (more room, less to read)."),
        click.option("--engine-family", type=click.Choice([f.value for f in EngineFamily]), default=d.engine_family.value, show_default=True, callback=_parsed(EngineFamily.parse), help="Which engine to model: vllm (V1), vllm-v0 (0.6/0.7), vllm-v0.5 (<= 0.5: the API server in the engine's process), sglang, trtllm, lmdeploy. Sets the defaults for the sizes not given (token budget, sequences, chunking, KV sizing), prefill and decode in one step or apart, and the step-time constants (host cost, kernels, API cost)."),
        click.option("--engine-version", default=None, show_default="a current release", help="The engine's release (0.15, v0.4.3): the defaults a release changed follow it where no flag says: vLLM's async scheduling (on from 0.14), full-sequence admission (0.19) and unhashed blocks reused first (0.24); SGLang's overlap scheduler (0.4), its context check (0.5.11: prompt + max_tokens of exactly the context taken) a streamed refusal answered 400 (0.5.10) and its scheduler's refusal of a stream (an error event; finish_reason abort from 0.5.6 to 0.5.9). vllm (0.8 on) and sglang only (vllm-v0 and vllm-v0.5 take their own releases, 0.6-0.7 and <= 0.5, as a label: nothing in them is dated); the step-time constants stay the family's."),
        click.option("--api-server-count", type=click.IntRange(min=1), default=d.api_server_count, show_default=True, help="API server processes sharing request intake and token streaming (vLLM's --api-server-count); for the vllm and generic families only (vllm-v0.5's API server is the engine's process; the others model no CPU queue)."),
        click.option("--host-speed", type=FloatRange(min=0.01), default=d.host_speed, show_default=True, help="This host's CPU speed against the typical host the API front end's CPU costs are for: 2.0 halves intake and streaming costs, 0.5 doubles them (vllm, generic and vllm-v0.5 only: the others model no such costs)."),
        click.option("--api-latency-ms", "api_overhead_s", type=FloatRange(min=0.0), default=None, callback=_ms_to_s, show_default="the family's: 5 for vllm and generic, 20 sglang (fitted), 28 vllm-v0/v0.5, 15 trtllm, 2 lmdeploy", help="This host's fixed latency per request outside the engine and off the API server's CPU queue (network, HTTP and IPC round trips, the client), in ms: vLLM's own API server on loopback adds a few ms; the default is what the validation's fit hosts showed (docs/validation.md)."),
        click.option("--efficiencies", "efficiencies_path", type=click.Path(dir_okay=False), help="JSON file overriding step-time constants; a twin sim calibrate wrote also gives what it was calibrated as, where no flag says otherwise: its engine family, the release and its switches (async scheduling, admission, free-queue order), the engine its vLLM, SGLang or llama.cpp server stated (KV cache, context length; SGLang's TP degree, caps, budget and mixed chunks; llama.cpp's slots) and the other engine flags it was calibrated with (budget, sequence cap, memory share, eager mode, block size, max model len, prefix caching, chunked prefill, mixed batches, scheduler steps, output reservation, API server count, host speed) (neither for another model, GPU, precision or TP degree, nor for a search over one; the block count only while the budget and sequence cap resolve as the twin's did and the memory share, eager mode, block size and dtype are the twin's; --rate inf runs served, as its server was, unless --offline)."),
    ]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


def engine_config(kw: dict[str, Any]) -> EngineConfig:
    family = kw.get("engine_family")
    # (the engine refuses another value than the default; given as the default, it would pass unused)
    if isinstance(family, EngineFamily) and given("gpu_memory_utilization") and (
        why := memory_share_refused(family, of_the_gpu=True)
    ):
        raise UsageError(f"--gpu-memory-utilization (SGLang's --mem-fraction-static): {why}")
    if given("num_gpu_blocks_override") and given("kv_cache_free_fraction"):
        raise UsageError(
            "--num-gpu-blocks-override fixes the KV cache's size, so --kv-cache-free-gpu-mem-fraction "
            "would size nothing: give one of them"
        )
    if given("evict_unhashed_first") and kw.get("evict_unhashed_first") and isinstance(family, EngineFamily):
        caching = kw.get("enable_prefix_caching")
        if not (family.rules.prefix_caching if caching is None else caching):
            raise UsageError(
                "--evict-unhashed-first orders the free blocks the prefix cache keeps, and this engine caches no "
                f"prefixes ({'--no-enable-prefix-caching' if caching is False else f'{family.value} default'}): "
                "drop it, or give --enable-prefix-caching"
            )
    keys = [f.name for f in EngineConfig.__dataclass_fields__.values()]
    values = {k: kw[k] for k in keys if k in kw}
    return EngineConfig(**values)


@sim.command(cls=OneNamePerSetting)
@engine_options(SERVE_DEFAULTS)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--served-model-name", help="Name the API answers to (default: --model; with a calibrated twin of that model, --efficiencies, the name its server served the twin's runs under).")
@click.option("--max-waiting-requests", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Queue length beyond which requests get HTTP 429.")
@click.option("--tokenizer", type=click.Path(exists=False), help="Count tokens with this local tokenizer.json (or a directory with one, or a Hugging Face model id in the local cache); the chat template is the one in the tokenizer_config.json beside it, else ChatML.")
@click.option("--enable-prompt-tokens-details", "--enable-cache-report", "enable_prompt_tokens_details", is_flag=True,
              help="Write usage.prompt_tokens_details.cached_tokens (prompt tokens the prefix cache served), as vLLM does with this flag (SGLang: --enable-cache-report); without it, as vLLM writes it: null in a whole answer, absent from a stream's usage chunk, so a client cannot tell cached tokens. bench's own simulated server (no --url) turns it on.")
@click.option("--enable-request-id-headers", is_flag=True,
              help="Every response carries an X-Request-Id header (the request's own, else a random one), as vLLM does with this flag.")
@click.option("--announce", is_flag=True, hidden=True, help="Print the base URL on stdout once listening (for a parent process).")
def serve(**kw: Any) -> None:
    """Serve the simulated engine over the OpenAI API, in real time."""
    sys.exit(run_guarded(lambda: _serve(kw)))


def _serve(kw: dict[str, Any]) -> int:
    from inferlab.sim.server.app import ServerConfig, SimServer
    from inferlab.sim.server.launch import start_site

    kw.update(as_the_twin_was(kw))
    served = twin_model(kw)
    if served is not None and kw["served_model_name"] is None and not _another_model(kw, str(kw["efficiencies_path"])):
        kw["served_model_name"] = served  # (a twin answers to the name its server did; --model too)
        click.echo(f"inferlab: answering as {served}, the name {Path(str(kw['efficiencies_path'])).name}'s server "
                   "served (give --served-model-name to say otherwise)", err=True)
    config = ServerConfig(
        engine_config(kw), kw["served_model_name"], kw["max_waiting_requests"], tokenizer=kw["tokenizer"],
        enable_prompt_tokens_details=kw["enable_prompt_tokens_details"],
        enable_request_id_headers=kw["enable_request_id_headers"],
    )
    server = SimServer(config)

    async def main_async() -> None:
        runner, port = await start_site(server, kw["host"], kw["port"])
        if kw["announce"]:
            print(f"http://{kw['host']}:{port}", flush=True)
        e = config.engine
        click.echo(
            f"inferlab sim: {e.model} on {e.tensor_parallel_size}x {e.gpu} ({engine_line(server.engine)}), "
            f"serving http://{kw['host']}:{port}/v1 (Ctrl-C stops)",
            err=True,
        )
        if kw["tokenizer"]:
            click.echo(f"inferlab sim: tokenizer {kw['tokenizer']}, chat template: {server.tokenizer.template_source}", err=True)
        await serve_until_stopped(runner)

    try:
        asyncio.run(main_async())
    except OSError as e:
        raise InferlabError(f"cannot serve on {kw['host']}:{kw['port']}: {e.strerror or e}") from e
    return 0


@sim.command("run", cls=OneNamePerSetting)
@engine_options(RUN_DEFAULTS)
@load_options
@refused_option("--temperature", True, "sim run's simulated model does not sample (an answer's length is fixed by --output-tokens, or by its prompt with --no-exact-output), so temperature changes nothing; bench sends it to a server (the simulated one too)")
@refused_option("--extra-body", True, "sim run sends no request bodies; bench sends them to a server (the simulated one too)")
@click.option("--api", type=click.Choice(["chat", "completions"]), default="completions", show_default=True, help="chat applies the chat template to prompts.")
@click.option("--step-log", type=click.Path(dir_okay=False), help="Write one JSON line per engine step (batch, prefill/decode tokens, KV usage, preemptions).")
@click.option("--offline/--served", "offline", default=None, help="Run as vLLM's offline LLM class (no API server costs, larger default budget) or behind its API server. Default: offline only with --rate inf and no --max-concurrency, and not for a calibrated twin (a server's: served).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True, help="Engines of this config, in parallel, each with its own KV and prefix cache, behind --router.")
@click.option("--router", type=click.Choice(list(ROUTERS)), default="round-robin", show_default=True, help="How --replicas share the requests: inferlab gateway's routing policies, the same code.")
@click.option("--long-prompt-tokens", type=click.IntRange(min=1), default=None, help="--router split-by-length (needed there): a prompt of this many tokens or more goes to the long-prompt replicas, the others to the rest.")
@click.option("--long-replicas", type=click.IntRange(min=1), default=1, show_default=True, help="--router split-by-length: how many of the --replicas (the last ones) take the long prompts.")
@click.option("--admission", type=click.Choice(["tokens", "requests", "off"]), default=None, help="Put inferlab gateway's admission in front of the engine(s), the same code ([admission] mode): by tokens in flight (smallest waiters first), by requests in flight (arrival order), or off. Default: no gateway.")
@click.option("--max-tokens-in-flight", type=click.IntRange(min=1), default=_ADMISSION.max_tokens_in_flight, show_default=True, help="--admission tokens: prompt + max_tokens held per engine.")
@click.option("--max-requests-in-flight", type=click.IntRange(min=1), default=_ADMISSION.max_requests_in_flight, show_default=True, help="--admission requests: requests per engine.")
@click.option("--queue-max", type=click.IntRange(min=0), default=_ADMISSION.queue_max, show_default=True, help="--admission: requests that may wait in the gateway's queue; more get 503.")
@click.option("--queue-timeout-s", type=FloatRange(min=0.0, min_open=True, max=LONGEST_S), default=_ADMISSION.queue_timeout_s, show_default=True, help="--admission: the longest wait in the gateway's queue; longer gets 503.")
@click.option("--starvation-s", type=FloatRange(min=0.0, min_open=True, max=LONGEST_S), default=_ADMISSION.starvation_s, show_default=True, help="--admission tokens: a request waiting this long goes before smaller ones.")
@click.option("--default-max-tokens", type=click.IntRange(min=1), default=_ADMISSION.default_max_tokens, show_default=True, help="--admission tokens: output tokens held for a request without max_tokens.")
def run_cmd(**kw: Any) -> None:
    """Run a workload through the simulated engine in virtual time (no HTTP)."""
    sys.exit(run_guarded(lambda: _sim_run(kw)))


def _model_from_trace(kw: dict[str, Any]) -> None:
    """Without ``--model``, replay a vLLM benchmark result on the model it measured when
    the simulator knows that model; say which model runs either way."""
    from inferlab.sim.engine.hardware import resolve_model
    from inferlab.workload.traces import vllm_result_model

    ctx = click.get_current_context(silent=True)
    given = ctx is not None and ctx.get_parameter_source("model") != click.core.ParameterSource.DEFAULT
    traced = vllm_result_model(kw["trace"]) if kw.get("trace") else None
    if traced is not None and given and not _same_model(traced, str(kw["model"])):
        click.echo(f"inferlab: the trace measured a model named {traced}; simulating {kw['model']}, as --model says "
                   "(a server may serve a model under another name: if they are two models, the lines comparing "
                   "with the trace compare them, a what-if)", err=True)
        return
    if traced is None or given:
        return
    try:
        resolve_model(traced)
    except UsageError:
        click.echo(f"inferlab: the trace measured {traced}, which has no preset; simulating "
                   f"{kw['model']} (give --model NAME or a config.json)", err=True)
        return
    kw["model"] = traced
    click.echo(f"inferlab: simulating the trace's model, {traced}", err=True)


def _trace_model(kw: dict[str, Any]) -> str | None:
    """The model name the run a trace is of was served under: a vLLM benchmark result's,
    or a run directory's (its ``config.json`` beside ``requests.jsonl``: the name the
    server answered to, else the one asked for); None for other traces, or none given."""
    from inferlab.workload.traces import vllm_result_model

    trace = kw.get("trace")
    if not trace:
        return None
    traced = vllm_result_model(trace)
    if traced is not None:
        return traced
    try:
        config = json.loads((Path(trace).parent / "config.json").read_text())
    except (OSError, ValueError):
        return None
    resolved = config.get("resolved") if isinstance(config, dict) else None
    model = (resolved if isinstance(resolved, dict) else {}).get("model") or config.get("model")
    return model if isinstance(model, str) and model else None


def model_key(name: str) -> str:
    """A model's name as compared: its last path part (a ``config.json``'s folder),
    case aside: ``/models/Qwen2.5-1.5B-Instruct`` is ``Qwen/Qwen2.5-1.5B-Instruct``."""
    parts = [p for p in name.strip().replace("\\", "/").split("/") if p]
    if len(parts) > 1 and parts[-1].lower() == "config.json":
        parts.pop()
    return (parts[-1] if parts else name).lower()


def _same_model(a: str, b: str) -> bool:
    """Whether two model names run as one simulated model (the preset both resolve to:
    'Llama-3.1-8B' and 'meta-llama/Llama-3.1-8B-Instruct'), or are one name however cased
    (a ``config.json`` by its folder's)."""
    from inferlab.sim.engine.hardware import resolve_model

    if model_key(a) == model_key(b):
        return True
    try:
        return resolve_model(a).name == resolve_model(b).name
    except UsageError:
        return False


def _say_result_engine(kw: dict[str, Any]) -> None:
    """Replaying a vLLM benchmark result: it records no server flags, so say that the
    engine flags not given here are the simulator's defaults (a server run with other
    flags, --enforce-eager say, replays at other speeds without a word otherwise), and
    when the result is itself one of inferlab's predictions (its ``inferlab_source``)."""
    from inferlab.workload.traces.vllm import vllm_result_field

    trace = kw.get("trace")
    if not trace or vllm_result_field(trace, "model_id") is None:
        return
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "gpu"}
    if not any(given(name) for name in fields if name in kw):
        click.echo("inferlab: a vLLM result records no server flags: every engine flag is the simulator's default "
                   "(CUDA graphs on, its context length and token budget); give the server's (--enforce-eager, "
                   "--max-model-len, --max-num-batched-tokens, ...) to replay that server", err=True)
    source = vllm_result_field(trace, "inferlab_source")
    if isinstance(source, str) and "simulated" in source:
        click.echo(f"inferlab: the result is itself a prediction ({source})", err=True)


#: Recorded engine settings a replay does not take: whether it runs offline follows its
#: own schedule, and the GPU is taken as the preset it resolved to.
_NOT_REPLAYED = frozenset({"offline", "gpu", "gpu_preset"})
#: The API front end's settings: a replay served where the run was offline, or the
#: reverse, does not take them (offline there is none; its recorded latency is 0)
_FRONT_END_SETTINGS = frozenset({"api_overhead_s", "api_server_count", "host_speed"})
#: What a release decides (``FamilyRules.*_since``): a replay given another release (or
#: family) takes them from it, not from the record
_RELEASE_SETTINGS = frozenset({"engine_version", *RELEASE_SWITCHES})
#: ... and what a family decides, for a replay given another family (its memory share
#: included: vLLM's and SGLang's of the card, TensorRT-LLM's and LMDeploy's of what weights leave)
_FAMILY_SETTINGS = _RELEASE_SETTINGS | {"enable_chunked_prefill", "enable_prefix_caching", "mixed_batches", "reserve_outputs",
                                        "capacity_scheduler_policy",
                                        "gpu_memory_utilization", "kv_cache_free_fraction"}


def take_recorded_engine(kw: dict[str, Any], engine: Mapping[str, Any], keep: Iterable[str] = ()) -> list[str]:
    """Put in ``kw`` the flags of a simulated engine a run recorded (``simulated_engine``)
    that no flag gives, but ``keep``'s; returns their names. Its card is its preset; its
    front end is not taken by a run served where it ran offline or the reverse (offline
    there is none), nor its family's and release's settings by a run given another
    family, nor its release's by one given another release."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - _NOT_REPLAYED - set(keep)
    if bool(engine.get("offline")) != bool(kw.get("offline")):
        # the recorded front end (none offline: latency 0) is not this run's: the family's
        fields -= _FRONT_END_SETTINGS
    if given("engine_family") and str(kw.get("engine_family")) != str(engine.get("engine_family")):
        fields -= _FAMILY_SETTINGS | _FRONT_END_SETTINGS  # (the recorded ones were another family's)
    elif given("engine_version"):
        fields -= _RELEASE_SETTINGS  # (the recorded ones were the recorded release's)
    taken = [name for name in sorted(fields & set(engine)) if not given(name)]
    for name in taken:
        kw[name] = engine[name]
    if "gpu_preset" in engine and not given("gpu"):
        kw["gpu"] = engine["gpu_preset"]
        taken.append("gpu")
    return taken


def _engine_from_trace_run(kw: dict[str, Any]) -> None:
    """Replaying a run's ``requests.jsonl``: the engine that run simulated, from the
    ``config.json`` beside it (a ``sim run``'s ``engine``, or a ``bench`` against the
    simulated server's ``resolved.engine``), for every engine flag not given here; say
    so. Nothing for other traces, or runs against other servers; through ``inferlab
    gateway`` nothing either (its setup is not one engine's), and say so."""
    trace = kw.get("trace")
    if not trace:
        return
    path = Path(trace).parent / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    engine = simulated_engine(config)
    if engine is None:
        if server_info(config).kind == GATEWAY:
            click.echo(f"inferlab: the run went through inferlab gateway ({path}): replaying on the engine flags given "
                       "here, not on its upstreams' (the gateway's cache, admission and routing are not replayed)", err=True)
        return
    take_recorded_engine(kw, engine)
    kw["_engine_replayed"] = True  # (a twin's settings do not replace the run's: ``as_the_twin_was``)
    click.echo(
        f"inferlab: replaying on the engine the run simulated ({engine.get('model')} on "
        f"{engine.get('gpu_preset', engine.get('gpu'))}, every size as it ran; from {path}; flags given here win)",
        err=True,
    )


#: What a release decides, in words (``sim.engine.bands.RELEASE_SWITCHES``)
_SWITCH_WORDS = {"scheduler_reserve_full_isl": "full-sequence admission", "evict_unhashed_first": "unhashed blocks reused first"}


def as_the_twin_was(kw: dict[str, Any], searched: Iterable[str] = ()) -> dict[str, Any]:
    """What a calibrated twin (``--efficiencies`` with its ``sim calibrate`` record) ran
    as, for a run that does not say it otherwise (no flag, no replayed run's engine, not
    ``searched`` by a tune; of the twin's family, or of none given); said on stderr; {}
    otherwise.

    - Its engine family, where none is given (a twin of SGLang runs as ``sglang``).
    - What a release decides: its release and its async (overlap) scheduling, admission
      and free-queue order, all or none (a run that sets one of them sets its release).
      Without them a twin of vLLM 0.13 or of llama-server (neither schedules ahead)
      would run as a current vLLM and lose its bands.
    - The engine flags its server stated (vLLM's KV cache and context length; SGLang's
      too, its TP degree, caps and budget: not its chunk size as a budget for a run
      without chunked prefill; llama.cpp's slots and context), and the engine flags
      calibrate ran with (``CALIBRATED_WITH``: sizes, context, eager mode, prefix caching,
      chunking, front end), each where not given, and none for a run of another model, GPU, precision
      or tensor-parallel degree (another server), or a search over any of them. The
      number of KV blocks is the server's unless a flag sizes the cache otherwise
      (``_SIZES_FROM_MEMORY``: memory share, block size, the cache's dtype): then the run sizes its cache from the simulated GPU's
      memory, and says so. Another budget or sequence cap (with which the server might
      have had somewhat another number) keeps the server's blocks, said: the simulated
      GPU's memory may be nothing like the server's (a CPU's).

    A twin's ``--rate inf`` runs are served, as its server was (``load.run``): said here."""
    path = kw.get("efficiencies_path")
    found = calibrated_as(path) if path else None
    family = EngineFamily.parse(str(kw.get("engine_family") or "vllm"))
    name, searched = Path(str(path)).name, set(searched)
    if found is None or kw.get("_engine_replayed"):
        return {}
    taken: dict[str, Any] = {}

    def say(text: str) -> None:
        click.echo(f"inferlab: {text}", err=True)

    if _bursts_uncapped(kw):  # (``load.run.sim_engine_config``: whatever else is taken)
        say(f"--rate inf runs served, as {name}'s server was (--offline for vLLM's offline class)")
    if found.family != family.value:  # (the twin's family where none is given: an SGLang twin runs as sglang)
        if "engine_family" in searched:
            say(f"the search sets the engine's family per trial: nothing of {name} (a twin of the {found.family} "
                "family) is taken")
        elif given("engine_family"):
            say(f"--engine-family {family.value}: a what-if of another engine than {name}'s ({found.family}): its "
                "release, what its server stated and the flags it was calibrated with are not taken")
        if given("engine_family") or "engine_family" in searched:
            return {}
        family = EngineFamily.parse(found.family)
        taken["engine_family"] = family.value
        kw = {**kw, "engine_family": family.value}
    if found.release and not any(kw.get(k) is not None or given(k) for k in _RELEASE_SETTINGS):
        if searched & {*_RELEASE_SETTINGS, "engine_family"}:
            say(f"the search sets the engine's family, release or its switches per trial: they are not taken from {name}")
        else:
            taken.update(found.release)
    stated = {k: v for k, v in found.stated.items() if not given(k) and k not in searched}
    # (unchunked, or chunking searched: a budget for chunks, stated or sized, is not this engine's)
    unchunked = kw.get("enable_chunked_prefill") is False or "enable_chunked_prefill" in searched
    if unchunked:
        stated.pop("max_num_batched_tokens", None)
    # (the sizes calibrate's engine ran with, where not given: sim serve's own defaults are not the twin's;
    # None only where it means the family's default)
    # (a sweep's one-value lists as their value; offline there is no front end to take)
    defaults, (one, _) = EngineConfig(), _scalar(kw)
    sizes = {k: v for k, v in found.sized_with.items()
             if k in CALIBRATED_WITH and k not in stated and not given(k) and k not in searched and one.get(k) != v
             and not (unchunked and k == "max_num_batched_tokens") and (v is not None or getattr(defaults, k) is None)
             and not (kw.get("offline") and k in _FRONT_END_SETTINGS)}
    # (an unchunked engine runs a whole prompt in a step: a budget below the context given is not the twin's
    # engine with another context, but one vLLM refuses to start)
    chunked = one.get("enable_chunked_prefill") if given("enable_chunked_prefill") else stated.get(
        "enable_chunked_prefill", sizes.get("enable_chunked_prefill"))
    budget = stated.get("max_num_batched_tokens", sizes.get("max_num_batched_tokens"))
    context = one.get("max_model_len") if given("max_model_len") else None
    if chunked is False and isinstance(budget, int) and isinstance(context, int) and context > budget:
        stated.pop("max_num_batched_tokens", None)
        sizes.pop("max_num_batched_tokens", None)
        say(f"--max-model-len {context} without chunked prefill: {name}'s --max-num-batched-tokens {budget} is below "
            "it and not taken (the family's budget for that context is)")
    identity = searched & set(_IDENTITY)
    # (flags given otherwise than the twin's server stated: a what-if of that server, said; not the
    # cache's pages and pool, which calibrate may have converted to the run's block size)
    contradicted = [k for k, v in found.stated.items() if given(k) and k not in searched and k in one
                    and k not in ("block_size", "num_gpu_blocks_override")
                    and setting_text(k, one[k]) != setting_text(k, v)]
    if (stated or sizes or contradicted) and (identity or _another_server({**kw, **sizes, **stated}, str(path))):
        what = f"the search sets {', '.join(map(flag_words, sorted(identity)))} per trial" if identity else (
            f"the run is of another model, GPU, precision or tensor-parallel degree than {name}'s")
        say(f"{what}: the engine its server stated (KV cache, context length) and the flags it was calibrated with "
            "are not taken")
        stated, sizes, contradicted = {}, {}, []
    if contradicted:
        say(f"{', '.join(flag_words(k, one[k]) for k in contradicted)}: a what-if of {name}'s server, which stated "
            f"{', '.join(flag_words(k, found.stated[k]) for k in contradicted)}")
    taken.update(sizes)
    blocks = stated.pop("num_gpu_blocks_override", None)
    if blocks is not None:
        other = _other_cache({**kw, **taken, **stated}, found, searched, blocks)
        page = found.stated.get("block_size", found.sized_with.get("block_size"))
        had = f"{blocks} blocks" + (f" of {page} tokens ({blocks * page:,} tokens)" if isinstance(page, int) else "")
        memory = [w for w in other if w.split(" ")[0] in _SIZES_FROM_MEMORY]
        if memory:
            say(f"{', '.join(other)} not as {name} was calibrated: the KV cache is sized from the simulated GPU's "
                f"memory, not from the {had} its server had")
        else:
            if other:  # (another budget or cap: the server's own count is nearer than the simulated GPU's memory)
                say(f"{', '.join(other)} not as {name} was calibrated: its server might have sized its KV cache "
                    f"otherwise with them; kept at the {had} it had, not sized from the simulated GPU's memory "
                    "(give --gpu-memory-utilization for that)")
            stated["num_gpu_blocks_override"] = blocks
    taken.update(stated)

    def word(key: str, value: Any) -> str:
        if value is None:  # (a size calibrate left to the family, or the model's context)
            return "the model's context (--max-model-len)" if key == "max_model_len" else f"the family's default {flag_words(key)}"
        if key == "engine_family":
            return f"the {value} family"
        if key == "engine_version":
            return f"release {value}"
        if key in RELEASE_SWITCHES:
            what = _SWITCH_WORDS.get(key) or ("async" if family is EngineFamily.VLLM else "overlap") + " scheduling"
            return f"{what} {'on' if value else 'off'}"
        return flag_words(key, value)

    # (vLLM's admission and free-queue switches go unsaid for another family: it has neither)
    shown = {k: v for k, v in taken.items() if family is EngineFamily.VLLM or k not in _SWITCH_WORDS}
    if shown:
        say(f"as {name} was calibrated: {', '.join(word(k, v) for k, v in shown.items())} (unless flags say otherwise)")
    return taken


def twin_model(kw: dict[str, Any], other: str | None = None, what: str = "") -> str | None:
    """The model name the runs a calibrated twin (``--efficiencies`` with its ``sim
    calibrate`` record) was fitted on were served under (its ``served_model``), said on
    stderr; with a warning, not a refusal, where ``other``, the name ``what`` was served
    under (a run compared or calibrated against the twin: "the runs were"), is another model's (by
    ``model_key``: a folder's path is its name). None for a file without one (constants
    alone, or calibrated before the record kept it)."""
    path = kw.get("efficiencies_path")
    found = calibrated_as(str(path)) if path else None
    if found is None or found.served_model is None:
        return None
    name = Path(str(path)).name
    click.echo(f"inferlab: {name} was fitted on runs of {found.served_model} (as their server named it)", err=True)
    if other and model_key(other) != model_key(found.served_model):
        click.echo(f"inferlab: warning: {what} served as {other}, "
                   f"{name} as {found.served_model}: if they are two models, the twin's numbers are not this one's",
                   err=True)
    return found.served_model


def setting_text(key: str, value: Any) -> str:
    """An engine setting's value as text, a cache dtype or a quantization by its canonical name."""
    if key == "kv_cache_dtype":
        return str(KVCacheDType.parse(str(value)).value)
    return str(Quantization.parse(str(value)).value) if key == "quantization" and value is not None else str(value)


def flag_words(key: str, value: Any = None) -> str:
    """An engine setting as its flag says it: --block-size 32, --no-enable-prefix-caching
    (the flag alone for ``value`` None)."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else flag.replace("--", "--no-", 1)
    return flag if value is None else f"{flag} {value}"


#: What makes a run another server than a twin's (``served_by``)
_IDENTITY = ("engine_family", "model", "gpu", "tensor_parallel_size", "dtype", "quantization", "kv_cache_dtype")


def _scalar(kw: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """``kw`` with a sweep's one-value lists read as their value and unset flags left out;
    and the keys listed with several values (a sweep's axes)."""
    one: dict[str, Any] = {}
    several: set[str] = set()
    for key, value in kw.items():
        if isinstance(value, tuple):
            if len(value) != 1:
                several.add(key)
                continue
            value = value[0]
        if value is not None:  # (a sweep's flag not given: the engine's default)
            one[key] = value
    return one, several


def _another_server(kw: dict[str, Any], efficiencies: str) -> bool:
    """Whether the engine ``kw`` describes is not the server ``efficiencies`` was
    calibrated on (its model, GPU, precision or tensor-parallel degree differ), or
    cannot be told (a sweep's list of them, flags the engine refuses)."""
    one, several = _scalar(kw)
    if several & set(_IDENTITY):
        return True
    try:
        served = served_by(engine_config(one))
    except (UsageError, ValueError, TypeError):
        return True
    return calibration_mismatch(efficiencies, {k: served[k] for k in _IDENTITY if k in served}) is not None


def _another_model(kw: dict[str, Any], efficiencies: str) -> bool:
    """Whether the engine ``kw`` describes simulates another model than the one
    ``efficiencies`` was calibrated on (its record's ``served_by``), or cannot be told."""
    one, several = _scalar(kw)
    if "model" in several:
        return True
    try:
        model = served_by(engine_config(one))["model"]
    except (UsageError, ValueError, TypeError):
        return True
    return calibration_mismatch(efficiencies, {"model": model}) is not None


#: The flags that size a twin's KV cache from memory (its own what-if of the cache), not
#: kept at the blocks its server had: the memory share and what a block holds
_SIZES_FROM_MEMORY = ("--gpu-memory-utilization", "--kv-cache-free-fraction", "--block-size", "--kv-cache-dtype")


def _other_cache(kw: dict[str, Any], found: CalibratedAs, searched: set[str], blocks: int) -> list[str]:
    """The flags (as words) by which the run's cache would be sized otherwise than the
    twin's was: ``SIZED_WITH`` unlike the record's, the block size or dtype unlike the
    server's, any of them searched or swept over several values. The batch budget and
    sequence cap are compared as the engine resolves them (``blocks`` held; the twin's
    with its own chunking and context), offline for ``--offline`` (a twin's runs are
    otherwise served): vLLM's offline class has a larger default budget, so a twin of a
    server keeps its count only at the budget the server had. A record without
    ``sized_with`` (written before it) is taken as sized with the flags' defaults."""
    one, several = _scalar(kw)
    defaults = EngineConfig()
    out = []
    sizes = ("max_num_batched_tokens", "max_num_seqs")  # (compared as resolved, below)
    for key in (*SIZED_WITH, "kv_cache_dtype", "enable_chunked_prefill"):
        if key == "enable_chunked_prefill":  # (it resolves the budget: below, unless searched)
            if key in searched:
                out.append(flag_words(key))
            continue
        if key in searched or key in several:
            out.append(flag_words(key))
            continue
        if key in sizes:
            continue
        was = found.stated.get(key) if key in ("block_size", "kv_cache_dtype") else found.sized_with.get(key, getattr(defaults, key))
        now = one.get(key, getattr(defaults, key))
        if key in ("block_size", "kv_cache_dtype") and key not in found.stated:
            continue  # (the server did not say: nothing to hold it to)
        if key == "kv_cache_dtype":
            was, now = str(KVCacheDType.parse(str(was)).value), str(KVCacheDType.parse(str(now)).value)
        if was != now:
            out.append(flag_words(key))
    if out:
        return out
    # (the twin's engine: its chunking and context as it was calibrated, not the run's)
    twin = {k: v for k, v in one.items() if k not in ("enable_chunked_prefill", "max_model_len")}
    twin.update({k: found.stated.get(k, found.sized_with.get(k)) for k in ("enable_chunked_prefill", "max_model_len")
                 if k in found.stated or found.sized_with.get(k) is not None})
    calibrated = _batch_sizes({**twin, **{k: found.sized_with.get(k) for k in sizes}}, False, blocks)
    # (a twin's runs are served, at --rate inf too (``load.run.sim_engine_config``): offline only with --offline)
    offline = bool(kw.get("offline"))
    now = _batch_sizes(one, offline, blocks)
    if now is None or calibrated is None:  # (the run refuses its engine: that error comes next)
        return ["the engine's sizes"]
    return [flag_words(key) if key in one else f"the {'offline ' if offline else ''}default {flag_words(key, n)} "
            f"({w} on its server)" for key, w, n in zip(sizes, calibrated, now, strict=True) if w != n]


def _batch_sizes(one: dict[str, Any], offline: bool, blocks: int) -> tuple[int, int] | None:
    """The batch budget and sequence cap the engine ``one`` describes resolves to,
    offline or served, with ``blocks`` KV blocks; None where it refuses the flags."""
    try:
        config = dataclasses.replace(engine_config(one), offline=offline, num_gpu_blocks_override=blocks)
        sizes = size_engine(resolve(config))
    except (InferlabError, ValueError, TypeError):
        return None
    return sizes.max_num_batched_tokens, sizes.max_num_seqs


def _bursts_uncapped(kw: dict[str, Any]) -> bool:
    """Whether the run (or a sweep's point) sends every request at once with no cap
    and no ``--offline/--served``: vLLM's offline class but for a twin (``load.run``)."""
    rates = kw.get("rate")
    rates = rates if isinstance(rates, (tuple, list)) else (rates,)
    capped = kw.get("max_concurrency") is not None or kw.get("trace") or kw.get("offline") is not None
    return not capped and any(_infinite(r) for r in rates)


def _infinite(rate: Any) -> bool:
    try:
        return rate is not None and math.isinf(float(rate))
    except (TypeError, ValueError):
        return False


def _sim_run(kw: dict[str, Any]) -> int:
    from inferlab.load.run import RunConfig, SimTarget, run

    _model_from_trace(kw)
    _say_result_engine(kw)
    _engine_from_trace_run(kw)
    kw.update(as_the_twin_was(kw))
    twin_model(kw, _trace_model(kw), "the trace's run was")
    config = RunConfig(load_config(kw), workload_config(kw), kw["api"], slo_config(kw), kw["out"], kw["overwrite"])
    from inferlab.load.run import is_twin

    # (as ``load.run.sim_engine_config`` will decide it)
    offline_by_default = _bursts_uncapped(kw) and not is_twin(engine_config(kw))
    _sized_as_trtllm_bench(kw, offline=bool(kw["offline"]) if kw["offline"] is not None else offline_by_default)
    if offline_by_default and not kw["as_json"]:  # (--json: its config says offline, and stdout is the JSON)
        click.echo("inferlab: --rate inf with no --max-concurrency runs the engine offline (no API server; for vLLM its "
                   "LLM class and offline budget, as vllm bench throughput); vllm bench serve --request-rate inf sends every "
                   "request through the API server: add --served for that (--offline says this one, without this note)",
                   err=True)
    if kw["replicas"] == 1 and given("router"):
        raise UsageError("--router chooses among --replicas: give --replicas N (2 or more)")
    if kw["router"] != SPLIT and (given("long_prompt_tokens") or given("long_replicas")):
        raise UsageError(f"--long-prompt-tokens and --long-replicas act with --router {SPLIT} ("
                         + (f"given: --router {kw['router']})" if given("router") else f"the default router is {kw['router']})"))
    if kw["router"] == SPLIT and kw["long_prompt_tokens"] is None:
        raise UsageError(f"--router {SPLIT} needs --long-prompt-tokens T: a prompt of T tokens or more is long")
    target = SimTarget(engine_config(kw), kw["offline"], kw["step_log"], kw["replicas"], kw["router"], admission_config(kw),
                       kw["long_prompt_tokens"], kw["long_replicas"])
    # (front-end settings on an offline run are refused where every engine is checked:
    # ``sim.engine.config``, for sweep, tune and calibrate alike)

    async def main_async() -> RunResult:
        stop = asyncio.Event()
        install_stop_signals(stop)
        return await run(config, target, stop=stop)

    try:
        result = finish_run(asyncio.run(main_async()), kw)
    except RunFailedError as e:  # every request failed: what they said is shown first
        if isinstance(e.result, RunResult):
            e.result = finish_run(e.result, kw)
            e.summary = e.result.summary
            _render_sim_run(e.result, kw)
        raise
    _render_sim_run(result, kw)
    if result.cause is not None:
        raise result.cause
    return 130 if result.interrupted else 0


def _sized_as_trtllm_bench(kw: dict[str, Any], *, offline: bool) -> None:
    """An offline TensorRT-LLM run (``--offline``, or ``--rate inf`` with no cap): its
    batch and token budget as trtllm-bench sizes them where no flag gives them
    (``load.run.trtllm_bench_sized``, which the run applies too); said, and put in ``kw``
    so the engine line shows them."""
    from inferlab.load.run import trtllm_bench_sized
    from inferlab.sim.engine.engine import Engine

    engine = dataclasses.replace(engine_config(kw), offline=offline)
    sized = trtllm_bench_sized(engine, workload_config(kw))
    if sized is None:
        return
    kv = Engine(engine).kv_capacity_tokens
    kw["max_num_seqs"], kw["max_num_batched_tokens"] = sized.max_num_seqs, sized.max_num_batched_tokens
    isl, osl = _mean_lengths(kw)
    click.echo(f"inferlab: offline TensorRT-LLM sized as trtllm-bench sizes it for {isl:,.0f}/{osl:,.0f} tokens and the "
               f"{kv:,}-token KV cache of its default sizes: --max-num-seqs {kw['max_num_seqs']} --max-num-batched-tokens "
               f"{kw['max_num_batched_tokens']} (give them to say otherwise; with these the cache is sized again)", err=True)


def _mean_lengths(kw: dict[str, Any]) -> tuple[float, float]:
    from inferlab.workload.lengths import parse_length

    return parse_length(kw["input_tokens"]).mean, parse_length(kw["output_tokens"], "--output-tokens").mean


def _render_sim_run(result: RunResult, kw: dict[str, Any]) -> None:
    if kw["as_json"]:
        click.echo(dumps(result.summary.to_json()))
        return
    engine = result.engine
    assert engine is not None
    out = console()
    e = engine.config
    replicas = result.summary.config.get("replicas")
    where = f"{e.tensor_parallel_size}x {e.gpu}"
    if replicas:
        where = replicas_words(replicas, where)
    if result.summary.config.get("admission"):
        where += ", behind the gateway's admission"
    render_summary(out, result.summary, f"{e.model} on {where}, virtual time {PREDICTION}", table_percentiles(kw))
    line = Table(show_header=False, box=None, pad_edge=False)
    line.add_column(style="bold", no_wrap=True, min_width=18)
    line.add_column()  # wraps under itself, not under the label
    line.add_row("engine", engine_line(engine))
    block = result.summary.prediction
    preempted = block.get("preemptions") if isinstance(block, dict) else None
    for said in block.get("beyond_validated", []) if isinstance(block, dict) else []:
        line.add_row("validated?", said)
    if preempted:
        line.add_row("preemptions", f"{preempted:,}: a running request evicted, to be recomputed, when the "
                                    "simulated engine's KV cache ran out")
    for label, text in prediction_lines(result.summary):
        line.add_row(label, text)
    out.print(line)
    if kw["out"]:
        out.print(f"results: {kw['out']}/summary.json, {kw['out']}/requests.jsonl")


@sim.command("presets")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as JSON.")
def presets_cmd(as_json: bool) -> None:
    """The GPUs and models the simulator knows by name (datasheet and config numbers)."""
    sys.exit(run_guarded(lambda: _presets(as_json)))


def _presets(as_json: bool) -> int:
    from inferlab.sim.engine.hardware import (
        gpu_memory_source,
        gpu_presets,
        model_names,
        resolve_gpu,
        resolve_model,
    )
    from inferlab.sim.engine.steptime import kv_bytes_per_token

    gpus: list[dict[str, Any]] = []
    for name, aliases in gpu_presets().items():
        gpu = resolve_gpu(name)
        gpus.append({
            "name": gpu.name, "aliases": aliases,
            "bf16_tflops": gpu.bf16_flops_per_s / 1e12,
            "fp8_tflops": gpu.fp8_flops_per_s / 1e12 if gpu.fp8_flops_per_s else None,
            # (the device memory nvidia-smi reports, not the datasheet's GB: where it was published)
            "memory_gib": gpu.hbm_bytes / 2**30, "memory_source": gpu_memory_source(name),
            "memory_tb_per_s": gpu.hbm_bytes_per_s / 1e12,
            "link_gb_per_s": gpu.bus_bytes_per_s / 1e9,
            "peer_to_peer": gpu.peer_to_peer,  # (false: all-reduces through host memory)
        })
    models: list[dict[str, Any]] = []
    for name in model_names():
        spec = resolve_model(name)
        models.append({
            "name": spec.name, "params_billions": spec.params_total / 1e9,
            "active_params_billions": spec.active_params_total / 1e9,
            "experts": f"{spec.experts_per_token} of {spec.num_experts}" if spec.num_experts else None,
            "layers": spec.num_layers,
            "kv_heads": spec.num_kv_heads, "kv_bytes_per_token_bf16": kv_bytes_per_token(spec, 1),
            "context": spec.max_position_embeddings,
        })
    if as_json:
        click.echo(json.dumps({"gpus": gpus, "models": models}, indent=2))
        return 0
    out = console()
    t = Table(title="GPUs (--gpu NAME, or a JSON file with the same fields; GiB: the memory nvidia-smi reports, "
                    "--json gives each card's source; * none published: the datasheet's GB read as GiB)")
    for col in ("name", "also", "bf16 TF", "fp8 TF", "GiB", "TB/s", "link GB/s"):
        t.add_column(col, justify="left" if col in ("name", "also") else "right", no_wrap=col in ("name", "link GB/s"))
    for g in gpus:
        fp8 = g["fp8_tflops"]
        t.add_row(g["name"], ", ".join(g["aliases"]), f"{g['bf16_tflops']:,.0f}", "—" if fp8 is None else f"{fp8:,.0f}",
                  f"{g['memory_gib']:.2f}" + ("" if g["memory_source"] else "*"), f"{g['memory_tb_per_s']:.2f}",
                  f"{g['link_gb_per_s']:.0f}" + ("" if g["peer_to_peer"] else " (no P2P)"))
    out.print(t)
    t = Table(title="Models (--model NAME or its HF id, or a config.json path)")
    # parameters in billions: all of them, and (mixture of experts) those a token runs
    for col in ("name", "params B", "active B", "layers", "KV heads", "KV KiB /tok", "max len"):
        t.add_column(col, justify="left" if col == "name" else "right", no_wrap=col == "name")
    for m in models:
        active = f"{m['active_params_billions']:.1f}" if m["experts"] else "—"
        t.add_row(m["name"], f"{m['params_billions']:.1f}", active, str(m["layers"]), str(m["kv_heads"]),
                  f"{m['kv_bytes_per_token_bf16'] / 1024:.0f}", _tokens_short(m["context"]))
    out.print(t)
    return 0


def _tokens_short(n: int) -> str:
    """A context length as people write it: 32K (32,768), 128K, 4K; others with commas."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def _family_switches_changed(engine: Engine) -> list[str]:
    """The KV admission and free-queue switches where they differ from the family's
    (output reservation when on is named by ``engine_line`` whatever the family)."""
    e, rules = engine.config, engine.config.engine_family.rules
    parts = []
    if e.scheduler_reserve_full_isl != rules.reserve_full_sequence:
        parts.append("full-sequence admission " + ("on" if e.scheduler_reserve_full_isl else "off"))
    if e.reserve_outputs != rules.reserve_outputs and not e.reserve_outputs:  # (on: named below)
        parts.append("outputs not reserved at admission")
    if e.capacity_scheduler_policy is not rules.capacity_policy and not engine.limits.no_evict:  # (on: named below)
        parts.append("admitted on the first chunk, preempted when the cache fills (MAX_UTILIZATION)")
    if e.evict_unhashed_first != rules.evict_unhashed_first and e.enable_prefix_caching:
        parts.append("unhashed blocks reused first " + ("on" if e.evict_unhashed_first else "off"))
    return parts


def engine_line(engine: Engine) -> str:
    """The resolved engine sizes in one line, so defaults are never a guess."""
    e, lim = engine.config, engine.limits
    gpu = engine.gpu.name  # the preset a free-text name was read as
    parts = [
        *([gpu] if gpu != e.gpu else []),
        # the card's share of its datasheet bandwidth against the H100 the constants were fit on
        *([f"bandwidth factor {engine.gpu.stream_factor:g}"] if engine.gpu.stream_factor != 1.0 else []),
        # GeForce cards: no peer-to-peer access, so each all-reduce goes through host memory
        *(["all-reduce through host memory (no P2P)"] if e.tensor_parallel_size > 1 and not engine.gpu.peer_to_peer else []),
        e.quantization if e.quantization not in (None, Quantization.NONE) else ("fp16" if e.dtype is DType.FLOAT16 else "bf16"),
        *(["fp8 KV"] if e.kv_cache_dtype is KVCacheDType.FP8 else []),
        f"max-model-len {lim.max_model_len:,}",
        f"{lim.max_num_batched_tokens:,} {'tokens' if lim.budget_bounds_decodes else 'prompt tokens'}/step"
        + ("" if lim.enable_chunked_prefill else " (prompts whole)"),
        *([] if lim.mixed_batches else ["prefill and decode steps apart"]),
        *([f"{lim.num_scheduler_steps} decode steps per schedule"] if lim.num_scheduler_steps > 1 else []),
        *([f"release {e.engine_version}"] if e.engine_version else []),
        # (vLLM calls it async scheduling)
        *([("async" if e.engine_family is EngineFamily.VLLM else "overlap") + " scheduling"] if e.overlap_schedule else []),
        *(["outputs reserved at admission"] if e.reserve_outputs else []),
        *(["admitted only with room to the output limit (no eviction)"] if lim.no_evict else []),
        *_family_switches_changed(engine),
        f"{lim.max_num_seqs:,} seqs",
        f"KV {engine.kv_capacity_tokens:,} tokens" + (
            f" ({engine.num_kv_blocks:,} blocks of {e.block_size}"
            + (" + the null block" if e.engine_family.rules.null_block else "") + ")"
            if e.num_gpu_blocks_override is not None else ""
        ),
        "eager" if e.enforce_eager else "CUDA graphs",
        *_host_words(engine),
        "offline (no API server)" if e.offline else _front_end_words(engine),
        *_constants_words(e),
    ]
    return ", ".join(parts)


def _constants_words(e: EngineConfig) -> list[str]:
    """Whose defaults and step-time constants ran: another family's than vLLM's, and an
    efficiencies file's (a twin's: its fit's) over the family's."""
    name = Path(e.efficiencies_path).name if e.efficiencies_path else None
    if e.engine_family is not EngineFamily.VLLM:
        return [f"{e.engine_family} defaults and constants" + (f", {name}'s over them" if name else "")]
    return [f"{name}'s constants over vllm's"] if name else []


def _host_words(engine: Engine) -> list[str]:
    """The engine core's host time per step and per scheduled sequence, when the roofline
    is the step time (a fitted twin's step-time model carries its own)."""
    costs = engine.host_costs
    if costs is None:
        return []
    step_s, seq_s = costs
    steps = engine.limits.num_scheduler_steps
    per = f"{steps}-step schedule" if steps > 1 else "step"  # multi-step: paid once per group
    return [f"host {step_s * 1e3:g} ms/{per} + {seq_s * 1e6:g} us/scheduled sequence"]


def _front_end_words(engine: Engine) -> str:
    """The API front end as modelled: latency, intake and streaming CPU, servers, host."""
    fe, c = engine.front_end, engine.front_end.costs
    words = f"API {c.latency_s * 1e3:g} ms"
    if fe.costs.queues:
        cpu = [f"intake {c.intake_s * 1e3:g} ms + {c.intake_per_token_s * 1e6:g} us/prompt token"] if c.intake_s or c.intake_per_token_s else []
        cpu += [f"{c.stream_per_token_s * 1e6:g} us/streamed token"] if c.stream_per_token_s else []
        cpu += [f"{c.stream_per_step_s * 1e6:g} us/step streamed"] if c.stream_per_step_s else []
        words += f" + CPU queue ({', '.join(cpu)}"
        words += f"; {fe.servers} API servers" if fe.servers > 1 else ""
        words += f"; host speed {fe.host_speed:g}" if fe.host_speed != 1.0 else ""
        words += ")"
    if not c.stream_per_token_s:
        words += " + per-token streaming in the engine step"
    return words


def prediction_lines(summary: Summary) -> list[tuple[str, str]]:
    """Each headline metric beside the validation error of its engine family and regime
    (summary.json's ``prediction``): '42.1 ms, ±25 % on 6 held-out vLLM V1 Poisson rows'."""
    block = summary.prediction
    if not isinstance(block, dict):
        return []
    bands = block["error_bands"]
    rows: list[tuple[str, str]] = []
    for key, label, unit in (
        ("ttft_ms", "TTFT p50", "ms"), ("tpot_ms", "TPOT p50", "ms"), ("e2e_ms", "E2E p50", "ms"),
        ("output_token_throughput_tps", "output tok/s", ""),
    ):
        value = getattr(summary, key)
        if value is None:
            continue
        number = value if isinstance(value, float) else value.p50
        band = bands.get(key)
        how = band["text"] if band else unvalidated_why(block)
        rows.append((f"{label} (prediction)", f"{number:,.1f}{' ' + unit if unit else ''}, {how}"))
    return rows
