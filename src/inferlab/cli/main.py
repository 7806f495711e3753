"""The ``inferlab`` command: parse flags → frozen config → library call → render.

Usage errors exit 2 with one line; runtime failures exit 1 with one line. Environment
variables ``INFERLAB_<COMMAND>_<OPTION>`` (e.g. ``INFERLAB_BENCH_URL``) set any option;
flags win over them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from typing import Any

import click
from rich.console import Console

from inferlab._clock import WallClock
from inferlab._errors import RunFailedError, UsageError
from inferlab._loop import run as run_loop
from inferlab.cli.advise import advise_command
from inferlab.cli.calibrate import calibrate_cmd
from inferlab.cli.common import (
    NAMES_GIVEN,
    FloatRange,
    OneNamePerSetting,
    bench_load_options,
    console,
    entry,
    extra_body_option,
    finish_run,
    given,
    http_options,
    install_stop_signals,
    load_config,
    parse_headers,
    run_guarded,
    server_metrics_options,
    slo_config,
    table_percentiles,
    workload_config,
)
from inferlab.cli.engine import engine
from inferlab.cli.export import export
from inferlab.cli.gateway import gateway
from inferlab.cli.history import runs
from inferlab.cli.locust import locust_merge
from inferlab.cli.profile import profile_command
from inferlab.cli.report import compare_cmd, report_cmd
from inferlab.cli.sim import sim
from inferlab.cli.sweep import sweep
from inferlab.cli.tokens import tokens
from inferlab.cli.tune import tune
from inferlab.load.run import BenchConfig, RunResult, bench_async, metrics_pages
from inferlab.report.console import Progress, render_summary
from inferlab.results.runfiles import check_out_dir, dumps, write_summary
from inferlab.results.summary import Summary
from inferlab.sim.engine.engine import EngineConfig


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "INFERLAB"})
@click.version_option(package_name="inferlab")
def main() -> None:
    """Measure, explain and predict the latency and throughput of LLM inference servers."""


@main.command(cls=OneNamePerSetting)
@click.option("--url", "--base-url", "url", help="OpenAI-compatible server (e.g. http://127.0.0.1:8000). Default: the embedded simulated server. --base-url: vLLM's name.")
@click.option("--model", help="Model name to request. Default: the first one the server lists. Without --url: the model the built-in simulator serves (a preset name or HF id).")
@click.option("--api", type=click.Choice(["chat", "completions"]), default="chat", show_default=True, help="The API requests are sent on. On a vllm bench serve line (--num-prompts, --request-rate, --backend, ...) the default is vLLM's: completions (its default --backend openai).")
@http_options
@server_metrics_options
@click.option("--engine", "engine_config", type=click.Path(dir_okay=False), help="Start this engine first (a TOML/JSON file, as for inferlab engine start), measure it, stop it.")
@click.option("--temperature", type=FloatRange(min=0, finite=True), help="Sampling temperature sent with every request (default: none sent, the server's default applies). Output lengths stay exact unless --no-exact-output.")
@click.option("--extra-body", callback=extra_body_option, metavar="JSON|@FILE", help="A JSON object merged into every request body, as vLLM's --extra-body (e.g. '{\"top_p\": 0.9, \"seed\": 1}'); fields the run sets itself (model, messages/prompt, max_tokens, min_tokens, ignore_eos, stream, n) are refused. Recorded in config.json.")
@bench_load_options
def bench(**kw: Any) -> None:
    """Load an OpenAI-compatible endpoint and report TTFB, TTFT, TPOT, ITL, E2E, tokens/s, TPM.

    A command line that uses vllm bench serve's own names (--num-prompts, --request-rate,
    --num-warmups, --random-input-len, --random-output-len, --ignore-eos, --base-url,
    --backend, --endpoint, ...) runs as vLLM would run it: vLLM's default API
    (completions) unless --api or --backend says otherwise, and its random dataset's
    1,024/128 lengths where no workload is given, drawn as vLLM draws them with
    --random-range-ratio and after one shared prefix with --random-prefix-len; what was
    mapped is said on stderr."""
    sys.exit(run_guarded(lambda: _bench(kw)))


def _bench(kw: dict[str, Any]) -> int:
    kw = _as_typed(kw)
    load = load_config(kw)
    num = load.num_requests
    config = BenchConfig(
        load=load,
        workload=workload_config(kw),
        url=kw["url"],
        model=kw["model"],
        api=kw["api"],
        stream=kw["stream"],
        api_key=kw["api_key"],
        headers=parse_headers(kw["header"]),
        timeout_s=kw["timeout"],
        idle_timeout_s=kw["idle_timeout"],
        slo=slo_config(kw),
        out_dir=kw["out"],
        preflight=kw["preflight"],
        overwrite=kw["overwrite"],
        workers=kw["workers"],
        server_metrics=kw["server_metrics"],
        metrics_urls=tuple(kw["metrics_urls"]),
        http_client=kw["http_client"],
        extra_body=_sampling(kw["temperature"], kw["extra_body"]),
    )
    if config.out_dir is not None:
        check_out_dir(config.out_dir, config.overwrite)  # before a server is started
    if config.metrics_urls and kw["url"] is None:
        raise UsageError("--metrics-url needs --url: a server bench starts itself (the embedded simulator, --engine) "
                         "has its own /metrics read already")
    metrics_pages(config.metrics_urls, config.server_metrics)  # (likewise)
    err = console(stderr=True)
    out = console()
    embedded = None
    url = config.url
    started = None
    if kw["engine_config"]:
        if url is not None:
            raise UsageError("--engine starts the server to measure: give --engine or --url, not both")
        from inferlab.cli.engine import recorded_spec, start_engine

        config.workload.build(config.load.seed, config.api)  # bad flags or files: fail before starting
        started = start_engine(kw["engine_config"], f"{config.out_dir}/engine.log" if config.out_dir else None)
        url = started.url
        # (config.json's url: the engine's, null being the embedded simulator; and the config it was started from)
        config = dataclasses.replace(config, url=url, engine_config=recorded_spec(started.spec))
    elif url is None:
        from inferlab.cli.sim import SERVE_DEFAULTS
        from inferlab.sim.engine.hardware import resolve_model
        from inferlab.sim.server.launch import ChildServer

        config.workload.build(config.load.seed, config.api)  # bad flags or files: fail before starting
        # (inferlab sets this server up: it says its cached tokens, which vLLM's default hides)
        args = ["--enable-prompt-tokens-details", *(["--tokenizer", kw["tokenizer"]] if kw["tokenizer"] else [])]
        model = EngineConfig().model
        gpu = os.environ.get("INFERLAB_SIM_SERVE_GPU") or EngineConfig().gpu  # what the server will use
        tp = 1
        if kw["model"]:
            context = resolve_model(kw["model"]).max_position_embeddings  # UsageError naming the known models
            model = kw["model"]
            max_len = min(SERVE_DEFAULTS["max_model_len"], context)  # a 2K-context model gets 2,048
            tp = _embedded_tp(model, gpu, max_len)
            args += ["--model", model, "--tensor-parallel-size", str(tp), "--max-model-len", str(max_len)]
        embedded = ChildServer(args)
        url = embedded.url
        click.echo(f"inferlab: no --url, simulating {model} on {tp}x {gpu} at {url} (numbers are a prediction)", err=True)
    gone: str | None = None  # (the engine --engine started, exited before the run ended)
    try:
        total = (num + config.load.warmup) if num else None
        with Progress(err, WallClock(), total) as progress:
            result = run_loop(_bench_main(config, url, progress))
        gone = started.exited() if started is not None else None
        result = finish_run(_said(result, gone, kw), kw)
    except RunFailedError as e:  # every request failed: what they said is shown first
        gone = started.exited() if started is not None else None
        if isinstance(e.result, RunResult):
            e.result = finish_run(_said(e.result, gone, kw), kw)
            e.summary = e.result.summary
        if isinstance(e.summary, Summary):
            _render(out, e.summary, kw, config, url)
        if gone is not None:
            raise RunFailedError(gone) from None
        raise
    finally:
        if embedded is not None:
            embedded.close()
        if started is not None:
            started.stop()
    _render(out, result.summary, kw, config, url)
    if gone is not None:  # (what it measured is kept, said, and the run fails; the engine's exit says why)
        raise RunFailedError(gone)
    if result.cause is not None:  # (e.g. the server stopped answering)
        raise result.cause
    return 130 if result.interrupted else 0


def _as_typed(kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with a vllm bench serve line's API and lengths as vLLM runs them
    (``cli.vllmcompat``); what was mapped is said on stderr."""
    from inferlab.cli.vllmcompat import resolve

    names = click.get_current_context().meta.get(NAMES_GIVEN, frozenset())
    line = resolve(kw, names, given("api"))
    for said in line.said:
        click.echo(f"inferlab: {said}", err=True)
    typed = {**kw, "api": line.api, "input_tokens": line.input_tokens, "output_tokens": line.output_tokens}
    if line.prefix_tokens is not None:  # (vLLM's --random-prefix-len)
        typed.update(prefix_tokens=line.prefix_tokens, suffix_tokens=line.suffix_tokens)
    return typed


