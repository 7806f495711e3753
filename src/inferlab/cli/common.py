"""What the ``inferlab`` commands share: error handling and the load/workload flags.

Usage errors exit 2 with one line; runtime failures exit 1 with one line; anything
else is a bug in inferlab: exit 1, one line saying so (``$INFERLAB_DEBUG`` set: the
traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import shlex
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from inferlab._clock import LONGEST_S
from inferlab._errors import InferlabError, UsageError
from inferlab.load.run import RunResult
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay, Schedule
from inferlab.openai.request import check_extra_body
from inferlab.report.console import TABLE_PERCENTILES
from inferlab.results.export import VLLM_PERCENTILES, run_source, vllm_result, vllm_result_filename
from inferlab.results.history import ENV as HISTORY_ENV
from inferlab.results.history import history_path, record_run, record_sweep
from inferlab.results.metrics import SLO, extra_percentiles, percentile_key
from inferlab.results.runfiles import dumps, write_summary
from inferlab.results.summary import with_percentiles
from inferlab.sim.engine.bands import run_bands
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.datasets import DatasetConfig
from inferlab.workload.traces import (
    FORMATS,
    TraceConfig,
    recorded_max_concurrency,
    vllm_result_max_concurrency,
)

DEFAULT_CONCURRENCY = 32
#: Set (to anything but 0), an internal error shows its traceback instead of one line.
DEBUG_ENV = "INFERLAB_DEBUG"


class FloatRange(click.FloatRange):
    """click's ``FloatRange`` with NaN refused: NaN passes every comparison, so click's
    own range check lets ``nan`` through to a flag whose value then means nothing; with
    ``finite`` infinities are refused too (an SLO of ``inf`` ms is no SLO)."""

    def __init__(self, *args: Any, finite: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finite = finite
        if self.min is None and self.max is None:
            self.name = "float"  # (help shows FLOAT, as for click's own float)

    def _describe_range(self) -> str:
        # (click's own prints "x<=None" for a range without bounds)
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and (math.isnan(rv) or (self.finite and math.isinf(rv))):
            self.fail(f"{value!r} is not a{' finite' if self.finite else ''} number.", param, ctx)
        return rv


#: any float but NaN (click's ``float`` takes "nan")
FLOAT = FloatRange()


#: ``click.Context.meta`` key: the option names on a ``OneNamePerSetting`` command's line.
NAMES_GIVEN = "inferlab.names_given"


class OneNamePerSetting(click.Command):
    """A command that refuses two different names of one setting on its command line
    (``--max-num-seqs 8 --max-running-requests 16``, ``--enable-prefix-caching
    --disable-radix-cache``): click would take the last silently, and in a sweep drop an
    axis. The same name twice stays click's way (the last wins), as do options that
    collect every value given (``--header``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        names: dict[str, click.Option] = {}  # (every name of a setting given once)
        takes_value: dict[str, bool] = {}  # (every option's names: whether the next word is its value)
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                for name in p.opts:
                    takes_value[name] = not p.is_flag and not p.count
                for name in p.secondary_opts:
                    takes_value[name] = False
                if not p.multiple and not p.count:
                    for name in (*p.opts, *p.secondary_opts):
                        names[name] = p
        short = sorted((n for n in takes_value if not n.startswith("--")), key=len, reverse=True)
        used: dict[str, list[str]] = {}
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                break
            if arg.startswith("--"):
                name, eq, _ = arg.partition("=")
                value_next = takes_value.get(name, False) and not eq
            elif arg.startswith("-") and len(arg) > 1:  # a short option, its value next or attached (-n4)
                found = next((n for n in short if arg.startswith(n)), None)
                if found is None:
                    continue
                name, value_next = found, takes_value[found] and arg == found
            else:
                continue  # an argument, or the value of an option this does not know
            if value_next:
                i += 1  # (its value, which may look like a flag: --prompt "--rate")
            option = names.get(name)
            if option is not None and name not in (seen := used.setdefault(option.name or "", [])):
                seen.append(name)
        for given_as in used.values():
            if len(given_as) > 1:
                raise click.UsageError(f"{' and '.join(given_as)} name one setting: give one of them")
        ctx.meta[NAMES_GIVEN] = frozenset(n for given_as in used.values() for n in given_as)
        return super().parse_args(ctx, args)


def command_line() -> str:
    """The command as run, secrets redacted (the value after --api-key, and headers)."""
    words = list(sys.argv[1:])
    for i, w in enumerate(words[:-1]):
        if w in ("--api-key", "-H", "--header"):
            words[i + 1] = "***"
    return shlex.join(["inferlab", *(w if not w.startswith("--api-key=") else "--api-key=***" for w in words)])


def console(*, stderr: bool = False, **kw: Any) -> Console:
    """A rich console for the CLI's output, with emoji codes off: text of a run's own
    (``uniform:100:4500``, a path) must print as it is, not with ``:100:`` drawn as 💯."""
    return Console(stderr=stderr, emoji=False, **kw)


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"inferlab: error: {message}", err=True)
    sys.exit(code)


