"""``run``: one library call for ``bench`` and ``sim run`` — a run config and a target in,
a summary and the records out.

The target is an OpenAI-compatible server (``HttpTarget``: the asyncio + HTTP executor,
on the wall clock) or the simulated engine (``SimTarget``: the virtual-time executor, no
HTTP). Everything else is shared: the workload is built the same way, the same load
policy decides what is sent when, records are written as they end, and the summary is
computed and written the same way, also after an interruption. The CLI only parses
flags into these configs and renders what ``run`` returns; ``BenchConfig`` and
``bench_async`` are ``bench``'s flat form of the same call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from inferlab._clock import Clock, WallClock
from inferlab._cores import usable_cores
from inferlab._errors import ConfigError, InferlabError, RunFailedError, UsageError
from inferlab._loop import loop_name
from inferlab.client.metrics import (
    MetricsSampler,
    check_pages,
    metrics_url,
    one_name_each,
    page_url,
)
from inferlab.client.preflight import (
    APPROX_NO_PREFLIGHT,
    EXACT_LOCAL,
    EXACT_SERVER,
    ContextRule,
    Preflight,
    context_fit,
    count_prompts,
    requests_fit,
    run_preflight,
)
from inferlab.client.serverid import identify_server
from inferlab.gateway.config import AdmissionConfig
from inferlab.load.http import Outcome, ServerGoneError
from inferlab.load.monitor import autogroup_enabled
from inferlab.load.policy import Policy, SessionPolicy, UserReplayPolicy, make_policy
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Schedule
from inferlab.openai.request import Api, check_extra_body
from inferlab.openai.response import JSON_LIBRARY
from inferlab.results.clientload import (
    ClientLoad,
    ProcessLoad,
    bottleneck_warning,
    client_load,
    collapsed_gap_share,
)
from inferlab.results.metrics import SLO
from inferlab.results.provenance import ENGINE_ROUTE, GATEWAY_ROUTE
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import RunWriter, check_out_dir, plain_json
from inferlab.results.summary import (
    FOREIGN_CACHE,
    OMITTED,
    OVERLOAD,
    Omitted,
    Summary,
    SummaryExtras,
    queue_bound,
    summarize,
)
from inferlab.results.telemetry import SERVER_METRICS_FILE, GatewayQueue, ServerMetrics
from inferlab.sim.engine.bands import (
    beyond_checked,
    beyond_validated,
    calibrated_as,
    prediction_block,
    regime_of,
    served_by,
    unvalidated_switches,
)
from inferlab.sim.engine.engine import Engine, EngineConfig
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.datasets import DatasetWorkload
from inferlab.workload.prompts import PromptBuilder
from inferlab.workload.sessions import SessionWorkload
from inferlab.workload.spec import Trace
from inferlab.workload.tokenizers import Tokenizer, load_tokenizer
from inferlab.workload.traces import compare_with_trace

if TYPE_CHECKING:  # (aiohttp loads with the first HTTP call: `sim run` makes none)
    from inferlab.client.http import Endpoint

OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class RunConfig:
    """What to run, whatever the target: the load, the workload, the API, the SLOs for
    goodput, and where to write the run directory (None: nowhere; a folder that holds a
    run already only with ``overwrite``)."""

    load: LoadConfig
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    api: Api = "chat"
    slo: SLO | None = None
    out_dir: str | None = None
    overwrite: bool = False  # replace a run already in ``out_dir`` (else: UsageError)


@dataclass(frozen=True)
class HttpTarget:
    """An OpenAI-compatible server at ``url``. ``model`` None: the first one it lists.
    ``preflight``: probe it first (not counted; see ``client.preflight``)."""

    url: str
    model: str | None = None
    stream: bool = True
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    idle_timeout_s: float = 60.0
    preflight: bool = True
    embedded: bool = False  # the simulated server the CLI started (config.json's url: null)
    # worker processes that send the requests (None: as many as the load needs,
    # ``auto_workers``; 1: this process alone)
    workers: int | None = None
    # read the server's Prometheus /metrics before, during and after the run
    # (``client.metrics``; the summary's server_metrics, the run's server_metrics.jsonl)
    server_metrics: bool = True
    # the pages read for them instead of the API URL's (``--metrics-url``: the engines
    # behind a gateway, a separate metrics port), as one server's; empty: the API URL's
    metrics_urls: tuple[str, ...] = ()
    # fields merged into every request body (sampling parameters: ``check_extra_body``)
    extra_body: dict[str, Any] = field(default_factory=dict)
    # the HTTP stack (``client.exchange.HTTP_CLIENTS``; ``auto``: httptools where the ``fast``
    # extra installed it and the URL is plain http, else aiohttp)
    http_client: str = "auto"
    # the engine config ``--engine`` started this server from (``engines.launch.EngineSpec``
    # as JSON; config.json's ``engine_config``); None: a server the run did not start
    engine_config: dict[str, Any] | None = None


@dataclass(frozen=True)
class SimTarget:
    """The simulated engine in virtual time. ``offline`` None: as vLLM's offline ``LLM``
    class only for ``--rate inf`` without a concurrency cap, else behind its API server.
    ``step_log``: a file to write one JSON line per engine step to. ``replicas`` engines
    of this config run in parallel behind the router ``router``; ``split-by-length``
    sends prompts of ``long_prompt_tokens`` or more to the last ``long_replicas`` (it
    needs the threshold; no other router takes either). ``admission``: the gateway's
    admission in front of them (``inferlab.load.admitted``; None: no gateway)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    offline: bool | None = None
    step_log: str | None = None
    replicas: int = 1  # engines behind a router (``inferlab.load.replicas``)
    router: str = "round-robin"  # one of ``inferlab.gateway.routing.ROUTERS``
    admission: AdmissionConfig | None = None
    long_prompt_tokens: int | None = None  # split-by-length only
    long_replicas: int = 1  # split-by-length only


Target = HttpTarget | SimTarget


@dataclass
class RunResult:
    """A run's summary and every record (by index). ``interrupted``: it ended early;
    ``cause``: the workload's error that ended it (the caller decides whether that is a
    failure). ``url``: the API root it ran against; ``engine``: the simulated engine that
    ran (its resolved sizes), for a ``SimTarget``."""

    summary: Summary
    records: list[RequestRecord]
    interrupted: bool = False
    cause: InferlabError | None = None
    url: str | None = None
    engine: Engine | None = None


#: Runs a policy: (policy, on_record, stop) -> what happened.
_Execute = Callable[[Policy, OnRecord, "asyncio.Event | None"], Awaitable[Outcome]]


