"""inferlab: measure, explain and predict the latency and throughput of LLM inference
servers. The public face is small; everything else lives in private modules."""

from __future__ import annotations

from inferlab._bench import BenchConfig, BenchResult, WorkloadConfig, bench_async
from inferlab._clock import Clock, VirtualClock, WallClock
from inferlab._errors import InferlabError, RunFailedError, ServerUnreachableError, UsageError
from inferlab._metrics import SLO, distribution, request_metrics, summarize
from inferlab._records import ErrorKind, RequestRecord
from inferlab._runner import LoadConfig
from inferlab._schedule import ClosedLoop, OpenLoop

__all__ = [
    "SLO",
    "BenchConfig",
    "BenchResult",
    "Clock",
    "ClosedLoop",
    "ErrorKind",
    "InferlabError",
    "LoadConfig",
    "OpenLoop",
    "RequestRecord",
    "RunFailedError",
    "ServerUnreachableError",
    "UsageError",
    "VirtualClock",
    "WallClock",
    "WorkloadConfig",
    "bench_async",
    "distribution",
    "request_metrics",
    "summarize",
]
