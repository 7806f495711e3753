"""What-ifs in virtual time: a run's workload again, on the engine it ran on, with one
change (an engine flag, or the workload's), to predict what the change would gain.

The workload is rebuilt from the run's ``config.json`` (the same load, the same workload
flags and seed: prefixes shared as they were, sessions as they were); where that cannot
be rebuilt, its ``requests.jsonl`` is replayed (each request at its intended time with
its lengths; shared prefixes are then lost). The engine is the one a run against the
simulated server recorded (``resolved.engine``) or a ``sim run`` ran; for any other
server there is none, and no prediction is made. Nor through ``inferlab gateway`` in
front of simulated servers: its cache, admission and routing ran too, and a rerun on one
bare engine would be another setup (``results.provenance``). Both sides of a comparison
are simulated: the delta is a prediction, never mixed with the measured numbers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferlab._errors import InferlabError
from inferlab.gateway.config import AdmissionConfig
from inferlab.gateway.routing import replicas_words
from inferlab.load.run import RunConfig, RunResult, SimTarget, run
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop, Replay, Schedule
from inferlab.results.provenance import GATEWAY, server_info, simulated_engine
from inferlab.results.records import RequestRecord
from inferlab.sim.engine.engine import EngineConfig
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.datasets import DatasetConfig
from inferlab.workload.traces import TraceConfig

#: Recorded engine settings a what-if does not take as they are: the GPU is the preset it
#: resolved to (and offline, whether the run had an API server, is kept as the run had
#: it: a served burst reruns served, its front end with it)
_NOT_REPLAYED = frozenset({"gpu", "gpu_preset"})


def engine_of(config: Mapping[str, Any]) -> EngineConfig | None:
    """The engine a run ran on: a ``sim run``'s ``engine``, or the simulated server's
    ``resolved.engine`` a ``bench`` recorded; None for any other server."""
    engine = simulated_engine(config)
    if engine is None:
        return None
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - _NOT_REPLAYED
    kw = {k: v for k, v in engine.items() if k in fields}
    kw["gpu"] = engine.get("gpu_preset") or engine.get("gpu") or EngineConfig().gpu
    try:
        return EngineConfig(**kw)
    except (TypeError, ValueError, InferlabError):
        return None


def admission_of(config: Mapping[str, Any]) -> AdmissionConfig | None:
    """The gateway admission a ``sim run`` ran behind (its config.json's ``admission``:
    the settings that act in its mode; the rest default); None without one."""
    adm = config.get("admission")
    if not isinstance(adm, dict) or adm.get("mode") in (None, "off"):
        return None
    fields = {f.name for f in dataclasses.fields(AdmissionConfig)}
    try:
        return AdmissionConfig(**{k: v for k, v in adm.items() if k in fields})
    except (TypeError, ValueError):
        return None


def _schedule(d: Mapping[str, Any]) -> Schedule:
    kind = d.get("kind")
    fields = {k: v for k, v in d.items() if k != "kind"}
    if kind == "ClosedLoop":
        return ClosedLoop(int(fields["concurrency"]))
    if kind == "OpenLoop":
        rate = fields["rate_rps"]
        rate = math.inf if rate in ("inf", "Infinity") else float(rate)
        burst = fields.get("burstiness", 1.0)
        burst = math.inf if burst in ("inf", "Infinity") else float(burst)
        return OpenLoop(rate, fields.get("arrival", "poisson"), burst, fields.get("max_concurrency"))
    if kind == "Replay":
        return Replay(fields.get("max_concurrency"))
    raise ValueError(f"unknown schedule {kind!r}")


def rerun_config(config: Mapping[str, Any]) -> RunConfig:
    """The run's load and workload as a ``RunConfig`` (no output folder, no salt: the
    simulated engine starts empty); ``ValueError``/``KeyError``/``TypeError`` or a
    ``UsageError`` when config.json does not hold them."""
    load = config["load"]
    lc = LoadConfig(
        _schedule(load["schedule"]), load.get("num_requests"), load.get("duration_s"),
        int(load.get("warmup") or 0), int(load.get("seed") or 0),
    )
    w = dict(config["workload"])
    fields = {f.name for f in dataclasses.fields(WorkloadConfig)}
    w = {k: v for k, v in w.items() if k in fields}
    if isinstance(w.get("trace"), dict):
        w["trace"] = TraceConfig(**w["trace"])
    if isinstance(w.get("dataset"), dict):
        w["dataset"] = DatasetConfig(**w["dataset"])
    w["prompt_salt"] = None
    return RunConfig(lc, WorkloadConfig(**w), config.get("api") or "chat")


def replay_config(run_dir: Path, api: str = "chat") -> RunConfig:
    """The run's ``requests.jsonl`` replayed at its intended send times."""
    trace = TraceConfig(str(run_dir / "requests.jsonl"), "requests")
    return RunConfig(LoadConfig(Replay()), WorkloadConfig(trace=trace), "chat" if api != "completions" else "completions")


