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
from inferlab._datasets import DatasetConfig, DatasetWorkload
from inferlab._errors import InferlabError, RunFailedError, UsageError
from inferlab._metrics import SLO
from inferlab._report import Progress, render_summary
from inferlab._runner import LoadConfig
from inferlab._schedule import ClosedLoop, OpenLoop, Replay, Schedule
from inferlab._sessions import SessionWorkload
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
        click.option("--input-tokens", help="Synthetic prompts of this many tokens: N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEDIAN:SIGMA or empirical:DATASET (its prompts' lengths in words)."),
        click.option("--output-tokens", help="max_tokens per request (same forms as --input-tokens; empirical:DATASET draws its answers' lengths)."),
        click.option("--prefix-groups", type=int, help="Shared-prefix workload: this many groups (default 1 with --prefix-tokens)."),
        click.option("--prefix-tokens", type=int, help="Shared-prefix workload: tokens in each group's prefix."),
        click.option("--suffix-tokens", help="Shared-prefix workload: each request's own tokens after the prefix (default 64)."),
        click.option("--prefix-popularity", default="uniform", show_default=True, help="Group popularity: uniform, zipf or zipf:A."),
        click.option("--trace", type=click.Path(dir_okay=False), help="Replay a trace at its timestamps: inferlab JSONL, Azure CSV, BurstGPT CSV or Mooncake JSONL."),
        click.option("--trace-format", type=click.Choice(["inferlab", "azure", "burstgpt", "mooncake"]), help="Trace format (default: detected from the header or keys)."),
        click.option("--speedup", type=float, default=1.0, show_default=True, help="Replay the trace this many times faster."),
        click.option("--trace-start", type=float, help="Replay from this many seconds into the trace."),
        click.option("--trace-end", type=float, help="Replay up to this many seconds into the trace."),
        click.option("--dataset", type=click.Path(dir_okay=False), help="Prompts from a file: JSONL (prompt or messages, optional max_tokens), ShareGPT JSON or CSV (prompt column)."),
        click.option("--dataset-format", type=click.Choice(["jsonl", "sharegpt", "csv"]), help="Dataset format (default: from the extension and content)."),
        click.option("--sample", type=click.Choice(["with-replacement", "without-replacement"]), default="without-replacement", show_default=True, help="Dataset sampling; without replacement stops when every prompt was sent once."),
        click.option("--min-input-tokens", type=int, help="Dataset: skip prompts shorter than this (tokens with --tokenizer, else words)."),
        click.option("--max-input-tokens", type=int, help="Dataset: skip prompts longer than this (tokens with --tokenizer, else words)."),
        click.option("--sessions", type=int, help="Multi-turn: this many sessions (closed loop: -c users, default one per session; with --rate: sessions arrive at that rate)."),
        click.option("--turns", type=int, default=4, show_default=True, help="Multi-turn: turns per session; each turn adds --input-tokens of new user text."),
        click.option("--think-time-s", type=float, default=0.0, show_default=True, help="Multi-turn: seconds between an answer and the next turn."),
        click.option("--system-tokens", type=int, default=0, show_default=True, help="Multi-turn: a system prompt of this many tokens, shared by all sessions."),
        click.option("--context-window-tokens", type=int, help="Multi-turn: keep the system prompt and at most this many tokens of history (sliding window)."),
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
        schedule = ClosedLoop((kw["sessions"] or DEFAULT_CONCURRENCY) if c is None else c)
    num = kw["num_requests"]
    if kw["sessions"] is not None and num is None:
        num = kw["sessions"] * kw["turns"]
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
    dataset = None
    if kw["dataset"]:
        dataset = DatasetConfig(kw["dataset"], kw["dataset_format"], kw["sample"], kw["min_input_tokens"], kw["max_input_tokens"])
    else:
        for flag in ("dataset_format", "min_input_tokens", "max_input_tokens"):
            if kw[flag] is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --dataset")
    if kw["sessions"] is None and kw["context_window_tokens"] is not None:
        raise UsageError("--context-window-tokens needs --sessions")
    return WorkloadConfig(
        sessions=kw["sessions"],
        turns=kw["turns"],
        think_time_s=kw["think_time_s"],
        system_tokens=kw["system_tokens"],
        context_window_tokens=kw["context_window_tokens"],
        dataset=dataset,
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
@click.option("--preflight/--no-preflight", default=True, show_default=True, help="Probe the server first (not counted): fail fast on 401/403/404, detect ignore_eos support, measure template overhead, calibrate prompt lengths.")
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
        preflight=kw["preflight"],
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


def _text_arg(value: str | None, flag: str) -> str | None:
    """``TEXT`` as given, or ``@FILE``'s contents."""
    if value is None or not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {value}: {getattr(e, 'strerror', None) or e}") from e


@main.command()
@click.option("--system", help="System prompt: TEXT or @FILE.")
@click.option("--prompt", help="User prompt: TEXT or @FILE.")
@click.option("--dataset", type=click.Path(dir_okay=False), help="A prompt set (JSONL, ShareGPT JSON or CSV, as for bench); --system is added to each prompt that has none.")
@click.option("--dataset-format", type=click.Choice(["jsonl", "sharegpt", "csv"]))
@click.option("--tokenizer", type=click.Path(exists=False), help="Local tokenizer.json (or its directory). Default: the simulator's built-in tokenizer.")
@click.option("--prefill-tps", type=float, help="Prefill rate in tokens/s for the TTFT cost. Default: one prefill on the simulator (--model/--gpu).")
@click.option("--model", default=EngineConfig.model, show_default=True, help="Simulated model for the TTFT cost.")
@click.option("--gpu", default=EngineConfig.gpu, show_default=True, help="Simulated GPU for the TTFT cost.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def tokens(**kw: Any) -> None:
    """What the system prompt, user content and chat template cost in tokens and TTFT."""
    sys.exit(_run_guarded(lambda: _tokens(kw)))


def _tokens(kw: dict[str, Any]) -> int:
    from inferlab._datasets import read_dataset
    from inferlab._tokencost import rate_prefill, sim_prefill, token_cost
    from inferlab._tokenizers import load_tokenizer
    from inferlab._workload import RequestSpec
    from inferlab.sim._tokenizer import BuiltinTokenizer

    system = _text_arg(kw["system"], "--system")
    prompt = _text_arg(kw["prompt"], "--prompt")
    if kw["dataset"] and prompt is not None:
        raise UsageError("--prompt and --dataset cannot be combined")
    if kw["dataset"]:
        specs = [r.spec(None, False) for r in read_dataset(kw["dataset"], kw["dataset_format"])]
        specs = [dataclasses.replace(s, system=s.system or system) for s in specs]
    elif prompt is not None or system is not None:
        specs = [RequestSpec(prompt or "", system=system)]
    else:
        raise UsageError("give --prompt, --system or --dataset")
    tok = load_tokenizer(kw["tokenizer"]) if kw["tokenizer"] else BuiltinTokenizer()
    if kw["prefill_tps"] is not None:
        if not kw["prefill_tps"] > 0:
            raise UsageError("--prefill-tps must be positive")
        prefill, source = rate_prefill(kw["prefill_tps"]), f"{kw['prefill_tps']:g} tokens/s"
    else:
        prefill, source = sim_prefill(kw["model"], kw["gpu"]), f"simulated {kw['model']} on {kw['gpu']}"
    cost = token_cost(specs, tok, prefill, source)
    if kw["as_json"]:
        click.echo(json.dumps({**cost.to_json(), "tokenizer": kw["tokenizer"] or "built-in (simulator)"}, indent=2))
        return 0
    from rich.table import Table

    per = " (mean per prompt)" if cost.prompts > 1 else ""
    table = Table(title=f"inferlab tokens · {cost.prompts} prompt(s){per}", title_justify="left", header_style="bold")
    table.add_column("part")
    table.add_column("tokens", justify="right")
    table.add_column("share", justify="right")
    for label, n in (("system prompt", cost.system_tokens), ("user content", cost.user_tokens),
                     ("chat template", cost.template_tokens), ("total", cost.total_tokens)):
        table.add_row(label, f"{n:,.1f}", f"{n / cost.total_tokens:.1%}" if cost.total_tokens else "—")
    out = Console()
    out.print(table)
    out.print(f"system + template share: {cost.overhead_share:.1%}")
    if cost.ttft_ms is not None and cost.ttft_user_only_ms is not None:
        out.print(
            f"prefill TTFT ({source}): {cost.ttft_ms:,.2f} ms; user content alone {cost.ttft_user_only_ms:,.2f} ms; "
            f"system + template cost {cost.ttft_saved_ms:,.2f} ms per uncached request"
        )
    return 0


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
        if isinstance(workload, SessionWorkload):
            from inferlab.sim._simsessions import simulate_sessions

            s = load.schedule
            records = simulate_sessions(
                engine, load, workload, users=s.concurrency if isinstance(s, ClosedLoop) else 1,
                chat=kw["api"] == "chat", tokenizer=tokenizer, on_record=writer.append if writer else None,
            )
        else:
            records = simulate(
                engine, load, workload, chat=kw["api"] == "chat", step_log=step_log,
                on_record=writer.append if writer else None, tokenizer=tokenizer,
            )
        summary = summarize(records, config=config_json, slo=_slo(kw))
        if isinstance(workload, DatasetWorkload):
            summary["warnings"] += workload.warnings()
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
