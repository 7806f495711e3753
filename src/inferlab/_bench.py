"""``bench`` as a library call: a frozen config in, a summary and the records out.

The CLI only parses flags into a ``BenchConfig`` and renders what this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inferlab._clock import Clock, WallClock
from inferlab._datasets import DatasetConfig, DatasetWorkload
from inferlab._errors import InferlabError, RunFailedError, ServerUnreachableError, UsageError
from inferlab._lengths import parse_length
from inferlab._metrics import SLO, summarize
from inferlab._preflight import EXACT_LOCAL, Preflight, run_preflight
from inferlab._prompts import PromptBuilder
from inferlab._records import RequestRecord
from inferlab._results import RunWriter
from inferlab._runner import LoadConfig, run_load
from inferlab._schedule import ClosedLoop
from inferlab._sessions import SessionConfig, SessionWorkload, run_sessions
from inferlab._tokenizers import load_tokenizer
from inferlab._traces import TraceConfig, compare_with_trace
from inferlab._workload import (
    DEFAULT_PROMPT,
    Api,
    FixedPromptWorkload,
    RequestSpec,
    SharedPrefixWorkload,
    SyntheticWorkload,
    TimedSpec,
)


@dataclass(frozen=True)
class WorkloadConfig:
    """What to send, as flags give it; ``build`` makes the workload.

    One of: a ``trace`` (timed requests, replayed); shared-prefix groups
    (``prefix_groups``/``prefix_tokens``/``suffix_tokens``); synthetic prompts
    (``input_tokens``); or the fixed ``prompt``. Lengths are specs for
    ``parse_length`` (``500``, ``uniform:100:900``, ...). ``tokenizer`` is a local
    tokenizer.json (or a directory with one) that makes prompt lengths exact; with it the
    completions API gets token ids unless ``token_ids`` is off.
    """

    input_tokens: int | str | None = None
    output_tokens: int | str | None = None
    prompt: str | None = None
    exact_output: bool = True
    prefix_groups: int | None = None
    prefix_tokens: int | None = None
    suffix_tokens: int | str | None = None
    prefix_popularity: str = "uniform"
    trace: TraceConfig | None = None
    tokenizer: str | None = None
    token_ids: bool = True
    dataset: DatasetConfig | None = None
    sessions: int | None = None
    turns: int = 4
    think_time_s: float = 0.0
    system_tokens: int = 0
    context_window_tokens: int | None = None

    def builder(self, api: Api = "chat", preflight: Preflight | None = None) -> PromptBuilder:
        tok = load_tokenizer(self.tokenizer) if self.tokenizer else None
        ids = self.token_ids and api == "completions"
        return preflight.builder(tok, ids) if preflight is not None else PromptBuilder(tok, ids)

    @property
    def synthetic(self) -> bool:
        """Whether prompts are built to token lengths (rather than given as text)."""
        return self.prompt is None and self.dataset is None

    def build(
        self, seed: int, api: Api = "chat", preflight: Preflight | None = None, *, builder: PromptBuilder | None = None
    ) -> Iterator[RequestSpec] | list[TimedSpec] | SessionWorkload:
        """The workload: a list of ``TimedSpec`` for a trace, a ``SessionWorkload`` for
        multi-turn sessions, else an iterator (endless but for a dataset).
        ``preflight`` (from ``run_preflight``) says how prompts hit token lengths on the
        target server; ``builder``, when given, makes the prompts instead (``sim run``:
        the simulator's own token ids). ``UsageError`` for conflicting or malformed
        options."""
        shared = self.prefix_groups is not None or self.prefix_tokens is not None
        chosen = [n for n, on in (
            ("--trace", self.trace is not None), ("--prefix-groups/--prefix-tokens", shared),
            ("--input-tokens", self.input_tokens is not None), ("--prompt", self.prompt is not None),
            ("--dataset", self.dataset is not None), ("--sessions", self.sessions is not None),
        ) if on]
        if self.sessions is not None and self.input_tokens is not None:
            chosen.remove("--input-tokens")  # the new user message of each turn
        if len(chosen) > 1:
            raise UsageError(f"{' and '.join(chosen)} cannot be combined")
        if self.suffix_tokens is not None and not shared:
            raise UsageError("--suffix-tokens needs --prefix-tokens")
        out = None if self.output_tokens is None else parse_length(self.output_tokens, "--output-tokens")

        def prompts() -> PromptBuilder:
            return builder or self.builder(api, preflight)

        if self.trace is not None:
            if self.output_tokens is not None:
                raise UsageError("--output-tokens cannot be combined with --trace (the trace gives them)")
            return self.trace.load(prompts(), seed, self.exact_output)
        if self.sessions is not None:
            scfg = SessionConfig(
                self.sessions, self.turns, parse_length(self.input_tokens or 128, "--input-tokens"), out,
                self.think_time_s, self.system_tokens, self.context_window_tokens,
            )
            session_builder = prompts()
            session_builder.token_ids = False  # sessions send text: answers come back as text
            return SessionWorkload(scfg, session_builder, seed, self.exact_output)
        if self.dataset is not None:
            tok = load_tokenizer(self.tokenizer) if self.tokenizer else None
            rows = self.dataset.rows(tok)
            return DatasetWorkload(rows, self.dataset.sample, out, seed, self.exact_output)
        if shared:
            return iter(SharedPrefixWorkload(
                1 if self.prefix_groups is None else self.prefix_groups, self.prefix_tokens or 512,
                parse_length(self.suffix_tokens if self.suffix_tokens is not None else 64, "--suffix-tokens"),
                out, parse_popularity(self.prefix_popularity), seed, self.exact_output, prompts(),
            ))
        if self.input_tokens is not None:
            inp = parse_length(self.input_tokens, "--input-tokens")
            return iter(SyntheticWorkload(inp, out, seed, self.exact_output, prompts()))
        return iter(FixedPromptWorkload(self.prompt or DEFAULT_PROMPT, out, self.exact_output, seed))


def parse_popularity(spec: str) -> float:
    """``uniform`` → 0; ``zipf`` → 1; ``zipf:A`` → A (the Zipf exponent)."""
    kind, _, a = spec.strip().lower().partition(":")
    if kind == "uniform" and not a:
        return 0.0
    if kind == "zipf":
        try:
            value = float(a) if a else 1.0
        except ValueError:
            value = -1.0
        if value > 0:
            return value
    raise UsageError(f"--prefix-popularity {spec!r}: expected uniform, zipf or zipf:A with A > 0")


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


async def discover_model(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model id from ``GET /v1/models``; ``ServerUnreachableError`` if no
    server answers there."""
    import aiohttp  # (here: `sim run` imports this module and makes no HTTP call)

    from inferlab._client import one_line

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(
            base_url + "/models", headers=headers
        ) as resp:
            if resp.status >= 400:
                body = one_line((await resp.content.read(4096)).decode("utf-8", "replace"))
                raise InferlabError(
                    f"{base_url}/models answered HTTP {resp.status} ({body or resp.reason}): is "
                    "this an OpenAI-compatible API root? Check --url, or pass --model"
                )
            data = await resp.json(content_type=None)
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, TimeoutError) as e:
        raise ServerUnreachableError(f"cannot reach {base_url}: {e}") from e
    except (aiohttp.ClientError, ValueError) as e:
        raise ServerUnreachableError(f"unexpected answer from {base_url}/models: {e}") from e
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise UsageError(f"{base_url}/models lists no model; pass --model explicitly")
    return str(models[0]["id"])


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
    from inferlab._client import Endpoint, api_base

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
    workload = wcfg.build(config.load.seed, config.api, pre)
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
