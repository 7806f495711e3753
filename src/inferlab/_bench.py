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

import aiohttp

from inferlab._client import Endpoint, api_base
from inferlab._clock import Clock, WallClock
from inferlab._errors import RunFailedError, ServerUnreachableError, UsageError
from inferlab._metrics import SLO, summarize
from inferlab._records import RequestRecord
from inferlab._results import RunWriter
from inferlab._runner import LoadConfig, run_load
from inferlab._workload import Api, FixedPromptWorkload, RequestSpec, SyntheticWorkload


@dataclass(frozen=True)
class WorkloadConfig:
    """Synthetic prompts when ``input_tokens`` is set, else the fixed ``prompt``."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt: str | None = None
    exact_output: bool = True

    def build(self, seed: int) -> Iterator[RequestSpec]:
        if self.input_tokens is not None and self.prompt is not None:
            raise UsageError("--input-tokens and --prompt cannot be combined")
        if self.input_tokens is not None:
            if self.input_tokens < 1:
                raise UsageError("--input-tokens must be at least 1")
            return iter(SyntheticWorkload(self.input_tokens, self.output_tokens, seed, self.exact_output))
        if self.output_tokens is not None and self.output_tokens < 1:
            raise UsageError("--output-tokens must be at least 1")
        kwargs: dict[str, Any] = {"output_tokens": self.output_tokens, "exact_output": self.exact_output}
        if self.prompt is not None:
            kwargs["prompt"] = self.prompt
        return iter(FixedPromptWorkload(**kwargs))


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

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["api_key"] = "***" if self.api_key else None
        d["headers"] = {k: ("***" if k.lower() == "authorization" else v) for k, v in self.headers}
        d["load"]["schedule"] = {"kind": type(self.load.schedule).__name__, **d["load"]["schedule"]}
        out: dict[str, Any] = json.loads(json.dumps(d, default=str))
        return out


@dataclass
class BenchResult:
    summary: dict[str, Any]
    records: list[RequestRecord]
    url: str


async def discover_model(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> str:
    """The first model id from ``GET /v1/models``; ``ServerUnreachableError`` if no
    server answers there."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(
            base_url + "/models", headers=headers
        ) as resp:
            if resp.status >= 400:
                raise UsageError(
                    f"{base_url}/models answered HTTP {resp.status}; pass --model explicitly"
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
    cfg_json = {**config.to_json(), "resolved": {"url": base, "model": model}}
    writer = RunWriter(config.out_dir, cfg_json) if config.out_dir else None

    def record_done(r: RequestRecord) -> None:
        if writer is not None:
            writer.append(r)
        if on_record is not None:
            on_record(r)

    try:
        result = await run_load(
            endpoint, config.load, config.workload.build(config.load.seed), clock,
            on_record=record_done, stop=stop,
        )
        summary = summarize(result.records, config=cfg_json, slo=config.slo, interrupted=result.interrupted)
        if writer is not None:
            writer.write_summary(summary)
    finally:
        if writer is not None:
            writer.close()
    c = summary["counts"]
    if c["completed"] == 0 and c["failed"] > 0:
        kind, msg = next(iter(summary["error_examples"].items()))
        raise RunFailedError(f"all {c['failed']} requests failed; first {kind}: {msg}", summary)
    return BenchResult(summary, result.records, base)


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT/SIGTERM end the run gracefully: in-flight requests are cancelled and the
    summary of what completed is still written."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