def _said(result: RunResult, gone: str | None, kw: dict[str, Any]) -> RunResult:
    """``result`` with a warning that the engine ``--engine`` started exited during the
    run (``gone``: its status and last log lines), in summary.json too: the requests after
    it failed on the engine's absence, not on the load."""
    if gone is None:
        return result
    summary = dataclasses.replace(result.summary, warnings=(*result.summary.warnings, gone))
    if kw.get("out"):
        write_summary(kw["out"], summary)
    return dataclasses.replace(result, summary=summary)


def _sampling(temperature: float | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    """What every request carries beyond the run's own fields: ``--extra-body``, and
    ``--temperature`` (given both ways: refused, rather than one silently winning)."""
    body = dict(extra or {})
    if temperature is not None:
        if "temperature" in body:
            raise UsageError("--temperature and --extra-body's \"temperature\" both given: give one")
        body["temperature"] = temperature
    return body


async def _bench_main(config: BenchConfig, url: str, progress: Progress) -> RunResult:
    stop = asyncio.Event()
    install_stop_signals(stop)
    return await bench_async(config, url, on_record=progress.update, stop=stop)


def _render(out: Console, summary: Summary, kw: dict[str, Any], config: BenchConfig, url: str) -> None:
    if kw["as_json"]:
        click.echo(dumps(summary.to_json()))
        return
    model = summary.config.get("resolved", {}).get("model", "?")
    # a simulated server by name, its numbers labelled (the embedded one's port is a throwaway)
    # (a measured server with what it said it is: "vLLM 0.11.0"; inferlab gateway in front
    # of what its upstreams said they are, with its setup)
    server = summary.server
    where = (server.label if server.simulated or server.gateway else f"{url} ({server.software})" if server.software
             else url)
    render_summary(out, summary, f"{model} @ {where}", table_percentiles(kw))
    if config.out_dir:
        out.print(f"results: {config.out_dir}/summary.json, {config.out_dir}/requests.jsonl")




sim.add_command(calibrate_cmd)
main.add_command(engine)
main.add_command(sim)
main.add_command(export)
main.add_command(locust_merge)
main.add_command(tokens)
main.add_command(sweep)
main.add_command(tune)
main.add_command(profile_command)
main.add_command(advise_command)
main.add_command(runs)
main.add_command(compare_cmd)
main.add_command(report_cmd)
main.add_command(gateway)

def run() -> None:
    """The console script."""
    entry(main)


def _embedded_tp(model: str, gpu: str, max_model_len: int) -> int:
    """The fewest GPUs (1, 2, 4, 8) the embedded server needs to hold ``model`` with room
    for a KV cache, as a user would pick ``--tensor-parallel-size`` (on the GPU the server
    will use, ``gpu``); ``UsageError`` when 8 are not
    enough, since bench has no flag to change that."""
    from inferlab.cli.sim import SERVE_DEFAULTS
    from inferlab.sim.engine.engine import Engine

    why = ""
    for tp in (1, 2, 4, 8):
        try:
            Engine(EngineConfig(model=model, gpu=gpu, tensor_parallel_size=tp,
                                **{**SERVE_DEFAULTS, "max_model_len": max_model_len}))
        except ValueError as e:
            why = str(e)
            continue
        return tp
    raise UsageError(
        f"{model} does not fit the embedded simulated server on up to 8x {gpu} ({why}); "
        "run `inferlab sim serve` with the flags it needs (--quantization, --gpu, -tp) and give bench its --url"
    )


if __name__ == "__main__":
    run()