def entry(group: click.Group) -> NoReturn:
    """Run the command group the way every inferlab command ends: click's usage errors
    as one line (exit 2), an interrupt before a run starts as exit 130, a closed stdout
    pipe (``| head``) quietly, an exception no one meant (a bug) as one line saying so
    (exit 1); the library's warnings as one line each."""
    warnings.formatwarning = _one_line_warning
    try:
        code = group.main(args=expand_goodput(sys.argv[1:]), standalone_mode=False)
    except click.UsageError as e:
        fail(e.format_message().replace("\n", " "), 2)
    except (click.Abort, KeyboardInterrupt):
        click.echo("inferlab: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away; nothing left to say
        sys.exit(0)
    except click.ClickException as e:
        fail(e.format_message(), e.exit_code)
    except Exception as e:
        if os.environ.get(DEBUG_ENV, "0") not in ("", "0"):
            raise
        what = f"{type(e).__name__}: {e}".replace("\n", " ")
        fail(f"internal error, a bug in inferlab ({what}); rerun with {DEBUG_ENV}=1 for the traceback, and please report it", 1)
    sys.exit(code if isinstance(code, int) else 0)


def _one_line_warning(message: Warning | str, *_: object, **__: object) -> str:
    return f"inferlab: warning: {message}\n"


def run_guarded(fn: Callable[[], int]) -> int:
    """``fn``'s exit status; inferlab's own errors as one line: ``UsageError`` exit 2,
    the others exit 1 (anything else is a bug: ``entry`` says so)."""
    try:
        return fn()
    except UsageError as e:
        fail(str(e), 2)
    except InferlabError as e:
        fail(str(e), 1)


def parse_rate(value: str | None) -> float | None:
    if value is None:
        return None
    if value.lower() in ("inf", "infinity"):
        return math.inf
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number or 'inf'") from None


class LineParam(click.types.StringParamType):
    """A repeatable option's value that may hold spaces (a header 'Name: value', a
    condition): from the environment (``INFERLAB_BENCH_HEADER``) one value per line, not
    per word as click splits other lists."""

    name = "text"

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return [line for line in rv.splitlines() if line.strip()]


LINE = LineParam()


def parse_headers(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for h in values:
        name, sep, val = h.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{h!r} is not 'Name: value'", param_hint="--header")
        out.append((name.strip(), val.strip()))
    return tuple(out)


def load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Load, workload and output flags shared by ``bench`` and ``sim run``, with
    ``vllm bench serve``'s flags that have no faithful meaning refused (``VLLM_REFUSED``)."""
    return _load_options(fn, VLLM_REFUSED)


def bench_load_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``load_options`` for ``bench``, which takes vLLM's ``--backend``, ``--endpoint``,
    ``--dataset-name`` and ``--percentile-metrics`` (``cli.vllmcompat``) instead of
    refusing them."""
    from inferlab.cli.vllmcompat import vllm_options

    refused = {flag: v for flag, v in VLLM_REFUSED.items() if flag not in BENCH_TAKES}
    return vllm_options(_load_options(fn, refused))


def _load_options(fn: Callable[..., Any], refused: dict[str, tuple[bool, str]]) -> Callable[..., Any]:
    opts: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("-c", "--concurrency", type=int, help=f"Closed loop: this many users. Default {DEFAULT_CONCURRENCY} unless --rate is given."),
        click.option("-r", "--rate", "--request-rate", "rate", help="Open loop: requests per second ('inf' sends all at once). --request-rate: vLLM's name."),
        click.option("--arrival", type=click.Choice(["poisson", "constant", "gamma"]), help="Open loop: how gaps are drawn. Default poisson; gamma when --burstiness is given."),
        click.option("--burstiness", type=FloatRange(min=0, min_open=True), help="Open loop: gamma shape, <1 burstier, 1 Poisson, >1 smoother, inf constant gaps (selects --arrival gamma, as in vLLM)."),
        click.option("--max-concurrency", type=click.IntRange(min=1), help="Cap on requests in flight (vLLM's meaning): with --rate or --trace later requests wait for a slot (queue delay); alone, a closed loop of this many users."),
        click.option("-n", "--num-requests", "--num-prompts", "num_requests", type=int, help="Measured requests. Default 32 (a closed loop: one per user at least; fewer than the default 32 users run as many users) unless --duration is given (with --sessions: every turn of every session). --num-prompts: vLLM's name."),
        click.option("-d", "--duration", type=FloatRange(min=0, min_open=True, max=LONGEST_S), help="Stop sending after this many seconds."),
        click.option("--warmup", "--num-warmups", "warmup", type=click.IntRange(min=0), default=0, show_default=True, help="Requests sent first and left out of the metrics: extra ones of the workload, before the measured window (--duration counts from the first measured request, closed and open loop alike), but with --trace the trace's own first rows (at their times) and with --sessions the first turns sent, which are then not measured. --num-warmups: vLLM's name."),
        click.option("--seed", type=int, default=0, show_default="0 for lengths and arrivals; not given, the prompts are fresh each run, where --seed 0 given repeats seed 0's", help="Seeds lengths and arrivals. Given, it also makes the prompts those of any earlier run with this seed (which a server's prefix cache may still hold); else each run's prompts are fresh."),
        click.option("--input-tokens", "--random-input-len", "--input-len", "input_tokens", help="Synthetic prompts of this many tokens: N, uniform:LO:HI, normal:MEAN:STD (refused where draws held to at least 1 token would move the mean by over 2 %), lognormal:MEDIAN:SIGMA or empirical:DATASET (a dataset file's prompts' lengths in words; empirical:sharegpt: the shipped ShareGPT lengths, in Llama-3 tokens as one published run of vLLM's sampler counted them, whatever the model). --random-input-len, --input-len: vLLM's names."),
        click.option("--output-tokens", "--random-output-len", "--output-len", "output_tokens", help="max_tokens per request (same forms as --input-tokens; empirical:DATASET draws its answers' lengths, and with --input-tokens empirical: of the same DATASET each request takes one row's prompt and answer lengths together, as vLLM's sampler). --random-output-len, --output-len: vLLM's names."),
        click.option("--prefix-groups", type=click.IntRange(min=1), help="Shared-prefix workload: this many groups (default 1 with --prefix-tokens)."),
        click.option("--prefix-tokens", type=click.IntRange(min=1), help="Shared-prefix workload: tokens in each group's prefix."),
        click.option("--suffix-tokens", help="Shared-prefix workload: each request's own tokens after the prefix (default 64)."),
        click.option("--prefix-popularity", default="uniform", show_default=True, help="Group popularity: uniform, zipf or zipf:A."),
        click.option("--trace", type=click.Path(dir_okay=False), help="Replay a trace at its timestamps: inferlab JSONL, a requests.jsonl of an earlier run, Azure CSV, BurstGPT CSV, Mooncake JSONL or a vLLM --save-detailed result JSON."),
        click.option("--trace-format", type=click.Choice(list(FORMATS)), help="Trace format (default: detected from the header or keys)."),
        click.option("--speedup", type=FloatRange(min=0, min_open=True), default=1.0, show_default=True, help="Replay the trace this many times faster."),
        click.option("--trace-start", type=FLOAT, help="Replay from this many seconds after the trace's first request (not its own clock: a trace starting at arrival_s 10 has its first request at 0 here), at the trace's pace (before --speedup)."),
        click.option("--trace-end", type=FLOAT, help="Replay up to (not including) this many seconds after the trace's first request, at the trace's pace (before --speedup)."),
        click.option("--trace-in-order", is_flag=True, help="The trace (CSV or JSONL) is in time order: stop reading it at the first row past --trace-end (rows after it are neither read nor checked). Without it the whole file is read, in any order. Refused for a vLLM result or a requests.jsonl, which are read whole."),
        click.option("--dataset", type=click.Path(dir_okay=False), help="Prompts from a file: JSONL (prompt or messages, optional max_tokens), ShareGPT JSON or CSV (prompt column)."),
        click.option("--dataset-format", type=click.Choice(["jsonl", "sharegpt", "csv"]), help="Dataset format (default: from the extension and content)."),
        click.option("--sample", type=click.Choice(["with-replacement", "without-replacement"]), default="without-replacement", show_default=True, help="Dataset sampling; without replacement stops when every prompt was sent once."),
        click.option("--min-input-tokens", type=click.IntRange(min=1), help="Dataset: skip prompts shorter than this many tokens (counted with --tokenizer; sim run: the simulator's own)."),
        click.option("--max-input-tokens", type=click.IntRange(min=1), help="Dataset: skip prompts longer than this many tokens (counted with --tokenizer; sim run: the simulator's own)."),
        click.option("--sessions", type=click.IntRange(min=1), help="Multi-turn: this many sessions (closed loop: -c users, default one per session; with --rate: sessions arrive at that rate)."),
        click.option("--turns", type=click.IntRange(min=1), default=4, show_default=True, help="Multi-turn: turns per session; each turn adds --input-tokens of new user text."),
        click.option("--think-time-s", type=FloatRange(min=0, max=LONGEST_S), default=0.0, show_default=True, help="Multi-turn: seconds between an answer and the next turn."),
        click.option("--system-tokens", type=click.IntRange(min=0), default=0, show_default=True, help="Multi-turn: a system prompt of this many tokens, shared by all sessions."),
        click.option("--context-window-tokens", type=click.IntRange(min=1), help="Multi-turn: keep the system prompt and at most this many tokens of earlier exchanges (a sliding window over whole user messages and their answers; the new message is sent whatever its size); one smaller than an exchange is refused."),
        click.option("--tokenizer", type=click.Path(exists=False), help="A tokenizer.json, a directory with one, or a Hugging Face model id found in the local HF cache (no downloads): exact prompt lengths."),
        click.option("--token-ids/--no-token-ids", default=True, show_default=True, help="With --tokenizer, send token-id prompts on the completions API."),
        click.option("--prompt", help="Send this prompt every time (default: 'Explain RAG in about 30 characters.')."),
        click.option("--exact-output/--no-exact-output", "--ignore-eos", "exact_output", default=True, show_default=True, help="Send ignore_eos and min_tokens so output length is exact (vLLM's --ignore-eos, which vllm bench serve also forces for random prompts). --no-exact-output sends neither: the server may stop at end-of-sequence, before max_tokens (the simulator, in sim run, sweep and tune, too: at the simulated model's end-of-sequence, as sim serve's)."),
        click.option("--slo-ttft-ms", type=FloatRange(min=0, min_open=True, finite=True), help="Goodput SLO on TTFT."),
        click.option("--slo-tpot-ms", type=FloatRange(min=0, min_open=True, finite=True), help="Goodput SLO on TPOT."),
        click.option("--slo-e2e-ms", type=FloatRange(min=0, min_open=True, finite=True), help="Goodput SLO on E2E."),
        click.option("--goodput", multiple=True, metavar="KEY:MS", help="Goodput SLOs as vllm bench serve takes them: ttft:MS, tpot:MS, e2el:MS (the --slo-*-ms flags), one or several after one --goodput."),
        click.option("--metric-percentiles", callback=percentiles_option, metavar="P,P,...", help="Percentiles (0-100) the table shows and summary.json adds to every distribution beyond its fixed p50/p90/p95/p99 (99.9 as key p99_9), e.g. 50,90,99,99.9; also --save-result's (vLLM's default: 99)."),
        click.option("--save-result", is_flag=True, help="Also write the run as vllm bench serve --save-result does: one JSON file with its keys, named as it names it, in --result-dir."),
        click.option("--save-detailed", is_flag=True, help="With --save-result: add vLLM's per-request lists (input_lens, output_lens, ttfts, itls, ...; latencies and queue_times are written without it, as in vLLM)."),
        click.option("--result-dir", type=click.Path(file_okay=False), help="With --save-result: the folder for the file (default: the current one)."),
        click.option("--result-filename", help="With --save-result: the file's name instead of vLLM's {backend}-{rate}qps-{model}-{date}.json."),
        click.option("-o", "--out", type=click.Path(file_okay=False), help="Write summary.json, requests.jsonl and config.json here (a folder that holds no run yet)."),
        click.option("--overwrite", is_flag=True, help="With --out: replace the run already there (with --result-filename: that file)."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout."),
        *history_options(),
        *(_refused_option(flag, takes_value, why) for flag, (takes_value, why) in refused.items()),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def http_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How requests reach a server (``bench``, and ``sweep`` with ``--url``): streaming,
    credentials, headers, timeouts, sending processes, the preflight probe."""
    opts: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("--stream/--no-stream", default=True, show_default=True, help="Streaming (all metrics) or not (E2E only)."),
        click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token [env: OPENAI_API_KEY]."),
        click.option("-H", "--header", "header", multiple=True, type=LINE, help="Extra request header 'Name: value' (repeatable; from the environment, one per line)."),
        click.option("--timeout", type=FloatRange(min=0, min_open=True, max=LONGEST_S), default=600.0, show_default=True, help="Per-request total timeout, seconds."),
        click.option("--idle-timeout", type=FloatRange(min=0, min_open=True, max=LONGEST_S), default=60.0, show_default=True, help="Max seconds without data mid-response."),
        click.option("--workers", default="auto", show_default=True, callback=lambda ctx, param, v: workers_option(v), help="Processes that send the requests: auto (more than this one only when the load needs it: over 128 concurrent streams or 200 req/s each, up to the cores this process may run on less one), or N (1: this process alone; at most the cores this process may run on: its CPU affinity and cgroup quota)."),
        click.option("--http-client", type=click.Choice(["auto", "aiohttp", "httptools"]), default="auto", show_default=True, help="The HTTP stack that sends: httptools (the fast extra; plain http:// only) reads each streamed chunk for less CPU; auto: httptools where installed and the URL is http://, else aiohttp. Recorded in config.json."),
        click.option("--preflight/--no-preflight", default=True, show_default=True, help="Probe the server first (not counted): fail fast on 401/403/404, detect ignore_eos support, measure template overhead, calibrate prompt lengths."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def server_metrics_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Reading the server's own Prometheus /metrics (``bench``, and ``sweep`` with
    ``--url``): on or off, and pages of their own (``--metrics-url``)."""
    opts: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option("--server-metrics/--no-server-metrics", default=True, show_default=True, help="Read the server's Prometheus /metrics before, every second during and after the run (summary.json's server_metrics, server_metrics.jsonl); a server without it is no error."),
        click.option("--metrics-url", "metrics_urls", multiple=True, metavar="URL", help="Read this Prometheus page instead of the one beside --url (repeatable: several pages are read as one server's, their counters, histograms and running/waiting summed, KV usage the max; one page under two names is refused): the engines behind a gateway (whose own page still gives its queue), a separate metrics port. A page that does not answer, or has no engine's metrics, is refused before the run (exit 1). Needs --url."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def workers_option(value: str) -> int | None:
    """``--workers``: None for auto, else a count of at least 1."""
    if value.strip().lower() == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not auto or a number", param_hint="--workers") from None
    if n < 1:
        raise click.BadParameter("must be at least 1", param_hint="--workers")
    return n


#: vllm bench serve flags with no faithful meaning here: (takes a value, what to use).
#: Refused with that pointer rather than accepted and ignored.
VLLM_REFUSED: dict[str, tuple[bool, str]] = {
    "--dataset-name": (True, "inferlab has no dataset names: --input-tokens/--output-tokens for random prompts, --dataset FILE for ShareGPT/JSONL/CSV, --input-tokens empirical:sharegpt for ShareGPT's lengths, --prefix-tokens N --suffix-tokens M for shared prefixes (vLLM's prefix_repetition, SGLang's generated-shared-prefix)"),
    "--dataset-path": (True, "use --dataset FILE"),
    "--random-range-ratio": (True, "give the range itself: --input-tokens uniform:LO:HI (vLLM draws from len x (1 - ratio) to len x (1 + ratio), sglang.bench_serving from len x ratio to len); inferlab bench takes vLLM's"),
    "--random-prefix-len": (True, "use --prefix-tokens N --suffix-tokens LEN (one prefix shared by every request, then each one's own tokens); inferlab bench takes vLLM's"),
    "--percentile-metrics": (True, "summary.json has every metric; --metric-percentiles chooses the percentiles"),
    "--append-result": (False, "each run writes its own file: give --result-filename per run"),
    "--backend": (True, "use --api chat (openai-chat) or --api completions (openai, vllm)"),
    "--endpoint": (True, "use --api chat (/v1/chat/completions) or --api completions (/v1/completions)"),
}
#: ``VLLM_REFUSED``'s flags that ``bench`` takes (``cli.vllmcompat``).
BENCH_TAKES = frozenset({"--backend", "--endpoint", "--dataset-name", "--percentile-metrics", "--random-range-ratio",
                         "--random-prefix-len"})


def _refused_option(
    flag: str, takes_value: bool, why: str, origin: str = "vllm bench serve"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hidden option that exits 2 with ``why`` when given."""

    def refuse(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if value not in (None, False):
            raise click.UsageError(f"{flag} ({origin}): {why}", ctx)

    return click.option(flag, is_flag=not takes_value, hidden=True, expose_value=False, callback=refuse)


def refused_option(flag: str, takes_value: bool, why: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hidden option of this command that exits 2 with ``why`` when given."""
    return _refused_option(flag, takes_value, why, "not here")


def extra_body_option(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any] | None:
    """A click callback reading ``--extra-body`` (a JSON object, or @FILE holding one);
    exit 2 for anything else, or for a field the run sets itself."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise click.BadParameter(f"{value[1:]}: {e.strerror or e}") from None
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON ({e}); give an object, e.g. '{{\"top_p\": 0.9}}'") from None
    try:
        return check_extra_body(parsed)
    except ValueError as e:  # not an object, or a field the run sets
        raise click.BadParameter(str(e)) from None


def percentiles_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...] | None:
    """A click callback reading ``--metric-percentiles`` as vLLM takes it
    ("50,90,99.9"): sorted, once each; exit 2 for anything else."""
    if value is None:
        return None
    try:
        qs = sorted({float(v) for v in value.split(",") if v.strip()})
        for q in qs:
            percentile_key(q)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected percentiles from 0 to 100 separated by commas, e.g. 50,90,99,99.9") from None
    if not qs:
        raise click.BadParameter("no percentile given")
    return tuple(qs)


def expand_goodput(args: Sequence[str]) -> list[str]:
    """vLLM's ``--goodput ttft:500 tpot:50`` (several values after one flag) as click
    takes it: ``--goodput ttft:500 --goodput tpot:50``. Only the ``KEY:NUMBER`` words
    right after ``--goodput`` are taken; every other word stays as it is."""
    out: list[str] = []
    taking = False  # the words so far since --goodput are all its values
    for a in args:
        pair = _GOODPUT_PAIR.fullmatch(a) is not None
        if taking and pair and out[-1] != "--goodput":
            out.append("--goodput")
        out.append(a)
        taking = a == "--goodput" or a.startswith("--goodput=") or (taking and pair)
    return out


_GOODPUT_PAIR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*:[-+0-9.eE]+")


def as_sweep_output(command: click.Command, each: str, json_help: str) -> click.Command:
    """``command``'s output flags (``load_options``' ``-o``, ``--overwrite``, ``--json``,
    worded for one run) worded for a command that writes a sweep directory: a run
    directory per ``each`` and ``sweep.json`` indexing them."""
    helps = {
        "out": f"Write a run directory per {each} here, and sweep.json indexing them (a folder that holds no sweep yet).",
        "overwrite": "With --out: replace the sweep already there.",
        "as_json": json_help,
    }
    for p in command.params:
        if isinstance(p, click.Option) and p.name in helps:
            p.help = helps[p.name]
    return command


def given(name: str) -> bool:
    """Whether the user set option ``name`` (on the command line or in the environment),
    as opposed to its default."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    source = ctx.get_parameter_source(name)
    return source in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


#: option -> (what it needs, the flag that provides it): an option given without what it
#: acts on would be accepted and ignored, so it is refused.
_NEEDS: dict[str, tuple[str, str]] = {
    "turns": ("sessions", "--sessions"),
    "think_time_s": ("sessions", "--sessions"),
    "system_tokens": ("sessions", "--sessions"),
    "context_window_tokens": ("sessions", "--sessions"),
    "speedup": ("trace", "--trace"),
    "trace_format": ("trace", "--trace"),
    "trace_start": ("trace", "--trace"),
    "trace_end": ("trace", "--trace"),
    "trace_in_order": ("trace", "--trace"),
    "dataset_format": ("dataset", "--dataset"),
    "sample": ("dataset", "--dataset"),
    "min_input_tokens": ("dataset", "--dataset"),
    "max_input_tokens": ("dataset", "--dataset"),
    "prefix_groups": ("prefix_tokens", "--prefix-tokens"),
    "suffix_tokens": ("prefix_tokens", "--prefix-tokens"),
    "prefix_popularity": ("prefix_tokens", "--prefix-tokens"),
    "token_ids": ("tokenizer", "--tokenizer"),
    "save_detailed": ("save_result", "--save-result"),
    "result_dir": ("save_result", "--save-result"),
    "result_filename": ("save_result", "--save-result"),
}


def check_needs(kw: dict[str, Any]) -> None:
    """``UsageError`` for an option given without the one it acts on."""
    for name, (needed, flag) in _NEEDS.items():
        if name in kw and given(name) and kw.get(needed) in (None, False):
            said = f"--{name.replace('_', '-')}"
            if kw[name] is False:  # (an on/off flag: name the form given, --no-token-ids)
                said = f"--no-{name.replace('_', '-')}"
            raise UsageError(f"{said} needs {flag}")
    if "token_ids" in kw and given("token_ids") and kw.get("api", "chat") != "completions":
        # (the chat API's messages are text: the flag would be accepted and ignored)
        flag = "--token-ids" if kw["token_ids"] else "--no-token-ids"
        raise UsageError(f"{flag} chooses the prompt form of --api completions; chat messages are sent as text")
    if kw.get("no_history") and kw.get("history"):
        raise UsageError("--history and --no-history: give one")
    if given("overwrite") and kw.get("out") is None and not kw.get("save_result"):
        raise UsageError("--overwrite needs --out (or --save-result)")


def load_config(kw: dict[str, Any]) -> LoadConfig:
    """The load the flags ask for. ``--max-concurrency`` caps requests in flight as in
    vLLM (alone: a closed loop of that many users); ``--burstiness`` alone selects gamma
    arrivals, as in vLLM; flags that shape arrivals need ``--rate``."""
    check_needs(kw)
    check_result_file(kw)
    if kw["concurrency"] is not None and kw["rate"] is not None:
        raise UsageError("--concurrency and --rate are exclusive (use --max-concurrency with --rate)")
    rate = parse_rate(kw["rate"])
    arrival, burstiness = kw["arrival"], kw["burstiness"]
    if burstiness is not None and arrival is None:
        arrival = "gamma"  # vLLM: --burstiness alone draws gamma gaps
    if burstiness is not None and math.isinf(burstiness) and arrival in ("gamma", "constant"):
        arrival, burstiness = "constant", None  # vLLM: burstiness inf is constant gaps (gamma's limit)
    if burstiness is not None and arrival != "gamma":
        raise UsageError(f"--burstiness shapes gamma arrivals, not {arrival}: drop it or use --arrival gamma")
    shaping = [f for f, v in (("--arrival", kw["arrival"]), ("--burstiness", kw["burstiness"])) if v is not None]
    schedule: Schedule
    if kw["trace"]:
        if kw["concurrency"] is not None or rate is not None or shaping:
            given_flags = ["--concurrency"] * (kw["concurrency"] is not None) + ["--rate"] * (rate is not None) + shaping
            raise UsageError(f"--trace sends at the trace's own times: drop {'/'.join(given_flags)} (use --speedup)")
        cap = kw["max_concurrency"] or vllm_result_max_concurrency(kw["trace"])
        if cap is None and (cap := recorded_max_concurrency(kw["trace"])) is not None:
            click.echo(f"inferlab: replaying with the run's --max-concurrency {cap} (from the config.json beside "
                       "the trace; --max-concurrency sets another)", err=True)
        schedule = Replay(cap)
        return LoadConfig(schedule, kw["num_requests"], kw["duration"], kw["warmup"], kw["seed"])
    if rate is not None:
        schedule = OpenLoop(rate, arrival or "poisson", 1.0 if burstiness is None else burstiness, kw["max_concurrency"])
    else:
        if shaping:
            raise UsageError(f"{'/'.join(shaping)} shape open-loop arrivals: give --rate too")
        if kw["concurrency"] is not None and kw["max_concurrency"] is not None:
            raise UsageError("--concurrency and --max-concurrency both set a closed loop's users: give one")
        users = next((u for u in (kw["concurrency"], kw["max_concurrency"], kw["sessions"]) if u is not None), DEFAULT_CONCURRENCY)
        if kw["sessions"] is not None and users > kw["sessions"]:  # (each user runs one session at a time)
            flag = "-c" if kw["concurrency"] is not None else "--max-concurrency"
            raise UsageError(f"{flag} {users} users for --sessions {kw['sessions']}: a user runs one session at a time, "
                             f"so at most {kw['sessions']} would ever run at once; give {flag} {kw['sessions']} or fewer, "
                             "or more sessions")
        schedule = ClosedLoop(users)
    num = kw["num_requests"]
    if num is not None and num < 1:
        raise UsageError(f"-n/--num-requests must be at least 1, not {num}")
    if kw["sessions"] is not None and kw["warmup"] >= kw["sessions"] * kw["turns"]:
        total = kw["sessions"] * kw["turns"]
        raise UsageError(f"--warmup {kw['warmup']} leaves nothing to measure of the {total} requests --sessions "
                         f"{kw['sessions']} x --turns {kw['turns']} send: give a smaller --warmup or more sessions")
    if kw["sessions"] is not None and num is None:
        num = kw["sessions"] * kw["turns"] - kw["warmup"]  # (the warm-up turns are sent first, not measured)
    elif kw["sessions"] is not None and num + kw["warmup"] > kw["sessions"] * kw["turns"]:
        # (the sessions send that many and stop: the rest would be counted but never sent)
        total, warmup = kw["sessions"] * kw["turns"], kw["warmup"]
        raise UsageError(
            f"-n {num}{f' with --warmup {warmup}' if warmup else ''} asks for more requests than "
            f"--sessions {kw['sessions']} x --turns {kw['turns']} send ({total}): give -n {max(1, total - warmup)} "
            "or fewer, or more sessions or turns"
        )
    users = schedule.concurrency if isinstance(schedule, ClosedLoop) and kw["sessions"] is None else None
    if num is None and kw["duration"] is None:
        num = 32 if users is None else max(32, users)  # (a request per user at least)
    if users is not None and num is not None and num + kw["warmup"] < users:
        if kw["concurrency"] is None and kw["max_concurrency"] is None:
            schedule = ClosedLoop(num + kw["warmup"])  # the default users, as many as run (config.json says so)
        else:
            check_users_have_requests(users, num, kw["warmup"])
    return LoadConfig(schedule, num, kw["duration"], kw["warmup"], kw["seed"])


def check_users_have_requests(users: int, num: int, warmup: int) -> None:
    """``UsageError`` for a closed loop of more users than requests to send: only as many
    users as requests would ever run, and the run would be labelled with the rest."""
    if num + warmup < users:
        raise UsageError(
            f"-n {num}{f' with --warmup {warmup}' if warmup else ''} sends fewer requests than the closed loop's "
            f"{users} users: only {num + warmup} would ever run at once; give -n {users - warmup} or more, or --duration"
        )


#: vLLM's ``--goodput`` metric names -> the ``--slo-*-ms`` option each sets.
GOODPUT_KEYS = {"ttft": "slo_ttft_ms", "tpot": "slo_tpot_ms", "e2el": "slo_e2e_ms"}


def slo_config(kw: dict[str, Any]) -> SLO | None:
    """The SLOs of ``--slo-*-ms`` and of vLLM's ``--goodput KEY:MS`` (``UsageError`` for
    an unknown key, a limit that is not positive, or one given twice)."""
    limits = {k: kw[k] for k in GOODPUT_KEYS.values()}
    for pair in kw.get("goodput") or ():
        for item in re.split(r"[\s,]+", pair.strip()):
            key, sep, value = item.partition(":")
            if key not in GOODPUT_KEYS or not sep:
                raise UsageError(f"--goodput {item!r}: expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)} (vLLM's names)")
            try:
                ms = float(value)
            except ValueError:
                ms = math.nan
            if not ms > 0 or math.isinf(ms):
                raise UsageError(f"--goodput {item!r}: the limit must be a positive number of ms")
            name = GOODPUT_KEYS[key]
            if limits[name] is not None:
                raise UsageError(f"--goodput {key}: that SLO is given twice (--goodput or --{name.replace('_', '-')})")
            limits[name] = ms
    if kw.get("stream") is False and (limits["slo_ttft_ms"] is not None or limits["slo_tpot_ms"] is not None):
        # (no request would have a TTFT or TPOT: goodput 0 whatever the server did)
        raise UsageError("a TTFT or TPOT SLO needs streaming: --no-stream measures E2E only (use --slo-e2e-ms, --goodput e2el:MS)")
    if all(v is None for v in limits.values()):
        return None
    return SLO(limits["slo_ttft_ms"], limits["slo_tpot_ms"], limits["slo_e2e_ms"])


def workload_config(kw: dict[str, Any]) -> WorkloadConfig:
    trace = None
    if kw["trace"]:
        trace = TraceConfig(kw["trace"], kw["trace_format"], kw["speedup"], kw["trace_start"], kw["trace_end"],
                            in_order=kw["trace_in_order"])
    dataset = None
    if kw["dataset"]:
        dataset = DatasetConfig(kw["dataset"], kw["dataset_format"], kw["sample"], kw["min_input_tokens"], kw["max_input_tokens"])
    if kw["prompt"] is not None and not kw["prompt"].strip():
        raise UsageError("--prompt is empty")
    if kw["tokenizer"]:
        from inferlab.workload.tokenizers import load_tokenizer

        try:
            load_tokenizer(kw["tokenizer"])  # a bad path fails here, before any server starts
        except UsageError as e:
            raise UsageError(f"--tokenizer: {e}") from e
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
        # --seed given: that run's prompts again; else fresh ones (a rerun must not
        # measure the prefix cache the last run left on the server)
        prompt_salt="" if given("seed") else None,
    )


def stop_signals() -> list[signal.Signals]:
    """The signals that end a run, or a started engine, gracefully: SIGINT, SIGTERM, and
    SIGHUP (the terminal closed; its default ended the process and left an engine
    running) unless it is already ignored (``nohup``), which it stays."""
    hup = getattr(signal, "SIGHUP", None)
    keep_hup = hup is not None and signal.getsignal(hup) != signal.SIG_IGN
    return [signal.SIGINT, signal.SIGTERM, *([hup] if keep_hup and hup is not None else [])]


def install_stop_signals(stop: asyncio.Event) -> None:
    """``stop_signals`` end the run gracefully: in-flight requests are cancelled, the
    summary of what completed is still written and an engine started with ``--engine``
    is stopped."""
    loop = asyncio.get_running_loop()
    for sig in stop_signals():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def serve_until_stopped(runner: Any) -> None:
    """Serve until SIGINT/SIGTERM, then clean ``runner`` (an aiohttp ``AppRunner``) up."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def table_percentiles(kw: dict[str, Any]) -> tuple[float, ...]:
    """The percentiles the console table shows: ``--metric-percentiles``, else p50/p90/p99."""
    chosen: tuple[float, ...] | None = kw.get("metric_percentiles")
    return chosen or TABLE_PERCENTILES


def check_output_folder(path: Path) -> None:
    """``UsageError`` when the folder of an output file the user named does not exist:
    it is not made (a typo in the path would otherwise write somewhere unexpected)."""
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: no folder {path.parent} (make it first, or give another path)")


def check_result_file(kw: dict[str, Any]) -> None:
    """Before a run, what would keep ``--save-result`` from writing its file at the end:
    ``UsageError`` if ``--result-dir`` is a file, or a folder (or, not there yet, the
    folder it would be made in) that cannot be written; if ``--result-filename`` names a
    folder, or a file that exists (without ``--overwrite``, so that a run does not end
    by replacing an earlier one), or no file at all (an empty name fell back to vLLM's
    default one); and with ``--no-stream``, which vLLM's result cannot hold (its TTFT,
    ITL and TPOT need streaming: ``results.export``)."""
    if kw.get("result_filename") is not None and not kw["result_filename"].strip():
        raise UsageError("--result-filename is empty: give a file name, or leave the flag out for vLLM's")
    if not kw.get("save_result"):
        return
    if kw.get("stream") is False:
        raise UsageError("--save-result writes vllm bench serve's result, which needs streaming (vLLM always streams): "
                         "drop --no-stream, or drop --save-result (inferlab export --format csv-summary writes a run's summary)")
    folder = kw.get("result_dir") or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"--result-dir {folder} is a file, not a folder")
    made_in = folder
    while not os.path.exists(made_in):  # (the folder it would be made in)
        made_in = os.path.dirname(os.path.abspath(made_in))
    if not os.path.isdir(made_in) or not os.access(made_in, os.W_OK | os.X_OK):
        where = "" if made_in == folder else f" (it would be made in {made_in})"
        raise UsageError(f"--result-dir {folder}: cannot write there{where}")
    if kw.get("result_filename"):
        path = os.path.join(folder, kw["result_filename"])
        if os.path.isdir(path):
            raise UsageError(f"--result-filename {path} is a folder: give a file name")
        parent = os.path.dirname(path)
        if os.path.normpath(parent) != os.path.normpath(folder) and not os.path.isdir(parent):
            raise UsageError(f"--result-filename {kw['result_filename']}: no folder {parent} (make it first)")
        if os.path.exists(path) and not kw.get("overwrite"):
            raise UsageError(f"--result-filename {path} already exists: give another name, or --overwrite")


def history_options() -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """``--history PATH`` and ``--no-history``: where the run history is (results.history)."""
    return [
        click.option("--history", "history", metavar="PATH", help=f"The run-history database to record in (default: ${HISTORY_ENV}, else history.sqlite in the user's data directory; {HISTORY_ENV}=off records nothing)."),
        click.option("--no-history", is_flag=True, help="Record nothing in the run history."),
    ]


def record_in_history(summary: dict[str, Any], path: str | None, kw: dict[str, Any]) -> int | None:
    """Record a finished run in the history the flags choose, quietly (``inferlab runs``
    lists the ids); its id, or None when the history is off. A history that cannot be
    written is a warning, not a failed run: the run's own files are what matters."""
    where = history_path(kw.get("history"), disabled=bool(kw.get("no_history")))
    if where is None:
        return None
    try:
        run_id = record_run(summary, path, where)
    except UsageError as e:
        click.echo(f"inferlab: warning: not recorded in the history: {e}", err=True)
        return None
    return run_id


def record_sweep_in_history(path: str, kw: dict[str, Any]) -> int | None:
    """Record a sweep directory (its final sweep.json) in the history the flags choose
    (``--history``/``--no-history``), quietly; a history that cannot be written is a
    warning. The row id, or None."""
    try:
        return record_sweep(path, kw.get("history"), disabled=bool(kw.get("no_history")))
    except UsageError as e:
        click.echo(f"inferlab: warning: not recorded in the history: {e}", err=True)
        return None


def finish_run(result: RunResult, kw: dict[str, Any]) -> RunResult:
    """What the flags ask of a run once it has ended: ``--metric-percentiles`` added to
    every distribution (summary.json rewritten with them), ``--save-result``'s vLLM
    result file written (its path said on stderr), and the run recorded in the history
    (``--history``/``--no-history``)."""
    chosen = kw.get("metric_percentiles")
    if chosen and extra_percentiles(chosen):
        summary = with_percentiles(result.summary, result.records, chosen)
        if kw.get("out"):
            write_summary(kw["out"], summary)
        result = dataclasses.replace(result, summary=summary)
    if kw.get("save_result"):
        vllm = vllm_result(
            result.summary, result.records,
            # vLLM stamps its result with the local date and time the run ended: a label
            # for the file, never a measurement (those all come from the one clock)
            date=datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
            percentiles=chosen or VLLM_PERCENTILES, detailed=kw.get("save_detailed", False),
            metrics=kw.get("percentile_metrics"),
            source=run_source(result.summary), bands=run_bands(result.summary.prediction),
        )
        folder = kw.get("result_dir") or "."
        path = os.path.join(folder, kw.get("result_filename") or vllm_result_filename(vllm))
        try:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(dumps(vllm, indent=None))
            click.echo(f"inferlab: vLLM result: {path}", err=True)
        except OSError as e:  # (checked before the run; the run is still shown and recorded, then exit 1)
            failed = InferlabError(f"cannot write the vLLM result {path}: {e.strerror or e}")
            result = dataclasses.replace(result, cause=result.cause or failed)
    record_in_history(result.summary.to_json(), kw.get("out"), kw)
    return result
