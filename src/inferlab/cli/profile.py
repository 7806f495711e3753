"""``inferlab profile``: what each factor costs on one server (``analysis.profile``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from inferlab._errors import UsageError
from inferlab.analysis.profile import (
    DEFAULT_BUDGET_S,
    FACTORS,
    Profile,
    ProfileConfig,
    parse_budget,
    prepare_out,
    profile,
)
from inferlab.cli.common import FloatRange, console, given, run_guarded
from inferlab.engines.launch import command, load_spec
from inferlab.load.run import metrics_pages
from inferlab.results.metrics import SLO
from inferlab.results.provenance import PREDICTION
from inferlab.results.runfiles import dumps


@click.command("profile")
@click.option("--url", help="OpenAI-compatible server. Default: the embedded simulated server (started for the profile, stopped after).")
@click.option("--engine", "engine_config", type=click.Path(dir_okay=False), help="Start this engine first (a TOML/JSON file, as for inferlab engine start), profile it, stop it; its output goes to --out's engine.log, its config into profile.json.")
@click.option("--model", help="Model name to request (default: the first the server lists; without --url: the model the simulator serves).")
@click.option("--api", type=click.Choice(["chat", "completions"]), default="chat", show_default=True)
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token [env: OPENAI_API_KEY].")
@click.option("--metrics-url", "metrics_urls", multiple=True, metavar="URL", help="Every measurement reads this Prometheus page instead of the one beside --url, as bench --metrics-url does (repeatable): the engines behind a gateway, whose prefix-cache counters the prefix cache's factor may need. Needs --url.")
@click.option("--budget", default=f"{DEFAULT_BUDGET_S / 60:g}m", show_default=True, help="Wall time the whole profile may take: seconds, or 90s, 5m, 1h. Sizes shrink with it; a measurement still going at the end of its share is stopped.")
@click.option("-o", "--out", "out_dir", default="inferlab-profile", show_default=True, type=click.Path(file_okay=False), help="Folder for profile.json and one run directory per measurement.")
@click.option("--overwrite", is_flag=True, help="Replace a profile already in --out.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=64, show_default=True, help="The highest concurrency the decode ladder tries (1, 2, 4, ...); only with the decode factor.")
@click.option("--slo-ttft-ms", type=FloatRange(min=0, min_open=True, finite=True), default=2000.0, show_default=True, help="Goodput SLO on TTFT (the decode factor: which concurrency serves the most requests within the SLOs).")
@click.option("--slo-tpot-ms", type=FloatRange(min=0, min_open=True, finite=True), default=100.0, show_default=True, help="Goodput SLO on TPOT (the decode factor).")
@click.option("--factors", default="all", show_default=True, help=f"Measure only these, comma-separated: {', '.join(FACTORS)}.")
@click.option("--exact-output/--no-exact-output", default=True, show_default=True, help="--no-exact-output adds the temperature factor (with --factors, name it too; naming it needs this): requests at temperature 0 and 1 that the model ends on its own (output length and its spread). The other factors always ask for exact output lengths (ignore_eos/min_tokens): their costs are per token.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print profile.json instead of the table.")
def profile_command(**kw: Any) -> None:
    """Measure what each factor costs on a server: prompt length (prefill), concurrency
    (decode), output length, prefix cache, response cache, head-of-line blocking, the chat
    template. Writes PROFILE_DIR/profile.json and one run directory per measurement."""
    sys.exit(run_guarded(lambda: _profile(kw)))


def _profile(kw: dict[str, Any]) -> int:
    spec = None
    if kw["engine_config"]:
        if kw["url"] is not None:
            raise UsageError("--engine starts the server to profile: give --engine or --url, not both")
        spec = load_spec(kw["engine_config"])
        command(spec)  # a setting the engine has no flag for: refused before anything starts
    from inferlab.cli.engine import recorded_spec
    factors = () if kw["factors"].strip() == "all" else tuple(f.strip() for f in kw["factors"].split(",") if f.strip())
    if not factors and kw["factors"].strip() != "all":  # (an empty tuple is every factor)
        raise UsageError("--factors names no factor (give 'all' for every one)")
    if kw["metrics_urls"] and kw["url"] is None:
        raise UsageError("--metrics-url needs --url: a server profile starts itself (the embedded simulator, --engine) "
                         "has its own /metrics read already")
    config = ProfileConfig(
        out_dir=kw["out_dir"], budget_s=parse_budget(kw["budget"]), model=kw["model"], api=kw["api"],
        api_key=kw["api_key"], slo=SLO(ttft_ms=kw["slo_ttft_ms"], tpot_ms=kw["slo_tpot_ms"]),
        max_concurrency=kw["max_concurrency"], seed=kw["seed"], overwrite=kw["overwrite"],
        embedded=kw["url"] is None and spec is None, exact_output=kw["exact_output"],
        factors=factors,
        engine_config=None if spec is None else recorded_spec(spec),
        metrics_urls=metrics_pages(kw["metrics_urls"], True),
    )
    if "decode" not in config.measured():  # (the decode ladder is all they shape)
        for name, flag in (("max_concurrency", "--max-concurrency"), ("slo_ttft_ms", "--slo-ttft-ms"), ("slo_tpot_ms", "--slo-tpot-ms")):
            if given(name):
                raise UsageError(f"{flag}: only the decode factor uses it, and --factors leaves it out")
    err = console(stderr=True)
    embedded = None
    started = None
    url = kw["url"]
    if spec is not None:
        from inferlab.cli.engine import start_engine

        out = prepare_out(config)  # (a folder holding a profile: refused before the engine starts)
        started = start_engine(kw["engine_config"], str(out / "engine.log"))
        url = started.url
    elif url is None:
        from inferlab.sim.server.launch import ChildServer

        # (it says its cached tokens, as bench's own server does: the prefix cache's factor reads them)
        embedded = ChildServer(["--enable-prompt-tokens-details", *(["--model", kw["model"]] if kw["model"] else [])])
        url = embedded.url
        click.echo(f"inferlab: no --url, profiling the simulated server at {url} (numbers are a prediction)", err=True)
    if config.metrics_urls:  # (a page the user named that does not answer: refused before the first measurement)
        from inferlab.client.exchange import auth_headers
        from inferlab.client.metrics import check_pages

        try:
            headers = auth_headers({}, config.api_key)
        except ValueError as e:
            raise UsageError(str(e)) from None
        asyncio.run(check_pages(config.metrics_urls, headers))
    try:
        result = asyncio.run(profile(config, url, on_step=lambda name: err.print(f"[dim]profile: {name.replace('_', ' ')}…[/dim]")))
    finally:
        if embedded is not None:
            embedded.close()
        if started is not None:
            started.stop()
    if kw["as_json"]:
        click.echo(dumps(result.to_json()))
    else:
        render_profile(console(), result, config.out_dir)
    return 0


def render_profile(console: Console, p: Profile, out_dir: str) -> None:
    """The table: factor · measured (or, on inferlab's simulator, predicted) cost here · evidence."""
    server = p.server  # (the simulated server: its numbers are predictions)
    where = server.label
    if p.engine_config is not None:
        where = f"{p.engine_config.get('engine')} at {p.url} (started from its config)" + (f" {PREDICTION}" if server.simulated else "")
    table = Table(title=f"profile of {p.model} @ {where} ({p.elapsed_s:,.0f} s of a {p.budget_s:,.0f} s budget)", title_justify="left", header_style="bold")
    table.add_column("factor", no_wrap=True)
    # (a long name in a cell, usage.prompt_tokens, folds rather than being cut)
    table.add_column("predicted cost here" if server.simulated else "measured cost here", overflow="fold")
    table.add_column("evidence", overflow="fold")
    for f in p.factors:
        table.add_row(f.title, f.cost if f.measured else f"[dim]{f.cost}[/dim]", f.evidence)
    console.print(table)
    folder = out_dir.rstrip("/") or out_dir  # (prof/ printed prof//profile.json)
    console.print(f"results: {folder}/profile.json (each measurement's run directory beside it); next: inferlab advise {out_dir}")
