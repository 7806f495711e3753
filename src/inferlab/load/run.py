"""``bench`` as a library call: a frozen config in, a summary and the records out.

The CLI only parses flags into a ``BenchConfig`` and renders what this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferlab._clock import Clock, WallClock
from inferlab._errors import RunFailedError, UsageError
from inferlab.client.preflight import EXACT_LOCAL, Preflight, run_preflight
from inferlab.load.http import run_load
from inferlab.load.http_sessions import run_sessions
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.results.metrics import SLO, summarize
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import RunWriter
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.datasets import DatasetWorkload
from inferlab.workload.sessions import SessionWorkload
from inferlab.workload.spec import Api
from inferlab.workload.tokenizers import load_tokenizer
from inferlab.workload.traces import compare_with_trace


@dataclass(frozen=True)
class BenchConfig:
    load: LoadConfig
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    url: str | None = None  # None: the embedded simulated server
    model: str | None = None  # None: the first model the server lists
    api: Api = "chat"
    stream: bool = True
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    idle_timeout_s: float = 60.0
    slo: SLO | None = None
    out_dir: str | None = None
    preflight: bool = True  # probe the server first (not counted); see ``_preflight``

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["api_key"] = "***" if self.api_key else None
        d["headers"] = {k: ("***" if _secret_header(k) else v) for k, v in self.headers}
        d["load"]["schedule"] = {"kind": type(self.load.schedule).__name__, **d["load"]["schedule"]}
        out: dict[str, Any] = json.loads(json.dumps(d, default=str))
        return out


#: A header whose name contains one of these (case-insensitive) is redacted in config.json.
_SECRET_HEADER_PARTS = ("authorization", "api-key", "api_key", "apikey", "token", "secret", "cookie", "password", "key")


def _secret_header(name: str) -> bool:
    lower = name.lower()
    return any(part in lower for part in _SECRET_HEADER_PARTS)


@dataclass
class BenchResult:
    summary: dict[str, Any]
    records: list[RequestRecord]
    url: str


async def bench_async(
    config: BenchConfig,
    url: str,
    *,
    clock: Clock | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchResult:
    """Run the benchmark against ``url``; write results if ``out_dir`` is set.

    Raises ``ServerUnreachableError`` before the run if nothing answers, and
    ``RunFailedError`` after it if every measured request failed (the summary is
    written first, and is attached to the exception as ``summary``)."""
    from inferlab.client.http import Endpoint, api_base, discover_model

    clock = clock or WallClock()
    try:
        base = api_base(url)
    except ValueError as e:
        raise UsageError(str(e)) from e
    model = config.model or await discover_model(base, config.api_key)
    endpoint = Endpoint(
        base_url=base,
        model=model,
        api=config.api,
        stream=config.stream,
        api_key=config.api_key,
        headers=dict(config.headers),
        timeout_s=config.timeout_s,
        idle_timeout_s=config.idle_timeout_s,
    )
    wcfg = config.workload
    pre = None
    if config.preflight:
        tok = load_tokenizer(wcfg.tokenizer) if wcfg.tokenizer else None
        pre = await run_preflight(endpoint, exact_output=wcfg.exact_output, tokenizer=tok)
        if not pre.accepts_exact_output:
            wcfg = dataclasses.replace(wcfg, exact_output=False)
    builder = wcfg.builder(config.api) if pre is None else wcfg.builder(
        config.api, vocab=pre.vocab, tokens_per_word=pre.tokens_per_word
    )
    workload = wcfg.build(config.load.seed, config.api, builder=builder)
    cfg_json = {**config.to_json(), "resolved": {"url": base, "model": model}}
    writer = RunWriter(config.out_dir, cfg_json) if config.out_dir else None

    def record_done(r: RequestRecord) -> None:
        if writer is not None:
            writer.append(r)
        if on_record is not None:
            on_record(r)

    try:
        if isinstance(workload, SessionWorkload):
            s = config.load.schedule
            users = s.concurrency if isinstance(s, ClosedLoop) else 1
            result = await run_sessions(
                endpoint, config.load, workload, clock, users=users, on_record=record_done, stop=stop
            )
        else:
            result = await run_load(endpoint, config.load, workload, clock, on_record=record_done, stop=stop)
        summary = run_summary(result.records, workload, config=cfg_json, slo=config.slo, interrupted=result.interrupted)
        add_preflight(summary, pre, wcfg)
        if writer is not None:
            writer.write_summary(summary)
    finally:
        if writer is not None:
            writer.close()
    raise_if_all_failed(summary)
    return BenchResult(summary, result.records, base)


def run_summary(
    records: list[RequestRecord],
    workload: object,
    *,
    config: dict[str, Any],
    slo: SLO | None,
    interrupted: bool,
) -> dict[str, Any]:
    """The summary of a run of ``workload``, ``bench`` and ``sim run`` alike: the
    metrics, plus the trace's own measurements compared and a dataset's warnings."""
    summary = summarize(records, config=config, slo=slo, interrupted=interrupted)
    if isinstance(workload, list):
        summary["trace_comparison"] = compare_with_trace(records, workload)
    if isinstance(workload, DatasetWorkload):
        summary["warnings"] += workload.warnings()
    return summary


def raise_if_all_failed(summary: dict[str, Any]) -> None:
    """``RunFailedError`` (exit 1, one line) when requests failed and none completed."""
    c = summary["counts"]
    if c["completed"] == 0 and c["failed"] > 0:
        kind, msg = next(iter(summary["error_examples"].items()))
        raise RunFailedError(f"all {c['failed']} requests failed; first {kind}: {msg}", summary)


def add_preflight(summary: dict[str, Any], pre: Preflight | None, wcfg: WorkloadConfig) -> None:
    """Put what the probe learned into the summary (``prompt_overhead_tokens``,
    ``input_length_source``, ``preflight``) and its caveats into the warnings."""
    summary["prompt_overhead_tokens"] = None if pre is None else pre.prompt_overhead_tokens
    if not wcfg.synthetic:
        source = "prompt text as given"
    elif wcfg.tokenizer:
        source = EXACT_LOCAL
    else:
        source = "unknown (no preflight)" if pre is None else pre.input_length_source
    summary["input_length_source"] = source
    summary["preflight"] = None if pre is None else pre.to_json()
    if pre is not None:
        summary["warnings"] = [*pre.warnings, *summary["warnings"]]
        if wcfg.synthetic and source.startswith("approximate"):
            summary["warnings"].append(f"prompt lengths are {source}")


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM end the run gracefully: in-flight requests are cancelled and the
    summary of what completed is still written."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