@dataclass
class _Prepared:
    """A target made ready: how prompts are built, what config.json says, how to run."""

    builder: PromptBuilder | None
    config_json: dict[str, Any]
    execute: _Execute
    workload: WorkloadConfig  # (bench: without exact output if the server refuses it)
    template_tokens: int  # what the target adds to a prompt (a trace's lengths include it)
    counter: Tokenizer | None = None  # counts a dataset's tokens without a --tokenizer
    preflight: Preflight | None = None
    url: str | None = None
    engine: Engine | None = None
    close: Callable[[], None] = lambda: None
    telemetry: _Telemetry | None = None  # the server's /metrics (runs against a server)
    preemptions: Callable[[], int] = lambda: 0  # the simulated engines', once run
    peak_running: Callable[[], int] = lambda: 0  # the most they ran at once, summed over replicas
    endpoint: Endpoint | None = None  # the server's (runs against a server)


@dataclass
class _Telemetry:
    """What the server's /metrics said over the run (filled in by ``execute``)."""

    metrics: ServerMetrics | None = None
    series: list[dict[str, Any]] = field(default_factory=list)
    gateway_queue: GatewayQueue | None = None  # inferlab gateway's queue, where its page was read


async def run(
    config: RunConfig,
    target: Target,
    *,
    clock: Clock | None = None,
    on_record: OnRecord | None = None,
    stop: asyncio.Event | None = None,
) -> RunResult:
    """Run ``config`` against ``target``; write the run directory if ``out_dir`` is set.

    ``on_record`` sees each record as its request ends; setting ``stop`` ends the run
    early (requests in flight are cancelled, the summary of the rest is still written).
    Raises ``UsageError`` for bad options, ``ServerUnreachableError`` before the run if
    no server answers, and ``RunFailedError`` after it if every measured request failed
    (the summary is written first and attached as ``summary``); an interrupted run
    returns (``interrupted``, and ``cause`` when the workload could not make a request,
    or a ``ServerGoneError`` when the server stopped answering)."""
    if config.out_dir is not None:  # (before any server is probed)
        check_out_dir(config.out_dir, config.overwrite)
    if isinstance(target, SimTarget):
        prepared = _prepare_sim(config, target)
    else:
        prepared = await _prepare_http(config, target, clock or WallClock())
    try:
        wcfg = prepared.workload
        workload = wcfg.build(
            config.load.seed, config.api, builder=prepared.builder, template_tokens=prepared.template_tokens,
            counter=prepared.counter,
        )
        if prepared.preflight is not None and prepared.endpoint is not None:  # (before any request is sent)
            prepared.preflight = await _built_fit(workload, prepared.preflight, prepared.endpoint,
                                                  _context_rule(prepared.config_json["resolved"]), wcfg)
        policy = make_policy(config.load, workload)
        writer = RunWriter(config.out_dir, prepared.config_json, overwrite=config.overwrite) if config.out_dir else None

        def record_done(r: RequestRecord) -> None:
            if writer is not None:
                writer.append(r)
            if on_record is not None:
                on_record(r)

        try:
            outcome = await prepared.execute(policy, record_done, stop)
            if isinstance(outcome.cause, ServerGoneError):  # (said in the summary, and the run fails)
                outcome.cause = ServerGoneError(outcome.cause.reason, outcome.cause.completed, config.out_dir)
                outcome.warnings.insert(0, str(outcome.cause))
            summary = run_summary(
                outcome.records, workload, config=prepared.config_json, slo=config.slo,
                interrupted=outcome.interrupted,
                preflight=prepared.preflight if isinstance(target, HttpTarget) else OMITTED, wcfg=wcfg,
                trace_positions=policy.trace_positions if isinstance(policy, UserReplayPolicy) else None,
                client=outcome.client if isinstance(target, HttpTarget) else None,
                executor_warnings=[*outcome.warnings, *(policy.warnings() if isinstance(policy, SessionPolicy) else [])],
                server_gone=isinstance(outcome.cause, ServerGoneError),
                server_metrics=None if prepared.telemetry is None else prepared.telemetry.metrics,
                gateway_queue=None if prepared.telemetry is None else prepared.telemetry.gateway_queue,
            )
            if prepared.engine is not None:  # simulated: each headline metric's error band
                block = _prediction(
                    prepared.engine, config.load, overloaded=any(w.startswith(OVERLOAD) for w in summary.warnings),
                    queue_bound=_no_place(prepared, config.load) and queue_bound(
                        summary.latency_breakdown, summary.tpot_ms.mean if summary.tpot_ms else None),
                    user_replay=isinstance(policy, UserReplayPolicy))
                block["preemptions"] = prepared.preemptions()  # (every replica's)
                done = summary.counts.completed
                beyond = beyond_validated(
                    prepared.engine.config.engine_family, block["regime"],
                    summary.input_tokens / done if done and summary.input_tokens is not None else None,
                    summary.output_tokens / done if done else None,
                ) + unvalidated_switches(prepared.engine.config) if not prepared.engine.config.efficiencies_path else []
                if _conversations(workload) and not prepared.engine.config.efficiencies_path:
                    beyond.append(UNVALIDATED_CONVERSATIONS)
                if prepared.engine.config.efficiencies_path:  # (a twin: its own runs' loads)
                    beyond += _beyond_the_twins(prepared.engine.config.efficiencies_path, config.load.schedule,
                                                config.workload)
                # (a twin's bands are its own runs')
                if beyond:
                    block["beyond_validated"] = beyond
                summary = dataclasses.replace(summary, prediction=block)
            if writer is not None:
                if prepared.telemetry is not None and prepared.telemetry.series:
                    writer.write_jsonl(SERVER_METRICS_FILE, prepared.telemetry.series)
                writer.write_summary(summary)
        finally:
            if writer is not None:
                writer.close()
    finally:
        prepared.close()
    result = RunResult(summary, outcome.records, outcome.interrupted, outcome.cause, prepared.url, prepared.engine)
    if not outcome.interrupted:
        raise_if_all_failed(result)
    return result


# --- the simulated engine -----------------------------------------------------------------