@dataclass(frozen=True)
class Routing:
    """How many engines a what-if runs and the router in front of them (``SimTarget``'s
    fields of the same names)."""

    replicas: int
    router: str = "round-robin"
    long_prompt_tokens: int | None = None  # split-by-length only
    long_replicas: int = 1

    def words(self, of: str) -> str:
        """'2 replicas of ``of`` (router ...)' (``routing.replicas_words``)."""
        return replicas_words({"count": self.replicas, "router": self.router, "long_prompt_tokens": self.long_prompt_tokens,
                               "long_replicas": self.long_replicas}, of)


@dataclass
class Simulated:
    """One what-if's outcome: its records (measured ones), and how it was made."""

    records: list[RequestRecord]
    result: RunResult


def _named(config: Mapping[str, Any]) -> str:
    """' (llama.cpp; started from a llamacpp engine config)': what a run says its real server was
    (the software it said it is, the engine inferlab started), in words; '' where nothing."""
    resolved = config.get("resolved")
    software = resolved.get("server_software") if isinstance(resolved, dict) else None
    name = software.get("name") if isinstance(software, dict) else None
    started = config.get("engine_config")
    kind = started.get("engine") if isinstance(started, dict) else None
    said = [str(name)] if name else []
    if kind:
        said.append(f"started from a {kind} engine config")
    return f" ({'; '.join(said)})" if said else ""


