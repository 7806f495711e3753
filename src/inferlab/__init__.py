"""inferlab: measure, explain and predict the latency and throughput of LLM inference
servers. The public face is small; everything else lives in private modules."""

from __future__ import annotations

from inferlab._clock import Clock, VirtualClock, WallClock
from inferlab._errors import InferlabError, RunFailedError, ServerUnreachableError, UsageError
from inferlab.load.run import (
    BenchConfig,
    HttpTarget,
    RunConfig,
    RunResult,
    SimTarget,
    bench_async,
    run,
)
from inferlab.load.schedules import ClosedLoop, LoadConfig, OpenLoop
from inferlab.results.metrics import SLO, distribution, request_metrics
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import Summary, summarize
from inferlab.workload.config import WorkloadConfig

__all__ = [
    "SLO",
    "BenchConfig",
    "Clock",
    "ClosedLoop",
    "ErrorKind",
    "HttpTarget",
    "InferlabError",
    "LoadConfig",
    "OpenLoop",
    "RequestRecord",
    "RunConfig",
    "RunFailedError",
    "RunResult",
    "ServerUnreachableError",
    "SimTarget",
    "Summary",
    "UsageError",
    "VirtualClock",
    "WallClock",
    "WorkloadConfig",
    "bench_async",
    "distribution",
    "request_metrics",
    "run",
    "summarize",
]