def _idle_replicas(server: object, target: SimTarget) -> list[str]:
    """The summary's warning where a replica took no request (a ``split-by-length``
    threshold no prompt reached, or every prompt did), with each one's count; none
    otherwise."""
    from inferlab.gateway.routing import SPLIT
    from inferlab.load.admitted import Admitted
    from inferlab.load.replicas import Replicas

    inner = server.engines if isinstance(server, Admitted) else server
    if not isinstance(inner, Replicas) or all(inner.sent):
        return []
    counts = ", ".join(f"{n:,}" for n in inner.sent)
    if target.router == SPLIT and target.long_prompt_tokens is not None:
        k = target.long_replicas
        short, long = sum(inner.sent[:-k]), sum(inner.sent[-k:])
        pool = ("no prompt reached the --long-prompt-tokens threshold of "
                f"{target.long_prompt_tokens:,}: the long replicas took none" if not long
                else f"every prompt was {target.long_prompt_tokens:,}+ tokens: the short replicas took none" if not short
                else "a replica took none")
        return [f"split-by-length: {pool} (requests per replica: {counts}); the run is that of fewer engines"]
    return [f"a replica took no request (requests per replica: {counts})"]




def _no_place(prepared: _Prepared, load: LoadConfig) -> bool:
    """Whether a simulated closed loop's users were more than its engines ran at once:
    some were preempted, or the most requests they ran at once (summed over replicas)
    fell short of the users (a loop of fewer requests than users: of its requests). A
    loop whose users all had a place waited only for prefill chunks and steps ahead of
    them, which the closed-loop rows measured; not past capacity, however long the wait."""
    s = load.schedule
    users = s.concurrency if isinstance(s, ClosedLoop) else s.max_concurrency if isinstance(s, OpenLoop) else None
    if prepared.preemptions() > 0:
        return True
    if not users:
        return False
    if load.num_requests is not None:
        users = min(users, load.num_requests + load.warmup)
    return prepared.peak_running() < users


def _prediction(engine: Engine, load: LoadConfig, *, overloaded: bool, queue_bound: bool = False,
                user_replay: bool = False) -> dict[str, Any]:
    """``summary.json``'s ``prediction``: the validation error of the engine family in
    the run's regime, per headline metric (``sim.engine.bands``); ``overloaded``: an open
    loop whose queues grew through the run (the summary's warning), ``queue_bound``: a
    loop whose users did not all get a place in the batch (``_no_place``) and whose TTFT
    was its wait in the server's queue (``results.summary.queue_bound``), taken for a
    closed loop's, both banded as saturated; ``user_replay``: a recorded
    closed loop replayed with its users, banded as one."""
    s = load.schedule
    # (every request at once under a concurrency cap: users in a closed loop)
    closed_loop = user_replay or isinstance(s, ClosedLoop) or (
        isinstance(s, OpenLoop) and math.isinf(s.rate_rps) and bool(s.max_concurrency))
    regime = regime_of(
        offline=bool(engine.config.offline), closed_loop=closed_loop,
        burst=isinstance(s, OpenLoop) and math.isinf(s.rate_rps),
        overloaded=overloaded or (closed_loop and queue_bound),
    )
    served = served_by(engine.config) if engine.config.efficiencies_path else None
    return prediction_block(engine.config.engine_family, regime, efficiencies=engine.config.efficiencies_path,
                            served=served)


def _beyond_the_twins(efficiencies: str, schedule: Schedule, workload: WorkloadConfig) -> list[str]:
    """Where a run of a twin is at a load beyond those its calibration's runs ran
    (``sim.engine.bands.beyond_checked``): its users (a closed loop's, an open loop's
    cap), its rate, its prompts' length as configured (as the calibration's runs are
    compared: a trace's or dataset's, or a drawn length, is not)."""
    concurrency = schedule.concurrency if isinstance(schedule, ClosedLoop) else (
        schedule.max_concurrency if isinstance(schedule, OpenLoop) else None)
    rate = schedule.rate_rps if isinstance(schedule, OpenLoop) and math.isfinite(schedule.rate_rps) else None
    tokens = None if workload.trace or workload.dataset else workload.input_tokens
    try:
        length = None if tokens is None else float(tokens)
    except ValueError:  # (a length drawn from a distribution)
        length = None
    return beyond_checked(efficiencies, concurrency, rate, length)


def sim_engine_config(load: LoadConfig, target: SimTarget, workload: WorkloadConfig | None = None) -> EngineConfig:
    """The engine a run of ``load`` (and ``workload``) on ``target`` simulates:
    ``target.engine`` with ``offline`` decided (None: offline for ``--rate inf`` without a
    concurrency cap, the offline-throughput case, but for a calibrated twin: a server's,
    served), and an offline TensorRT-LLM engine sized as trtllm-bench sizes it
    (``trtllm_bench_sized``)."""
    offline = target.offline
    if offline is None:
        offline = rate_inf_uncapped(load.schedule) and not is_twin(target.engine)
    engine = dataclasses.replace(target.engine, offline=offline)
    sized = None if workload is None else trtllm_bench_sized(engine, workload)
    return engine if sized is None else sized


def trtllm_bench_sized(engine: EngineConfig, workload: WorkloadConfig) -> EngineConfig | None:
    """An offline TensorRT-LLM ``engine`` given neither a sequence cap nor a token budget,
    for lengths given as input and output tokens: with trtllm-bench's batch and budget for
    the workload's mean lengths and the KV cache of the default sizes
    (``sizing.trtllm_bench_sizes``), as TensorRT-LLM's offline rows run in validation;
    ``sim run``, ``sweep`` and ``tune`` alike. None for any other engine or workload (a
    dataset or a trace is not read ahead; sessions, a system prompt or shared prefixes
    make prompts longer than the input tokens)."""
    from inferlab.sim.engine.families import EngineFamily
    from inferlab.sim.engine.sizing import trtllm_bench_sizes
    from inferlab.workload.lengths import parse_length

    if engine.engine_family is not EngineFamily.TRTLLM or not engine.offline:
        return None
    if engine.max_num_seqs is not None or engine.max_num_batched_tokens is not None:
        return None
    if workload.input_tokens is None or workload.output_tokens is None or workload.dataset or workload.trace:
        return None
    if workload.sessions or workload.system_tokens or workload.prefix_groups or workload.prefix_tokens:
        return None  # (a prompt is more than --input-tokens: a history, a system prompt, a shared prefix)
    isl = parse_length(workload.input_tokens).mean
    osl = parse_length(workload.output_tokens, "--output-tokens").mean
    seqs, batched = trtllm_bench_sizes(isl, osl, Engine(engine).kv_capacity_tokens)
    return dataclasses.replace(engine, max_num_seqs=seqs, max_num_batched_tokens=batched)


def rate_inf_uncapped(schedule: Schedule) -> bool:
    """Every request at once with no cap: vLLM's offline-throughput case."""
    return isinstance(schedule, OpenLoop) and math.isinf(schedule.rate_rps) and not schedule.max_concurrency


