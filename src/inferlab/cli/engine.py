"""``inferlab engine``: start a real engine (or the simulator) from one configuration
file, mapped to the engine's own flags (``inferlab.engines.launch``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from inferlab._errors import RunFailedError
from inferlab.cli.common import run_guarded
from inferlab.engines.launch import EngineProcess, command, load_spec


@click.group()
def engine() -> None:
    """Start and stop inference engines from one configuration (vLLM, SGLang, llama.cpp, TGI, Ollama, the simulator)."""


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
        return 0
    proc = start_engine(config, log_path)
    click.echo(proc.url, err=False)
    try:
        while proc.running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        click.echo("inferlab: stopping the engine", err=True)
        proc.stop()
        return 130
    status = proc.stop()
    raise RunFailedError(f"{spec.engine} exited ({status}): {proc.log_tail()}")


def start_engine(config: str, log_path: str | None = None) -> EngineProcess:
    """The engine of ``config`` started and ready; what runs is said on stderr."""
    spec = load_spec(config)
    proc = EngineProcess(spec, Path(log_path or f"engine-{spec.engine}.log"))
    click.echo(f"inferlab: starting {spec.engine}: {proc.command.shell()} (log: {proc.log_path})", err=True)
    t0 = time.monotonic()
    try:
        proc.start()
    except KeyboardInterrupt:
        proc.stop()
        raise
    click.echo(f"inferlab: {spec.engine} ready at {proc.url} after {time.monotonic() - t0:.1f} s", err=True)
    return proc