class WhatIf:
    """A run's workload on its engine, with changes (results cached by change)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        self.run_dir = run_dir
        self.engine = engine_of(config)
        #: why there is no what-if, and what would give one ('' when there is one)
        self.why_not = ""
        if self.engine is None and server_info(config).kind == GATEWAY:
            self.why_not = ("the run went through inferlab gateway, whose cache, admission and routing a rerun on one "
                            "engine would leave out (run the workload against `inferlab sim serve` itself)")
        elif self.engine is None and "gateway" in config and "command" not in config:
            self.why_not = ("a gateway's access log does not say which engine answered (replay its requests.jsonl "
                            "with `inferlab sim run --trace` and the engine's model, GPU and flags for predictions)")
        elif self.engine is None:
            self.why_not = (f"the simulator has no model of the run's server{_named(config)}: profile it, or run the "
                            "workload against `inferlab sim serve`")
        # a sim run over several engines behind a router, or behind the gateway's
        # admission: the what-if keeps them (a change is made to that setup, not to one engine)
        replicas = config.get("replicas") if config.get("command") == "sim run" else None
        self.routing = Routing(1)
        if isinstance(replicas, dict):
            tokens = replicas.get("long_prompt_tokens")
            self.routing = Routing(int(replicas["count"]), str(replicas["router"]),
                                   None if tokens is None else int(tokens), int(replicas.get("long_replicas") or 1))
        self.admission = admission_of(config) if config.get("command") == "sim run" else None
        # a trace the run read is a file outside it that may have moved or changed since
        # (and a relative path is the run's working folder's): what the run sent is its
        # own requests.jsonl; so for a dataset no longer where it was
        given = config.get("workload")
        workload: Mapping[str, Any] = given if isinstance(given, dict) else {}
        dataset: Mapping[str, Any] = workload["dataset"] if isinstance(workload.get("dataset"), dict) else {}
        elsewhere = bool(workload.get("trace")) or bool(dataset.get("path") and not Path(str(dataset["path"])).exists())
        try:
            if elsewhere:
                raise ValueError("the run read a file outside it")
            self.base: RunConfig = rerun_config(config)
            self.method = "the run's workload and load, rerun"
        except (ValueError, KeyError, TypeError, InferlabError):
            self.base = replay_config(run_dir, str(config.get("api") or "chat"))
            self.method = "the run's requests.jsonl replayed at its send times (shared prefixes not kept)"
        self._cache: dict[tuple[Any, ...], Simulated] = {}

    @property
    def replicas(self) -> int:
        return self.routing.replicas

    @property
    def router(self) -> str:
        return self.routing.router

    @property
    def available(self) -> bool:
        return self.engine is not None

    def describe_engine(self) -> str:
        e = self.engine
        if e is None:
            return "none"
        where = f"{e.model} on {e.tensor_parallel_size}x {e.gpu}"
        if self.replicas > 1:
            where = f"{e.model} on {self.routing.words(f'{e.tensor_parallel_size}x {e.gpu}')}"
        if self.admission is not None:
            where += f", behind the gateway's admission by {self.admission.mode}"
        return where

    def simulate(
        self, engine: Mapping[str, Any] | None = None, workload: Mapping[str, Any] | None = None,
        admission: AdmissionConfig | None = None, routing: Routing | None = None,
    ) -> Simulated:
        """The workload in virtual time with ``engine`` and ``workload`` fields changed,
        and ``admission`` (``inferlab gateway``'s, its own code; None: the run's own, if
        it had one) in front of the engine(s), as many as ``routing`` says behind its
        router (None: the run's);
        ``InferlabError`` when the run's engine is not simulated or the change is refused."""
        if self.engine is None:
            raise InferlabError(self.why_not)
        routing = routing or self.routing
        key = (tuple(sorted((engine or {}).items())), tuple(sorted((workload or {}).items())), admission, routing)
        if key not in self._cache:
            try:
                e = dataclasses.replace(self.engine, **dict(engine or {}))
                cfg = self.base if not workload else dataclasses.replace(
                    self.base, workload=dataclasses.replace(self.base.workload, **dict(workload))
                )
            except (TypeError, ValueError) as err:
                raise InferlabError(f"cannot simulate that change: {err}") from err
            try:
                target = SimTarget(e, offline=bool(e.offline), admission=admission if admission is not None else self.admission,
                                   **dataclasses.asdict(routing))
                result = asyncio.run(run(cfg, target))
            except ValueError as err:
                raise InferlabError(f"the simulator refused the change: {err}") from err
            self._cache[key] = Simulated([r for r in result.records if not r.warmup], result)
        return self._cache[key]

    def alone(self, input_tokens: int, output_tokens: int, n: int = 3) -> Simulated:
        """``n`` requests of ``input_tokens`` / ``output_tokens`` (answers to their
        length), one at a time on the run's engine (its replicas, router and admission
        kept): what one request takes with nothing queued beside it, the floor no load
        setting goes below. ``InferlabError`` as ``simulate``."""
        if self.engine is None:
            raise InferlabError(self.why_not)
        key = ("alone", input_tokens, output_tokens, n)
        if key not in self._cache:
            cfg = RunConfig(LoadConfig(ClosedLoop(1), num_requests=n),
                            WorkloadConfig(input_tokens=input_tokens, output_tokens=output_tokens, exact_output=True),
                            self.base.api)
            try:
                target = SimTarget(self.engine, offline=bool(self.engine.offline), admission=self.admission,
                                   **dataclasses.asdict(self.routing))
                result = asyncio.run(run(cfg, target))
            except ValueError as err:
                raise InferlabError(f"the simulator refused one request alone: {err}") from err
            self._cache[key] = Simulated([r for r in result.records if not r.warmup], result)
        return self._cache[key]


Select = Callable[[RequestRecord], bool]