def is_twin(engine: EngineConfig) -> bool:
    """Whether ``engine`` runs a calibrated twin (``sim calibrate``'s efficiencies: a server)."""
    return engine.efficiencies_path is not None and calibrated_as(engine.efficiencies_path) is not None


def _prepare_sim(config: RunConfig, target: SimTarget) -> _Prepared:
    from inferlab.load.replicas import Replicas
    from inferlab.load.virtual import Interrupted, Served, SimulatedServer, serve
    from inferlab.workload.builtin_prompts import SimPromptBuilder
    from inferlab.workload.builtin_tokenizer import BuiltinTokenizer

    engine = Engine(sim_engine_config(config.load, target, config.workload))
    wcfg = config.workload
    tokenizer: Tokenizer | None = load_tokenizer(wcfg.tokenizer) if wcfg.tokenizer else None
    # no salt by default: the simulated engine starts each run with an empty cache
    salt = wcfg.prompt_salt or ""
    # the engine counts text prompts with its built-in tokenizer unless given one; on the
    # completions API built-in prompts can reach it as those ids, never built as text
    builder = (
        SimPromptBuilder(BuiltinTokenizer(), salt) if tokenizer is None and config.api == "completions"
        else wcfg.builder(config.api, salt=salt)
    )
    counter = tokenizer or BuiltinTokenizer()
    template_tokens = len(counter.apply_chat_template([{"role": "user", "content": ""}])) if config.api == "chat" else 0
    config_json: dict[str, Any] = {
        "command": "sim run",
        "engine": dataclasses.asdict(engine.config),  # the sizes resolved
        "load": _load_json(config.load),
        "workload": dataclasses.asdict(wcfg),
        "api": config.api,
        "trace": wcfg.trace.path if wcfg.trace is not None else None,
    }
    config_json["engine"]["gpu_preset"] = engine.gpu.name  # what a free-text --gpu ran as
    # the KV cache as sized (blocks holding tokens; vLLM's null block not counted)
    config_json["engine"]["kv_cache_blocks"] = engine.num_kv_blocks
    config_json["engine"]["kv_cache_tokens"] = engine.kv_capacity_tokens
    if target.replicas == 1 and (target.long_prompt_tokens is not None or target.long_replicas != 1):
        raise UsageError("--long-prompt-tokens and --long-replicas split --replicas: give --replicas N (2 or more)")
    if target.replicas > 1:
        from inferlab.gateway.routing import ROUTERS, SPLIT

        if target.router not in ROUTERS:
            raise UsageError(f"--router {target.router}: use one of {', '.join(ROUTERS)}")
        split = target.router == SPLIT
        if split != (target.long_prompt_tokens is not None) or (not split and target.long_replicas != 1):
            raise UsageError(f"--long-prompt-tokens and --long-replicas go with --router {SPLIT}, which needs "
                             "--long-prompt-tokens")
        if split and not 1 <= target.long_replicas < target.replicas:
            raise UsageError(f"--long-replicas {target.long_replicas}: from 1 to {target.replicas - 1} of the "
                             f"{target.replicas} replicas (at least one is left for the short prompts)")
        if target.step_log:
            raise UsageError("--step-log records one engine: it cannot be used with --replicas")
        config_json["replicas"] = {"count": target.replicas, "router": target.router}
        if target.router == SPLIT:
            config_json["replicas"].update(long_prompt_tokens=target.long_prompt_tokens, long_replicas=target.long_replicas)
    adm = target.admission
    if adm is not None:
        # the settings that act in its mode (prompts are counted exactly: no tokenizer)
        config_json["admission"] = adm.acting()
    config_json = plain_json(config_json)
    step_log = _open_step_log(target.step_log)
    made: list[Engine] = [engine]  # (every replica's engine, once the run has made them)

    async def execute(policy: Policy, on_record: OnRecord, stop: asyncio.Event | None) -> Outcome:
        # (in a worker thread: the event loop stays free to take Ctrl-C and set ``stop``)
        def go() -> Outcome:
            try:
                engines = [engine] + [Engine(engine.config) for _ in range(target.replicas - 1)]
                made[:] = engines
                servers = [
                    SimulatedServer(
                        e, chat=config.api == "chat", step_log=step_log, tokenizer=tokenizer,
                        on_record=on_record, answers=policy.wants_answers,
                    )
                    for e in engines
                ]
                server: Served = servers[0] if len(servers) == 1 else Replicas(
                    servers, target.router, target.long_prompt_tokens, target.long_replicas)
                if adm is not None:
                    server = _admitted(server, adm, len(servers))
                records = serve(server, policy, None if stop is None else stop.is_set)
            except Interrupted as e:  # what was measured is kept
                return Outcome(e.records, True, e.cause)
            return Outcome(records, warnings=_idle_replicas(server, target))

        return await asyncio.to_thread(go)

    return _Prepared(
        builder, config_json, execute, wcfg, template_tokens, counter, engine=engine,
        close=(lambda: None) if step_log is None else step_log.close,
        preemptions=lambda: sum(e.preemptions_total for e in made),
        peak_running=lambda: sum(e.peak_running for e in made),
    )


def _admitted(engines: Any, adm: AdmissionConfig, count: int) -> Any:
    """``engines`` behind the gateway's admission ``adm``, in virtual time."""
    from inferlab._clock import VirtualClock
    from inferlab.gateway.admission import Admission
    from inferlab.load.admitted import Admitted

    clock = VirtualClock()
    admission = Admission(
        adm.mode, [adm.max_tokens_in_flight] * count, [adm.max_requests_in_flight] * count,
        queue_max=adm.queue_max, queue_timeout_s=adm.queue_timeout_s, starvation_s=adm.starvation_s, clock=clock,
    )
    return Admitted(engines, admission, clock, default_max_tokens=adm.default_max_tokens)


def _open_step_log(path: str | None) -> IO[str] | None:
    if not path:
        return None
    try:
        return open(path, "w")
    except OSError as e:
        raise UsageError(f"cannot write the step log {path}: {e.strerror or e}") from e


def _load_json(load: LoadConfig) -> dict[str, Any]:
    schedule = {"kind": type(load.schedule).__name__, **dataclasses.asdict(load.schedule)}
    return {**dataclasses.asdict(load), "schedule": schedule}


# --- an OpenAI-compatible server ------------------------------------------------------------


