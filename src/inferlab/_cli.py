"""The ``inferlab`` command: parse flags → frozen config → library call → render.

Usage errors exit 2 with one line; runtime failures exit 1 with one line. Environment
variables ``INFERLAB_<COMMAND>_<OPTION>`` (e.g. ``INFERLAB_BENCH_URL``) set any option;
flags win over them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.console import Console

from inferlab._bench import BenchConfig, WorkloadConfig, bench_async, install_stop_signals
from inferlab._clock import WallClock
from inferlab._errors import InferlabError, RunFailedError, UsageError
from inferlab._metrics import SLO
from inferlab._report import Progress, render_summary
from inferlab._runner import LoadConfig
from inferlab._schedule import ClosedLoop, OpenLoop, Replay, Schedule
from inferlab._traces import TraceConfig
from inferlab.sim._engine import EngineConfig
from inferlab.sim._server import ServerConfig

DEFAULT_CONCURRENCY = 32


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"inferlab: error: {message}", err=True)
    sys.exit(code)


def _run_guarded(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except UsageError as e:
        _fail(str(e), 2)
    except InferlabError as e:
        _fail(str(e), 1)
    except ValueError as e:  # engine/config validation
        _fail(str(e), 2)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "INFERLAB"})
@click.version_option(package_name="inferlab")
def main() -> None:
    """Measure, explain and predict the latency and throughput of LLM inference servers."""


def _parse_rate(value: str | None) -> float | None:
    if value is None:
        return None
    if value.lower() in ("inf", "infinity"):
        return math.inf
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number or 'inf'") from None


def _headers(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for h in values:
        name, sep, val = h.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{h!r} is not 'Name: value'", param_hint="--header")
        out.append((name.strip(), val.strip()))
    return tuple(out)


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Load, workload and output flags shared by ``bench`` and ``sim run``."""
    opts = [
        click.option("-c", "--concurrency", type=int, help=f"Closed loop: this many users. Default {DEFAULT_CONCURRENCY} unless --rate is given."),
        click.option("-r", "--rate", help="Open loop: requests per second ('inf' sends all at once)."),
        click.option("--arrival", type=click.Choice(["poisson", "constant", "gamma"]), default="poisson", show_default=True),
        click.option("--burstiness", type=float, default=1.0, show_default=True, help="Gamma shape: <1 burstier, 1 Poisson, >1 smoother."),
        click.option("--max-concurrency", type=int, help="Open loop: cap on requests in flight."),
        click.option("-n", "--num-requests", type=int, help="Measured requests. Default 32 unless --duration is given."),
        click.option("-d", "--duration", type=float, help="Stop sending after this many seconds."),
        click.option("--warmup", type=int, default=0, show_default=True, help="Requests sent first and left out of the metrics."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--input-tokens", help="Synthetic prompts of this many tokens: N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA."),
        click.option("--output-tokens", help="max_tokens per request (same forms as --input-tokens)."),
        click.option("--prefix-groups", type=int, help="Shared-prefix workload: this many groups (default 1 with --prefix-tokens)."),
        click.option("--prefix-tokens", type=int, help="Shared-prefix workload: tokens in each group's prefix."),
        click.option("--suffix-tokens", help="Shared-prefix workload: each request's own tokens after the prefix (default 64)."),
        click.option("--prefix-popularity", default="uniform", show_default=True, help="Group popularity: uniform, zipf or zipf:A."),
        click.option("--trace", type=click.Path(dir_okay=False), help="Replay a trace at its timestamps: inferlab JSONL, Azure CSV, BurstGPT CSV or Mooncake JSONL."),
        click.option("--trace-format", type=click.Choice(["inferlab", "azure", "burstgpt", "mooncake"]), help="Trace format (default: detected from the header or keys)."),
        click.option("--speedup", type=float, default=1.0, show_default=True, help="Replay the trace this many times faster."),
        click.option("--trace-start", type=float, help="Replay from this many seconds into the trace."),
        click.option("--trace-end", type=float, help="Replay up to this many seconds into the trace."),
        click.option("--tokenizer", type=click.Path(exists=False), help="Local tokenizer.json (or a directory with one): exact prompt lengths."),
        click.option("--token-ids/--no-token-ids", default=True, show_default=True, help="With --tokenizer, send token-id prompts on the completions API."),
        click.option("--prompt", help="Send this prompt every time (default: 'Explain RAG in about 30 characters.')."),
        click.option("--exact-output/--no-exact-output", default=True, show_default=True, help="Send ignore_eos and min_tokens so output length is exact."),
        click.option("--slo-ttft-ms", type=float, help="Goodput SLO on TTFT."),
        click.option("--slo-tpot-ms", type=float, help="Goodput SLO on TPOT."),
        click.option("--slo-e2e-ms", type=float, help="Goodput SLO on E2E."),
        click.option("-o", "--out", type=click.Path(file_okay=False), help="Write summary.json, requests.jsonl and config.json here."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _load_config(kw: dict[str, Any]) -> LoadConfig:
    if kw["concurrency"] is not None and kw["rate"] is not None:
        raise UsageError("--concurrency and --rate are exclusive (use --max-concurrency with --rate)")
    rate = _parse_rate(kw["rate"])
    schedule: Schedule
    if kw["trace"]:
        if kw["concurrency"] is not None or rate is not None:
            raise UsageError("--trace sends at the trace's times: drop --concurrency/--rate (use --speedup)")
        schedule = Replay(kw["max_concurrency"])
        return LoadConfig(schedule, kw["num_requests"], kw["duration"], kw["warmup"], kw["seed"])
    for flag in ("trace_format", "trace_start", "trace_end"):
        if kw[flag] is not None:
            raise UsageError(f"--{flag.replace('_', '-')} needs --trace")
    if rate is not None:
        schedule = OpenLoop(rate, kw["arrival"], kw["burstiness"], kw["max_concurrency"])
    else:
        c = kw["concurrency"]
        schedule = ClosedLoop(DEFAULT_CONCURRENCY if c is None else c)
    num = kw["num_requests"]
    if num is None and kw["duration"] is None:
        num = 32
    return LoadConfig(schedule, num, kw["duration"], kw["warmup"], kw["seed"])


def _slo(kw: dict[str, Any]) -> SLO | None:
    if all(kw[k] is None for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms")):
        return None
    return SLO(kw["slo_ttft_ms"], kw["slo_tpot_ms"], kw["slo_e2e_ms"])


def _workload_config(kw: dict[str, Any]) -> WorkloadConfig:
    trace = None
    if kw["trace"]:
        trace = TraceConfig(kw["trace"], kw["trace_format"], kw["speedup"], kw["trace_start"], kw["trace_end"])
    return WorkloadConfig(
        input_tokens=kw["input_tokens"],
        output_tokens=kw["output_tokens"],
        prompt=kw["prompt"],
        exact_output=kw["exact_output"],
        prefix_groups=kw["prefix_groups"],
        prefix_tokens=kw["prefix_tokens"],
        suffix_tokens=kw["suffix_tokens"],
        prefix_popularity=kw["prefix_popularity"],
        trace=trace,
        tokenizer=kw["tokenizer"],
        token_ids=kw["token_ids"],
    )


@main.command()
@click.option("--url", help="OpenAI-compatible server (e.g. http://127.0.0.1:8000). Default: the embedded simulated server.")
@click.option("--model", help="Model name to request. Default: the first one the server lists.")
@click.option("--api", type=click.Choice(["chat", "completions"]), default="chat", show_default=True)
@click.option("--stream/--no-stream", default=True, show_default=True, help="Streaming (all metrics) or not (E2E only).")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token [env: OPENAI_API_KEY].")
@click.option("-H", "--header", "header", multiple=True, help="Extra request header 'Name: value' (repeatable).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Per-request total timeout, seconds.")
@click.option("--idle-timeout", type=float, default=60.0, show_default=True, help="Max seconds without data mid-response.")
@load_options
def bench(**kw: Any) -> None:
    """Load an OpenAI-compatible endpoint and report TTFB, TTFT, TPOT, ITL, E2E, tokens/s, TPM."""
    sys.exit(_run_guarded(lambda: _bench(kw)))


def _bench(kw: dict[str, Any]) -> int:
    load = _load_config(kw)
    num = load.num_requests
    config = BenchConfig(
        load=load,
        workload=_workload_config(kw),
        url=kw["url"],
        model=kw["model"],
        api=kw["api"],
        stream=kw["stream"],
        api_key=kw["api_key"],
        headers=_headers(kw["header"]),
        timeout_s=kw["timeout"],
        idle_timeout_s=kw["idle_timeout"],
        slo=_slo(kw),
        out_dir=kw["out"],
    )
    err = Console(stderr=True)
    out = Console()
    embedded = None
    url = config.url
    if url is None:
        from inferlab.sim._server import ChildServer

        embedded = ChildServer(["--tokenizer", kw["tokenizer"]] if kw["tokenizer"] else [])
        url = embedded.url
        d = EngineConfig()
        err.print(f"[dim]no --url: simulated {d.model} on {d.gpu} (vLLM defaults, --enforce-eager) at {url}[/dim]")
    try:
        total = (num + config.load.warmup) if num else None
        with Progress(err, WallClock(), total) as progress:
            summary = asyncio.run(_bench_main(config, url, progress))
    except RunFailedError as e:
        if e.summary is not None:
            _render(out, e.summary, kw["as_json"], config, url)
        raise
    finally:
        if embedded is not None:
            embedded.close()
    _render(out, summary, kw["as_json"], config, url)
    if summary["interrupted"]:
        return 130
    return 0


async def _bench_main(config: BenchConfig, url: str, progress: Progress) -> dict[str, Any]:
    stop = asyncio.Event()
    install_stop_signals(stop)
    result = await bench_async(config, url, on_record=progress.update, stop=stop)
    return result.summary


def _render(out: Console, summary: dict[str, Any], as_json: bool, config: BenchConfig, url: str) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    model = summary["config"].get("resolved", {}).get("model", "?")
    render_summary(out, summary, f"inferlab bench · {model} @ {url}")
    if config.out_dir:
        out.print(f"results: {config.out_dir}/summary.json, {config.out_dir}/requests.jsonl")


@main.group()
def sim() -> None:
    """The simulated inference engine (vLLM-like scheduler on a roofline cost model)."""


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's engine flags, with the common vLLM example as defaults."""
    d = EngineConfig()
    opts = [
        click.option("--model", default=d.model, show_default=True, help="Preset name, HF id, or a config.json path."),
        click.option("--gpu", default=d.gpu, show_default=True, help="H100, H200, A100, L40S, RTX4090, or a JSON file."),
        click.option("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size, show_default=True),
        click.option("--max-model-len", type=int, default=d.max_model_len, show_default=True),
        click.option("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization, show_default=True),
        click.option("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, show_default=True),
        click.option("--max-num-seqs", type=int, default=d.max_num_seqs, show_default=True),
        click.option("--block-size", type=int, default=d.block_size, show_default=True),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=d.enable_prefix_caching, show_default=True),
        click.option("--enable-chunked-prefill/--no-enable-chunked-prefill", default=d.enable_chunked_prefill, show_default=True),
        click.option("--enforce-eager/--no-enforce-eager", default=True, show_default=True, help="Eager mode (no CUDA graphs): more CPU time per step."),
        click.option("--dtype", default=d.dtype, show_default=True, type=click.Choice(["auto", "bfloat16", "float16", "half"])),
        click.option("--quantization", "-q", type=click.Choice(["fp8", "int8", "awq", "gptq"]), default=None),
        click.option("--kv-cache-dtype", default=d.kv_cache_dtype, show_default=True, type=click.Choice(["auto", "fp8"])),
        click.option("--efficiencies", "efficiencies_path", type=click.Path(dir_okay=False), help="JSON file overriding step-time constants."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def engine_config(kw: dict[str, Any]) -> EngineConfig:
    keys = [f.name for f in EngineConfig.__dataclass_fields__.values()]
    values = {k: kw[k] for k in keys if k in kw}
    if values.get("dtype") == "half":
        values["dtype"] = "float16"
    return EngineConfig(**values)


@sim.command()
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-model-name", help="Name the API answers to (default: --model).")
@click.option("--max-waiting-requests", type=int, default=4096, show_default=True, help="Queue length beyond which requests get HTTP 429.")
@click.option("--tokenizer", type=click.Path(exists=False), help="Count tokens with this local tokenizer.json (or a directory with one).")
@click.option("--announce", is_flag=True, hidden=True, help="Print the base URL on stdout once listening (for a parent process).")
def serve(**kw: Any) -> None:
    """Serve the simulated engine over the OpenAI API, in real time."""
    sys.exit(_run_guarded(lambda: _serve(kw)))


def _serve(kw: dict[str, Any]) -> int:
    from inferlab.sim._server import SimServer, start_site

    config = ServerConfig(
        engine_config(kw), kw["served_model_name"], kw["max_waiting_requests"], tokenizer=kw["tokenizer"]
    )
    server = SimServer(config)

    async def main_async() -> None:
        runner, port = await start_site(server, kw["host"], kw["port"])
        if kw["announce"]:
            print(f"http://{kw['host']}:{port}", flush=True)
        e = config.engine
        click.echo(
            f"inferlab sim: {e.model} on {e.tensor_parallel_size}x {e.gpu}, "
            f"KV cache {server.engine.kv_capacity_tokens:,} tokens, "
            f"serving http://{kw['host']}:{port}/v1 (Ctrl-C stops)",
            err=True,
        )
        stop = asyncio.Event()
        install_stop_signals(stop)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main_async())
    except OSError as e:
        raise InferlabError(f"cannot serve on {kw['host']}:{kw['port']}: {e.strerror or e}") from e
    return 0


@sim.command("run")
@engine_options
@load_options
@click.option("--api", type=click.Choice(["chat", "completions"]), default="completions", show_default=True, help="chat applies the chat template to prompts.")
@click.option("--step-log", type=click.Path(dir_okay=False), help="Write one JSON line per engine step (batch, prefill/decode tokens, KV usage, preemptions).")
def run_cmd(**kw: Any) -> None:
    """Run a workload through the simulated engine in virtual time (no HTTP)."""
    sys.exit(_run_guarded(lambda: _sim_run(kw)))


def _sim_run(kw: dict[str, Any]) -> int:
    from inferlab._metrics import summarize
    from inferlab._results import RunWriter
    from inferlab._tokenizers import load_tokenizer
    from inferlab.sim._engine import Engine
    from inferlab.sim._simrun import simulate

    load = _load_config(kw)
    engine_cfg = engine_config(kw)
    engine = Engine(engine_cfg)
    workload = _workload_config(kw).build(load.seed, kw["api"])
    tokenizer = load_tokenizer(kw["tokenizer"]) if kw["tokenizer"] else None
    config_json = {
        "command": "sim run",
        "engine": dataclasses.asdict(engine_cfg),
        "load": {**dataclasses.asdict(load), "schedule": {"kind": type(load.schedule).__name__, **dataclasses.asdict(load.schedule)}},
        "workload": dataclasses.asdict(_workload_config(kw)),
        "api": kw["api"],
        "trace": kw["trace"],
    }
    config_json = json.loads(json.dumps(config_json, default=str))
    writer = RunWriter(kw["out"], config_json) if kw["out"] else None
    step_log = open(kw["step_log"], "w") if kw["step_log"] else None  # noqa: SIM115
    try:
        records = simulate(
            engine, load, workload, chat=kw["api"] == "chat", step_log=step_log,
            on_record=writer.append if writer else None, tokenizer=tokenizer,
        )
        summary = summarize(records, config=config_json, slo=_slo(kw))
        if writer is not None:
            writer.write_summary(summary)
    finally:
        if writer is not None:
            writer.close()
        if step_log is not None:
            step_log.close()
    if kw["as_json"]:
        click.echo(json.dumps(summary, indent=2))
    else:
        out = Console()
        e = engine_cfg
        render_summary(out, summary, f"inferlab sim run · {e.model} on {e.tensor_parallel_size}x {e.gpu} (virtual time)")
        if kw["out"]:
            out.print(f"results: {kw['out']}/summary.json, {kw['out']}/requests.jsonl")
    return 0


if __name__ == "__main__":
    main()
