"""``inferlab gateway``: the token-aware proxy, in the foreground until interrupted."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from inferlab.cli.common import run_guarded, serve_until_stopped


@click.command()
@click.option("--upstream", "upstreams", multiple=True, help="An engine's root URL (http://host:port); repeatable. More, with their keys and limits: [[upstreams]] in --config.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port to listen on (0: a free one, printed).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file (or YAML: .yaml, .yml): client keys and limits, admission, cache, more upstreams (docs/gateway.md).")
@click.option("--http-client", type=click.Choice(["auto", "aiohttp", "httptools"]), default=None, help="The HTTP stack to the upstreams ([gateway] http_client; default auto: httptools for http:// upstreams where the fast extra installed it, else aiohttp).")
@click.option("--announce", is_flag=True, hidden=True, help="Print the gateway's URL on stdout once it listens (for a parent process).")
def gateway(**kw: Any) -> None:
    """An OpenAI-compatible gateway in front of one or more engines: streaming
    pass-through, Prometheus /metrics (TTFT, TPOT, ITL, tokens), admission by tokens in
    flight, per-key RPM/TPM limits, a response cache for deterministic requests."""
    sys.exit(run_guarded(lambda: _gateway(kw)))


def _gateway(kw: dict[str, Any]) -> int:
    from inferlab.gateway.config import load_config

    config = load_config(kw["upstreams"], host=kw["host"], port=kw["port"], path=kw["config_path"],
                         http_client=kw["http_client"])
    from inferlab._loop import run

    return run(_serve(config, kw["announce"]))  # (uvloop's loop where the fast extra installed it)


async def _serve(config: Any, announce: bool) -> int:
    from inferlab.gateway.app import Gateway, start
    from inferlab.gateway.estimate import CHARS_PER_TOKEN, UPSTREAM
    from inferlab.results.provenance import admission_limit

    gw = Gateway(config)
    try:
        runner, port = await start(gw, config.host, config.port)
    except OSError as e:  # (a runtime failure, as sim serve's: exit 1)
        from inferlab._errors import RunFailedError

        why = os.strerror(e.errno) if e.errno else str(e)  # (asyncio's strerror repeats the address)
        raise RunFailedError(f"cannot listen on {config.host}:{config.port}: {why}") from None
    url = f"http://{config.host}:{port}"
    if announce:
        print(url, flush=True)
    ups = ", ".join(u.name for u in config.upstreams)
    adm = config.admission
    limit = admission_limit(config.setup()) or "off"
    counted = {"estimate": f"{CHARS_PER_TOKEN} characters a token", "builtin": "the simulator's tokenizer",
               UPSTREAM: "each upstream's /tokenize"}.get(adm.tokenizer, adm.tokenizer)
    keys = _counted(len(config.keys), "client key") if config.keys else "no client keys: every request is let in"
    cache = "cache on" if config.cache.enabled else "cache off"
    if config.redis is not None:
        red = config.redis
        shared = [w for w, on in (("limits", red.limits), ("cache", red.cache and config.cache.enabled),
                                  (f"admission budgets (lease {red.lease_s:g} s)", red.admission and adm.mode != "off"))
                  if on]
        cache += f"; shared through Redis: {', '.join(shared) or 'nothing'}"
    refresh = (f"engines' /metrics read every {config.metrics_refresh_s:g} s" if config.metrics_refresh_s > 0
               else "engines' /metrics not read")
    stacks = ", ".join(dict.fromkeys(gw.upstreams.stacks))
    routing = f"{config.router} routing"
    if config.long_prompt_tokens is not None:
        routing += (f" (prompts of {config.long_prompt_tokens:,}+ tokens to "
                    f"{', '.join(u.name for u in config.upstreams if u.url in config.long_upstreams)}"
                    + (f", as estimated at {CHARS_PER_TOKEN} characters a token: [admission] tokenizer = "
                       f"\"{UPSTREAM}\" counts them as the engine does" if adm.tokenizer == "estimate" else "") + ")")
    click.echo(f"inferlab gateway on {url} → {ups} (over {stacks}); {routing}, {refresh}; admission "
               f"{adm.mode} ({limit}; prompts counted by {counted}); {keys}; {cache}", err=True)
    await serve_until_stopped(runner)
    return 0


def _counted(n: int, noun: str) -> str:
    """``n`` ``noun``s in words: "1 request", "64 requests"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