async def _prepare_http(config: RunConfig, target: HttpTarget, clock: Clock) -> _Prepared:
    from inferlab.client.exchange import auth_headers, resolve_http_client
    from inferlab.client.http import Endpoint, api_base, discover_model
    from inferlab.load.http import run_http

    try:
        base = api_base(target.url)
        http_client = resolve_http_client(target.http_client, base)
    except ValueError as e:
        raise UsageError(str(e)) from e
    pages = metrics_pages(target.metrics_urls, target.server_metrics)
    cores = usable_cores()
    if target.workers is not None and target.workers > cores:  # (before any server is probed)
        raise UsageError(
            f"--workers {target.workers} is more than the {cores} core{'s' * (cores != 1)} this process may run on (its CPU affinity "
            "and cgroup quota): the workers would wait for a core, and every wait is in the latencies they measure"
        )
    try:
        extra_body = check_extra_body(target.extra_body)
    except ValueError as e:
        raise UsageError(f"extra_body: {e}") from None
    try:
        headers = auth_headers(dict(target.headers), target.api_key)
    except ValueError as e:
        raise UsageError(str(e)) from None
    model = target.model or await discover_model(base, headers)
    if pages:  # (pages the user named: one that does not answer is refused, not "not available")
        await check_pages(pages, headers)
    endpoint = Endpoint(
        base_url=base,
        model=model,
        api=config.api,
        stream=target.stream,
        api_key=target.api_key,
        headers=dict(target.headers),
        timeout_s=target.timeout_s,
        idle_timeout_s=target.idle_timeout_s,
        extra_body=extra_body,
    )
    wcfg = config.workload
    pre = None
    if target.preflight:
        tok = load_tokenizer(wcfg.tokenizer) if wcfg.tokenizer else None
        pre = await run_preflight(endpoint, exact_output=wcfg.exact_output, tokenizer=tok)
        if not pre.accepts_exact_output:
            wcfg = dataclasses.replace(wcfg, exact_output=False)
    # fresh prompts each run unless a salt is given: a rerun must not hit the prefix
    # cache the last run left on the server
    salt = wcfg.prompt_salt if wcfg.prompt_salt is not None else secrets.token_hex(4)
    builder = wcfg.builder(config.api, salt=salt) if pre is None else wcfg.builder(
        config.api, vocab=pre.vocab, tokens_per_word=pre.tokens_per_word, salt=salt
    )
    template_tokens = (pre.prompt_overhead_tokens or 0) if pre is not None else 0
    workers = target.workers if target.workers is not None else auto_workers(config.load)
    if workers < 1:
        raise UsageError("--workers must be at least 1")
    # the simulated server says which engine it ran (a replay can run the same one), the
    # gateway in front of it that all its upstreams are one; other servers: null
    simulated = await _inferlab_answer(base, ENGINE_ROUTE, endpoint.request_headers())
    resolved = {
        "url": base, "model": model, "prompt_salt": salt, "workers": workers,
        "engine": simulated,
        # inferlab gateway's setup, whatever its upstreams are (null: no gateway said so)
        "gateway": await _inferlab_answer(base, GATEWAY_ROUTE, endpoint.request_headers()),
        # what a measured server says it is, and its release (vLLM, SGLang, llama.cpp;
        # null for any other): sim calibrate takes a twin's release from it
        "server_software": None if simulated is not None else await identify_server(base, endpoint.request_headers()),
        # what the client ran on (the ``fast`` extra's uvloop, orjson and httptools, where
        # installed)
        "client_stack": {"loop": loop_name(), "json": JSON_LIBRARY, "http": http_client},
        # the pages the summary's server_metrics were read from (null: not read)
        "metrics_urls": (list(pages) or [metrics_url(base)]) if target.server_metrics else None,
    }
    config_json = {**http_config_json(config, target), "resolved": resolved}
    if pre is not None:  # (before any request: a run whose every request fails is refused)
        unfit = context_fit(wcfg, pre, _context_rule(resolved))
        if unfit is not None:
            pre = dataclasses.replace(pre, warnings=[*pre.warnings, unfit])

    telemetry = _Telemetry() if target.server_metrics else None

    async def execute(policy: Policy, on_record: OnRecord, stop: asyncio.Event | None) -> Outcome:
        sampler = None
        if telemetry is not None:
            sampler = MetricsSampler(base, clock, endpoint.request_headers(), pages=pages)
            await sampler.start()
        try:
            warm = _parallelism(config.load)
            if workers > 1:
                from inferlab.load.workers import run_workers

                return await run_workers(
                    endpoint, policy, clock, workers=workers, warm_connections=warm, on_record=on_record, stop=stop,
                    http_client=http_client,
                )
            return await run_http(
                endpoint, policy, clock, warm_connections=warm, on_record=on_record, stop=stop, http_client=http_client,
            )
        finally:
            if sampler is not None and telemetry is not None:
                telemetry.metrics = await sampler.stop()
                telemetry.series = sampler.series
                telemetry.gateway_queue = sampler.gateway_queue()

    return _Prepared(
        builder, config_json, execute, wcfg, template_tokens, preflight=pre, url=base, telemetry=telemetry,
        endpoint=endpoint,
    )


def metrics_pages(urls: Sequence[str], server_metrics: bool) -> tuple[str, ...]:
    """The ``--metrics-url`` pages, checked (``client.metrics.page_url``); ``UsageError``
    for a bad one, or with ``--no-server-metrics`` (nothing would read them)."""
    if not urls:
        return ()
    if not server_metrics:
        raise UsageError("--metrics-url names pages to read and --no-server-metrics reads none: give one of them")
    try:
        pages = tuple(dict.fromkeys(page_url(u) for u in urls))
        one_name_each(pages)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return pages


#: The most dataset rows counted with the server's /tokenize to check them against its
#: context (a request each); a larger dataset is not checked there.
MAX_COUNTED_ROWS = 10_000


