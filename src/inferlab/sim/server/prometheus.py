"""Prometheus text exposition for the simulated server, with vLLM's metric names so
dashboards and tools made for vLLM read the simulator unchanged."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol


class Histogram:
    """Cumulative-bucket histogram in seconds (Prometheus semantics)."""

    def __init__(self, bounds_s: Sequence[float]) -> None:
        self.bounds = list(bounds_s)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value_s: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value_s)] += 1
        self.sum += value_s
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            cumulative += n
            out.append(f'{name}_bucket{{{labels},le="{bound:g}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.9g}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class EngineGauges(Protocol):
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def prefix_queries_tokens(self) -> int: ...
    @property
    def prefix_hits_tokens(self) -> int: ...
    @property
    def preemptions_total(self) -> int: ...
    @property
    def prompt_tokens_total(self) -> int: ...
    @property
    def generation_tokens_total(self) -> int: ...


def render_metrics(
    model: str,
    engine: EngineGauges,
    ttft: Histogram,
    e2e: Histogram,
    lag: Histogram,
    requests_ok: int,
) -> str:
    labels = f'model_name="{model}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}}} {value:.9g}")

    metric("vllm:num_requests_running", "gauge", engine.num_running, "Requests in the running batch.")
    metric("vllm:num_requests_waiting", "gauge", engine.num_waiting, "Requests waiting to be scheduled.")
    metric("vllm:kv_cache_usage_perc", "gauge", engine.kv_usage, "KV-cache usage, 0 to 1.")
    metric("vllm:gpu_cache_usage_perc", "gauge", engine.kv_usage, "KV-cache usage, 0 to 1 (older name).")
    metric("vllm:prefix_cache_queries_total", "counter", engine.prefix_queries_tokens, "Prompt tokens looked up in the prefix cache.")
    metric("vllm:prefix_cache_hits_total", "counter", engine.prefix_hits_tokens, "Prompt tokens found in the prefix cache.")
    metric("vllm:num_preemptions_total", "counter", engine.preemptions_total, "Preemptions (recompute).")
    metric("vllm:prompt_tokens_total", "counter", engine.prompt_tokens_total, "Prefill tokens processed.")
    metric("vllm:generation_tokens_total", "counter", engine.generation_tokens_total, "Tokens generated.")
    metric("vllm:request_success_total", "counter", requests_ok, "Requests finished.")
    lines.append("# HELP vllm:time_to_first_token_seconds Time to first token, engine view.")
    lines += ttft.lines("vllm:time_to_first_token_seconds", labels)
    lines.append("# HELP vllm:e2e_request_latency_seconds End-to-end latency, engine view.")
    lines += e2e.lines("vllm:e2e_request_latency_seconds", labels)
    lines.append("# HELP inferlab:token_emit_lag_seconds How late each step's tokens left the engine loop, wall time versus simulated time.")
    lines += lag.lines("inferlab:token_emit_lag_seconds", labels)
    return "\n".join(lines) + "\n"