async def _built_fit(
    workload: object, pre: Preflight, endpoint: Endpoint, context: ContextRule | None, wcfg: WorkloadConfig,
) -> Preflight:
    """``pre`` with ``requests_fit``'s warning for a built trace (its rows' lengths, as
    built) or dataset (its rows counted: with --tokenizer, their text, a lower bound
    for a row of several messages, whose template tokens are per message; else with the
    server's /tokenize, as sent, up to ``MAX_COUNTED_ROWS`` rows); ``UsageError`` where
    none fits."""
    if context is None or pre.input_length_source not in (EXACT_LOCAL, EXACT_SERVER):
        return pre
    unfit = None
    if isinstance(workload, Trace) and wcfg.trace is not None:
        lengths = [(t.spec.input_tokens or 1, t.spec.max_tokens) for t in workload.requests]
        unfit = requests_fit(lengths, wcfg.exact_output, pre, context, wcfg.trace.path)
    elif isinstance(workload, DatasetWorkload) and wcfg.dataset is not None:
        rows, name = workload.rows, wcfg.dataset.path
        specs = [r.spec(None, False) for r in rows]
        if wcfg.tokenizer:
            tok = load_tokenizer(wcfg.tokenizer)
            counts = [len(tok.encode(r.text())) for r in rows]
            unfit = requests_fit([(n, None) for n in counts], False, pre, context, name,
                                 at_least=any(len(r.messages) > 1 for r in rows))
        elif pre.has_tokenize and len(rows) <= MAX_COUNTED_ROWS:
            sent = await count_prompts(endpoint, specs)
            if sent is not None:
                unfit = requests_fit([(n, None) for n in sent], False, pre, context, name,
                                     overhead=0 if endpoint.api == "chat" else None)
    return pre if unfit is None else dataclasses.replace(pre, warnings=[*pre.warnings, unfit])


def _context_tokens(resolved: dict[str, Any]) -> int | None:
    """The context the server states (``max_model_len``): a measured server's settings
    (``client.serverid``), or the simulated server's engine; None where neither says.
    Through inferlab gateway, the context the gateway states for the model (its setup's
    ``max_model_len``: the largest of its upstreams', where each states one), and only
    that: its model card and engine routes are its upstreams'."""
    gateway = resolved.get("gateway")
    if isinstance(gateway, dict):
        stated = gateway.get("max_model_len")
        length = stated.get(resolved.get("model")) if isinstance(stated, dict) else None
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    settings = (resolved.get("server_software") or {}).get("settings") or {}
    for length in (settings.get("max_model_len"), (resolved.get("engine") or {}).get("max_model_len")):
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return length
    return None


def _context_rule(resolved: dict[str, Any]) -> ContextRule | None:
    """How the server treats a request at its context (``_context_tokens``): SGLang's
    rule where the server said it is SGLang (``client.serverid``: its release and KV
    pool as stated) or the simulated server runs the ``sglang`` family (its release as
    given; its pool taken as no smaller than the context), else vLLM's; None where no
    context is known."""
    from inferlab.openai.context import SGLangLimits
    from inferlab.sim.engine.config import release_with_patch

    length = _context_tokens(resolved)
    if length is None:
        return None
    software = resolved.get("server_software") or {}
    engine = resolved.get("engine") or {}
    if isinstance(resolved.get("gateway"), dict):  # (its upstreams' software is not known here)
        software, engine = {}, {}
    if software.get("name") == "SGLang":
        version, pool = software.get("version"), (software.get("settings") or {}).get("kv_cache_tokens")
    elif engine.get("engine_family") == "sglang":
        version, pool = engine.get("engine_version"), None
    else:
        return ContextRule.vllm(length)
    try:
        release = release_with_patch(version) if isinstance(version, str) else None
    except ConfigError:
        release = None
    pool = pool if isinstance(pool, int) and not isinstance(pool, bool) and pool > 0 else None
    return ContextRule.sglang(SGLangLimits(length, pool, release), version if release is not None else None)


async def _inferlab_answer(base: str, route: str, headers: dict[str, str]) -> dict[str, Any] | None:
    """What the server answers at one of inferlab's own routes: ``ENGINE_ROUTE`` (``sim
    serve``: its engine configuration; the gateway in front of it:
    ``results.provenance.gateway_answer``), ``GATEWAY_ROUTE`` (the gateway's setup);
    ``None`` from any other server. Best effort, never raises."""
    import aiohttp

    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with aiohttp.ClientSession() as session, session.get(
            base.removesuffix("/v1") + route, headers=headers, timeout=aiohttp.ClientTimeout(total=5)
        ) as resp:
            if resp.status == 200:
                data = await resp.json(content_type=None)
                if isinstance(data, dict):
                    return data
    return None


def _parallelism(load: LoadConfig) -> int:
    """How many requests may be in flight at once, as far as the load says."""
    s = load.schedule
    n = s.concurrency if isinstance(s, ClosedLoop) else (s.max_concurrency or 1)
    return min(n, load.num_requests or n)


#: Concurrent streams one client process carries without adding latency of its own, about
#: (bench/client_scale.py: client TTFT minus the server's grows past ~1 ms beyond it).
STREAMS_PER_WORKER = 128
#: Open-loop requests per second one client process starts without falling behind, about.
RATE_PER_WORKER = 200.0


def auto_workers(load: LoadConfig, cores: int | None = None) -> int:
    """How many worker processes a load needs: 1 (this process) unless its concurrent
    streams or its rate exceed what one process carries, and never more than the cores
    this process may run on (``usable_cores``), less one for the parent."""
    cores = cores if cores is not None else usable_cores()
    s = load.schedule
    if isinstance(s, ClosedLoop):
        need = s.concurrency / STREAMS_PER_WORKER
    elif isinstance(s, OpenLoop) and not math.isinf(s.rate_rps):
        need = max(s.rate_rps / RATE_PER_WORKER, (s.max_concurrency or 0) / STREAMS_PER_WORKER)
    else:  # all at once, or a trace: what is in flight is bounded by the cap, if any
        need = (getattr(s, "max_concurrency", None) or STREAMS_PER_WORKER) / STREAMS_PER_WORKER
    return max(1, min(math.ceil(need), cores - 1))


def http_config_json(config: RunConfig, target: HttpTarget) -> dict[str, Any]:
    """config.json of a run against a server (secrets redacted), in ``BenchConfig``'s
    field order."""
    d: dict[str, Any] = {
        "load": _load_json(config.load),
        "workload": dataclasses.asdict(config.workload),
        "url": None if target.embedded else target.url,
        "model": target.model,
        "api": config.api,
        "stream": target.stream,
        "api_key": "***" if target.api_key else None,
        "headers": {k: ("***" if _secret_header(k) else v) for k, v in target.headers},
        "timeout_s": target.timeout_s,
        "idle_timeout_s": target.idle_timeout_s,
        "slo": None if config.slo is None else dataclasses.asdict(config.slo),
        "out_dir": config.out_dir,
        "preflight": target.preflight,
        "extra_body": target.extra_body,
        "http_client": target.http_client,
        "metrics_urls": list(target.metrics_urls),
        **({"engine_config": target.engine_config} if target.engine_config is not None else {}),
    }
    out: dict[str, Any] = plain_json(d)
    return out


#: A header whose name contains one of these (case-insensitive) is redacted in config.json.
_SECRET_HEADER_PARTS = ("authorization", "api-key", "api_key", "apikey", "token", "secret", "cookie", "password", "key")


def _secret_header(name: str) -> bool:
    lower = name.lower()
    return any(part in lower for part in _SECRET_HEADER_PARTS)


@dataclass(frozen=True)
class BenchConfig:
    """``inferlab bench`` in one flat config: a ``RunConfig`` and an ``HttpTarget``
    whose URL is given to ``bench_async`` (``url`` here is what the user asked for;
    None: the embedded simulated server the CLI starts)."""

    load: LoadConfig
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    url: str | None = None
    model: str | None = None  # None: the first model the server lists
    api: Api = "chat"
    stream: bool = True
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    idle_timeout_s: float = 60.0
    slo: SLO | None = None
    out_dir: str | None = None
    preflight: bool = True  # probe the server first (not counted); see ``client.preflight``
    overwrite: bool = False
    workers: int | None = None  # see ``HttpTarget``
    server_metrics: bool = True  # see ``HttpTarget``
    metrics_urls: tuple[str, ...] = ()  # see ``HttpTarget``
    extra_body: dict[str, Any] = field(default_factory=dict)  # see ``HttpTarget``
    http_client: str = "auto"  # see ``HttpTarget``
    engine_config: dict[str, Any] | None = None  # see ``HttpTarget``

    def run_config(self) -> RunConfig:
        return RunConfig(self.load, self.workload, self.api, self.slo, self.out_dir, self.overwrite)

    def target(self, url: str) -> HttpTarget:
        return HttpTarget(
            url, self.model, self.stream, self.api_key, self.headers, self.timeout_s, self.idle_timeout_s,
            self.preflight, embedded=self.url is None, workers=self.workers, server_metrics=self.server_metrics,
            metrics_urls=self.metrics_urls, extra_body=self.extra_body, http_client=self.http_client, engine_config=self.engine_config,
        )

    def to_json(self) -> dict[str, Any]:
        """config.json's form of this config (secrets redacted)."""
        return http_config_json(self.run_config(), self.target(self.url or ""))


async def bench_async(
    config: BenchConfig,
    url: str,
    *,
    clock: Clock | None = None,
    on_record: OnRecord | None = None,
    stop: asyncio.Event | None = None,
) -> RunResult:
    """``run`` against the server at ``url``; see ``run``. config.json records
    ``config.url`` (what was asked) and the URL it resolved to."""
    return await run(config.run_config(), config.target(url), clock=clock, on_record=on_record, stop=stop)


# --- the summary --------------------------------------------------------------------------


def run_summary(
    records: list[RequestRecord],
    workload: object,
    *,
    config: dict[str, Any],
    slo: SLO | None,
    interrupted: bool,
    preflight: Preflight | Omitted | None = OMITTED,
    wcfg: WorkloadConfig | None = None,
    client: Sequence[ProcessLoad] | None = None,
    server_metrics: ServerMetrics | None = None,
    gateway_queue: GatewayQueue | None = None,
    trace_positions: Sequence[int] | None = None,
    executor_warnings: Sequence[str] = (),
    server_gone: bool = False,
) -> Summary:
    """The summary of a run of ``workload``, ``bench`` and ``sim run`` alike: the
    metrics, a replayed trace's own measurements compared, a dataset's caveats and, for
    a run against a server (``preflight`` given, None: no probe), what the probe learned
    about ``wcfg``'s prompts and, from ``client``, whether the client kept up.
    ``trace_positions``: each send's position in the trace, when not its index;
    ``executor_warnings``: what the executor saw (``Outcome.warnings``); ``server_metrics``
    and ``gateway_queue``: what the server's /metrics said over the run; ``server_gone``:
    the run stopped because the server stopped answering (its final streak of failures
    is said apart)."""
    trace = compare_with_trace(records, workload.requests, trace_positions) if isinstance(workload, Trace) else OMITTED
    last = [*executor_warnings, *(workload.warnings() if isinstance(workload, DatasetWorkload) else []),
            *(workload.notes if isinstance(workload, Trace) else ())]
    if wcfg is not None:
        last += _words_as_tokens(wcfg)
    if _conversations(workload) and config.get("api") == "completions":
        last.append(
            "multi-turn sessions through the completions API: each turn's prompt is the messages joined by blank "
            "lines, so the server's prefix cache finds the earlier prompts but not its own answers (on a real "
            "server too); --api chat sends the conversation as chat applications do"
        )
    overhead = preflight.prompt_overhead_tokens if isinstance(preflight, Preflight) else None
    if wcfg is None or (wcfg.shares_prefixes and not wcfg.fixed_prompt):
        unintended = None
    else:
        # (against a server, a salt given repeats an earlier run's prompts: --seed)
        repeated = preflight is not OMITTED and wcfg.prompt_salt is not None
        unintended = _unintended_cache_hits(records, overhead, wcfg.fixed_prompt, server_metrics, repeated)
    if unintended is not None:
        last.append(unintended)
    load: ClientLoad | Omitted | None = OMITTED
    if client is not None:
        load = client_load(client)
        workers = config.get("resolved", {}).get("workers") or 1
        collapsed = collapsed_gap_share([r.content_ns for r in records if r.ok and not r.warmup])
        warning = None if load is None else bottleneck_warning(
            load, workers, usable_cores(), autogroup_enabled(), collapsed_share=collapsed)
        if warning is not None:
            last.insert(0, warning)
    metrics: ServerMetrics | Omitted = OMITTED if server_metrics is None else server_metrics
    queue: GatewayQueue | Omitted = OMITTED if gateway_queue is None else gateway_queue
    if preflight is OMITTED or wcfg is None:
        extras = SummaryExtras(trace_comparison=trace, client=load, server_metrics=metrics, gateway_queue=queue,
                               warnings_last=tuple(last), server_gone=server_gone)
    else:
        pre = preflight
        if not wcfg.synthetic:
            source = "prompt text as given"
        elif wcfg.tokenizer:
            source = EXACT_LOCAL
        else:
            source = APPROX_NO_PREFLIGHT if pre is None else pre.input_length_source
        if wcfg.synthetic and source.startswith("approximate"):
            last.append(f"prompt lengths are {source}")
        extras = SummaryExtras(
            trace_comparison=trace,
            prompt_overhead_tokens=None if pre is None else pre.prompt_overhead_tokens,
            input_length_source=source,
            preflight=None if pre is None else pre.to_json(),
            client=load,
            server_metrics=metrics,
            gateway_queue=queue,
            warnings_first=() if pre is None else tuple(pre.warnings),
            warnings_last=tuple(last),
            server_gone=server_gone,
        )
    return summarize(records, config=config, slo=slo, interrupted=interrupted, extras=extras)


def _words_as_tokens(wcfg: WorkloadConfig) -> list[str]:
    """The warnings for ``empirical:FILE`` lengths: a dataset file's word counts, drawn
    as token counts (``empirical:sharegpt`` is the shipped token lengths)."""
    out = []
    for flag, spec in (("--input-tokens", wcfg.input_tokens), ("--output-tokens", wcfg.output_tokens),
                       ("--suffix-tokens", wcfg.suffix_tokens)):
        if isinstance(spec, str) and spec.strip().lower().startswith("empirical:") and \
                spec.strip().lower() != "empirical:sharegpt":
            what = ("its answers' lengths (a ShareGPT file's) are word counts, taken as tokens (words undercount "
                    "tokens); its max_tokens/output_tokens are tokens" if flag == "--output-tokens" else
                    "the file's prompt lengths are word counts, taken as tokens (words undercount tokens)")
            out.append(f"{flag} {spec}: {what}")
    return out


def _conversations(workload: object) -> bool:
    """Whether ``workload``'s later prompts hold earlier turns (sessions of 2+ turns)."""
    return isinstance(workload, SessionWorkload) and workload.config.turns > 1


#: The ``validated?`` sentence of a simulated multi-turn run: the bands come from rows that
#: are no conversations (docs/validation.md, "Answers a conversation sends back").
UNVALIDATED_CONVERSATIONS = (
    "its prompts hold earlier turns of their conversations: no validated row is a conversation whose turns wait for "
    "their answers, so the bands were measured on prompts the prefix cache did not serve from an earlier turn"
)


#: Cached prompt tokens beyond a template's, as a share of all prompt tokens, above which
#: a workload whose prompts share nothing was measured against a warm cache.
UNINTENDED_CACHE_SHARE = 0.05


def _unintended_cache_hits(
    records: list[RequestRecord], template_tokens: int | None, fixed: bool = False,
    server_metrics: ServerMetrics | None = None, repeated: bool = False,
) -> str | None:
    """A warning when the server served much of the prompts from its cache (beyond the
    chat template's tokens, which every prompt shares): for a prefix-free workload an
    earlier run with the same seed, or another client, left them there; for a ``fixed``
    prompt (the same every request) the run's own first request did. Where no answer said
    its cached tokens (vLLM's default: ``prompt_tokens_details`` only with
    ``--enable-prompt-tokens-details``), the server's own /metrics counters over the run
    say it instead, warm-ups included. Where neither says (a gateway in front, whose
    /metrics are its own, without ``--metrics-url``; a server without those counters), a ``fixed`` prompt, or
    prompts ``repeated`` from an earlier run (a salt given: ``--seed``), are said to be
    unchecked rather than passed over in silence."""
    template = max(0, template_tokens or 0)
    done = [r for r in records if r.ok and not r.warmup and r.cached_tokens is not None]
    if done:
        cached = sum(r.cached_tokens or 0 for r in done)
        prompt = sum(r.input_tokens or 0 for r in done)
        # (each answer's hits beyond the template: one that missed, the first of its
        # slot or of the run, takes nothing off another's)
        beyond = sum(max(0, (r.cached_tokens or 0) - template) for r in done)
        served = f"the server served {cached:,} of {prompt:,} prompt tokens from its prefix cache"
        unsaid = ""
    else:
        counted = None if server_metrics is None else server_metrics.prefix_cache_tokens()
        if counted is None:
            return _unchecked_cache_hits(fixed, repeated) if any(r.ok and not r.warmup for r in records) else None
        cached, prompt = counted
        answered = sum(1 for r in records if r.ok)  # (warm-ups too: the counters hold them)
        beyond = cached - answered * template
        warm = " (warm-ups included)" if any(r.warmup for r in records) else ""  # (as the tokens row says)
        served = (f"the server's /metrics counted {cached:,} of {prompt:,} prompt tokens over the run{warm} as served "
                  "from its prefix cache")
        unsaid = "; its answers did not say their cached tokens, as " + (
            "SGLang's do not without --enable-cache-report" if server_metrics is not None and server_metrics.server == "sglang"
            else "vLLM's do not without --enable-prompt-tokens-details")
    if not prompt or beyond <= UNINTENDED_CACHE_SHARE * prompt:
        return None
    if fixed:
        return (
            f"{served}: every request sent the same prompt (--prompt, or the default), so TTFT is that of "
            f"a cached prompt; --input-tokens N sends fresh prompts of N tokens{unsaid}"
        )
    return (
        f"{served}, {FOREIGN_CACHE}: TTFT is lower than for fresh prompts (an "
        f"earlier run with the same --seed, or another client, sent the same text{unsaid})"
    )


#: Why a run could not tell its prompts' prefix-cache hits.
CACHE_UNSAID = (
    "neither the answers nor the server's /metrics said how many prompt tokens its prefix cache served (vLLM's "
    "answers say with --enable-prompt-tokens-details; behind a gateway, whose /metrics are its own, "
    "--metrics-url ENGINE/metrics reads the engine's)"
)


def _unchecked_cache_hits(fixed: bool, repeated: bool) -> str | None:
    """What a run whose cached tokens nobody said cannot rule out: a ``fixed`` prompt is
    served from a prefix cache after its first request (vLLM and SGLang cache prefixes by
    default); ``repeated`` prompts may be, if an earlier run sent them. None otherwise."""
    if fixed:
        return (
            "every request sent the same prompt (--prompt, or the default): a server that caches prefixes "
            "serves it from its cache after the first request, so TTFT is likely that of a cached prompt, and "
            f"this run cannot tell: {CACHE_UNSAID}; --input-tokens N sends fresh prompts of N tokens"
        )
    if repeated:
        return (
            "this run's prompts are those of any earlier run with the same --seed, which the server's prefix "
            f"cache may still hold (a lower TTFT than fresh prompts'), and this run cannot tell: {CACHE_UNSAID}; "
            "without --seed each run's prompts are fresh"
        )
    return None


def raise_if_all_failed(result: RunResult) -> None:
    """``RunFailedError`` (exit 1, one line) when requests failed and none completed."""
    c = result.summary.counts
    if c.completed == 0 and c.failed > 0:
        kind, msg = next(iter(result.summary.error_examples.items()))
        raise RunFailedError(f"all {c.failed} requests failed; first {kind}: {msg}", result.summary, result=result)
