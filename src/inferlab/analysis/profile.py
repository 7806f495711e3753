"""``inferlab profile``: what each factor costs on one server, measured one at a time, as
an expert would, within a time budget.

Every measurement is an ordinary run (``load.run.run`` against the server) written to a
run directory of its own under the profile's folder; ``profile.json`` gathers the
factors: for each, the cost measured here in plain words, the evidence (which runs, which
numbers), and the numbers themselves (``data``) for ``inferlab advise`` and the report.

Factors, in order: prefill (TTFT over a ladder of prompt lengths at concurrency 1 → fixed
overhead + prefill rate, ``analysis.fits``), decode (TPOT and output tokens/s against
concurrency → per-stream speed, the knee, the concurrency with the most goodput), output
length (E2E against max tokens: the decode cost per token, checked against TPOT), prefix
cache (a shared prefix against unique prompts of the same length), response cache (the
same request repeated), head-of-line blocking (short requests alone, then while long
prompts are in flight), the chat template (the tokens the preflight probe measured ×
the prefill cost); with ``exact_output`` off, temperature 0 against 1 (output length and its
spread; the model ends each answer on its own).

Each measurement gets a share of the budget; a run still going at the end of its share
is stopped (what completed is used, and its run directory says it was interrupted), and
sizes (requests per point, the concurrency ladder) shrink with a smaller budget; they are
not raised to fill a budget the measurements did not need. Each straight-line cost (the
prefill rate, the cost per output token) carries its ``fits.LineQuality``: where the line is
not to be trusted (too few requests per point, points not monotonic, a poor R²) its cost
says so, and a profile that ended well short of its budget says why it took no more.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferlab._clock import NS_PER_S, Clock, WallClock
from inferlab._errors import InferlabError, RunFailedError, ServerUnreachableError, UsageError
from inferlab.analysis.fits import (
    MIN_REQUESTS_PER_POINT,
    LineQuality,
    PrefillFit,
    knee,
    line_quality,
    linear_fit,
    prefill_fit,
)
from inferlab.client.serverid import identify_server
from inferlab.load.run import HttpTarget, RunConfig, RunResult, run
from inferlab.load.schedules import ClosedLoop, LoadConfig
from inferlab.openai.request import Api
from inferlab.results.metrics import SLO, request_metrics
from inferlab.results.provenance import ServerInfo, describe_software, http_server_info
from inferlab.results.records import RequestRecord
from inferlab.results.runfiles import dumps
from inferlab.workload.config import WorkloadConfig

SCHEMA = "inferlab.profile/1"
PROFILE_FILE = "profile.json"
#: The default budget: a laptop against the embedded simulator finishes well within it.
DEFAULT_BUDGET_S = 300.0
#: Each factor's share of the budget (what is left over is margin).
SHARES = {
    "prefill": 0.2, "decode": 0.25, "output_length": 0.1, "prefix_cache": 0.1,
    "response_cache": 0.08, "head_of_line": 0.15, "template": 0.0,
}
#: Every factor, in the order measured.
FACTORS = ("prefill", "decode", "output_length", "prefix_cache", "response_cache", "head_of_line", "template", "temperature")
#: The prompt ladder (tokens of user content), cut at the server's context.
PROMPT_LADDER = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: The concurrency ladder, cut at ``ProfileConfig.max_concurrency``.
CONCURRENCY_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: When the server does not say its context length.
ASSUMED_MAX_MODEL_LEN = 4096
#: A response cache answers a repeat in under this share of a fresh request's E2E, and
#: of its generation time (first token to last).
RESPONSE_CACHE_RATIO = 0.5
#: E2E's cost per output token within this share of TPOT at concurrency 1: linear.
LINEAR_TOLERANCE = 0.15
#: A decode point is too short to be steady state with fewer requests than this per
#: user (the first wave starts together, the last drains alone), or lasting less than
#: this many times its E2E p50.
STEADY_REQUESTS_PER_USER = 3
STEADY_E2E_MULTIPLE = 3.0
#: The decode ladder's requests per user at each point: one more than
#: ``STEADY_REQUESTS_PER_USER``, since that many back to back last about
#: ``STEADY_E2E_MULTIPLE`` × their E2E, on either side of it.
DECODE_REQUESTS_PER_USER = STEADY_REQUESTS_PER_USER + 1


@dataclass(frozen=True)
class ProfileConfig:
    """What to profile, where to write it, how long it may take (``budget_s``, wall
    time), the SLOs that goodput counts against, the most concurrency to try."""

    out_dir: str
    budget_s: float = DEFAULT_BUDGET_S
    model: str | None = None
    api: Api = "chat"
    api_key: str | None = None
    slo: SLO = field(default_factory=lambda: SLO(ttft_ms=2000.0, tpot_ms=100.0))
    max_concurrency: int = 64
    seed: int = 0
    overwrite: bool = False
    embedded: bool = False  # the simulated server the CLI started
    # the engine config the CLI started the server from (``--engine``; profile.json's
    # ``engine_config``)
    engine_config: dict[str, Any] | None = None
    factors: tuple[str, ...] = ()  # measure only these (``FACTORS``); empty: all
    # False: let the model stop on its own, and measure temperature's effect on length
    exact_output: bool = True
    # the Prometheus pages every measurement reads instead of the one beside the URL
    # (``--metrics-url``: the engines behind a gateway; checked as bench checks them)
    metrics_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.factors) - set(FACTORS)
        if unknown:
            raise UsageError(f"--factors: unknown {', '.join(sorted(unknown))} (known: {', '.join(FACTORS)})")
        if self.budget_s <= 0:
            raise UsageError("--budget must be positive")
        # (the temperature factor is the one whose requests let the model stop on its own:
        # --no-exact-output is what allows that, and it does nothing else)
        if "temperature" in self.factors and self.exact_output:
            raise UsageError("--factors temperature needs --no-exact-output (its requests let the model end each answer on its own)")
        if self.factors and "temperature" not in self.factors and not self.exact_output:
            raise UsageError("--no-exact-output: only the temperature factor uses it, and --factors leaves it out")
        # (it ran the prefill ladder, which the template's cost is read from, and then
        # reported the template not measured)
        if "template" in self.factors and self.api == "completions":
            raise UsageError("--factors template: the completions API applies no chat template (give --api chat)")

    def measured(self) -> set[str]:
        """The factors this profile measures: ``factors`` (all when empty) and the ones
        they are computed from (the template from prefill's rate, output length checked
        against decode's TPOT)."""
        wanted = set(self.factors or FACTORS)
        if "template" in wanted:
            wanted.add("prefill")
        if "output_length" in wanted:
            wanted.add("decode")
        return wanted


@dataclass
class Factor:
    """One factor: what it costs here, in words (``cost``), the measurement behind it
    (``evidence``: which runs, which numbers), and the numbers (``data``); ``measured``
    False: not measured (``cost`` says why)."""

    name: str
    title: str
    cost: str
    evidence: str
    data: dict[str, Any] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    measured: bool = True

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Profile:
    """``profile.json``: the server, the budget and the time it took, each factor."""

    url: str | None
    model: str | None
    engine: dict[str, Any] | None  # the simulated server's engine (null for other servers)
    max_model_len: int
    max_model_len_source: str
    budget_s: float
    elapsed_s: float
    slo: SLO
    factors: list[Factor]
    engine_config: dict[str, Any] | None = None  # the engine config it was started from (``--engine``)
    # what a measured server said it is (``client.serverid``: name, version, source; null otherwise)
    server_software: dict[str, Any] | None = None
    # the Prometheus pages every measurement read instead of the one beside the URL (``--metrics-url``)
    metrics_urls: tuple[str, ...] = ()

    @property
    def server(self) -> ServerInfo:
        """The server profiled, as ``results.provenance`` names it (inferlab's simulator: a prediction)."""
        return http_server_info(self.url, self.engine, describe_software(self.server_software))

    def factor(self, name: str) -> Factor | None:
        return next((f for f in self.factors if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            # (as summary.json's: whether the numbers are predictions, from one rule)
            "server": self.server.to_json(),
            "url": self.url,
            "model": self.model,
            "engine": self.engine,
            "engine_config": self.engine_config,
            "server_software": self.server_software,
            "metrics_urls": list(self.metrics_urls),
            "max_model_len": self.max_model_len,
            "max_model_len_source": self.max_model_len_source,
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "slo": dataclasses.asdict(self.slo),
            "factors": [f.to_json() for f in self.factors],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Profile:
        """``ValueError`` (or ``KeyError``, ``TypeError``) if ``d`` is not a profile."""
        if not isinstance(d, dict):
            raise ValueError(f"a JSON {type(d).__name__}, not an object")
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not an inferlab profile (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        slo = d.get("slo") or {}
        return cls(
            d.get("url"), d.get("model"), d.get("engine"), int(d["max_model_len"]), str(d["max_model_len_source"]),
            float(d["budget_s"]), float(d["elapsed_s"]), SLO(slo.get("ttft_ms"), slo.get("tpot_ms"), slo.get("e2e_ms")),
            [Factor(**f) for f in d["factors"]], d.get("engine_config"), d.get("server_software"),
            tuple(d.get("metrics_urls") or ()),
        )


def read_profile(path: str | Path) -> Profile:
    """A profile folder's (or file's) ``profile.json``; ``UsageError`` if it is not one."""
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    try:
        return Profile.from_json(json.loads(p.read_text()))
    except OSError as e:
        raise UsageError(f"{p}: {e.strerror or e}") from e
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{p}: not an inferlab profile ({e})") from e


OnStep = Callable[[str], None]


async def profile(config: ProfileConfig, url: str, *, clock: Clock | None = None, on_step: OnStep | None = None) -> Profile:
    """Measure every factor against the server at ``url`` (see the module); write each
    run and ``profile.json`` under ``config.out_dir``. ``UsageError`` when the folder
    holds a profile already (without ``overwrite``)."""
    made = not Path(config.out_dir).exists()  # noqa: ASYNC240 (one stat, before any run)
    out = prepare_out(config)
    p = _Profiler(config, url, clock or WallClock(), on_step or (lambda _: None))
    try:
        result = await p.go()
    except BaseException:
        if made:  # (a refusal before any run, e.g. the preflight's: no empty folder left behind)
            with contextlib.suppress(OSError):
                out.rmdir()  # (only if empty: a run already written stays)
        raise
    (out / PROFILE_FILE).write_text(dumps(result.to_json()) + "\n")
    return result


def prepare_out(config: ProfileConfig) -> Path:
    """The profile's folder, made; ``UsageError`` if it is a file, cannot be made, or
    holds a profile already (without ``overwrite``)."""
    out = Path(config.out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a directory")
    if (out / PROFILE_FILE).exists() and not config.overwrite:
        raise UsageError(f"--out {out} already holds a profile: give another folder, or --overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write the profile to {out}: {e.strerror or e}") from e
    return out


@dataclass
class _Point:
    """One run's numbers that a factor uses."""

    result: RunResult | None
    error: str | None = None

    def ok(self) -> list[RequestRecord]:
        return [] if self.result is None else [r for r in self.result.records if r.ok and not r.warmup]

    def median(self, metric: str) -> float | None:
        values = [getattr(request_metrics(r), metric) for r in self.ok()]
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    def input_tokens(self) -> float | None:
        values = [r.input_tokens for r in self.ok() if r.input_tokens is not None]
        return statistics.median(values) if values else None


class _Profiler:
    def __init__(self, config: ProfileConfig, url: str, clock: Clock, on_step: OnStep) -> None:
        self.config = config
        self.url = url
        self.clock = clock
        self.on_step = on_step
        self.out = Path(config.out_dir)
        self.t0_ns = clock.now_ns()
        # sizes scale with the budget: the default budget runs the default sizes
        self.scale = min(2.0, max(0.2, config.budget_s / DEFAULT_BUDGET_S))
        self.max_model_len = ASSUMED_MAX_MODEL_LEN
        self.max_len_source = f"assumed {ASSUMED_MAX_MODEL_LEN} (the server does not say)"
        self.engine: dict[str, Any] | None = None
        self.server_software: dict[str, Any] | None = None
        self.model = config.model
        # the chat template's tokens as a preflight probe counted them; None: not counted
        # (no probe answered with them), and the template factor says it was not measured
        self.overhead_tokens: int | None = None
        self.deadline_s = config.budget_s
        self.budget_hit = False  # a run of the factor being measured was cut by the budget

    def elapsed_s(self) -> float:
        return (self.clock.now_ns() - self.t0_ns) / NS_PER_S

    def n(self, base: int, least: int = 3) -> int:
        return max(least, round(base * self.scale))

    async def go(self) -> Profile:
        await self._server_info()
        await self._preflight()
        factors: list[Factor] = []
        fit: PrefillFit | None = None
        fit_quality: dict[str, Any] | None = None
        tpot_1: float | None = None
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("prefill", self.prefill), ("decode", self.decode), ("output_length", self.output_length),
            ("prefix_cache", self.prefix_cache), ("response_cache", self.response_cache),
            ("head_of_line", self.head_of_line),
        ]
        spent = 0.0
        wanted = self.config.measured()
        # the budget is shared among the factors measured, in proportion to their shares
        total_share = sum(SHARES[n] for n, _ in steps if n in wanted) or 1.0
        for name, step in steps:
            if name not in wanted:
                continue
            spent += SHARES[name] / total_share * 0.95
            self.deadline_s = spent * self.config.budget_s
            self.on_step(name)
            if self.elapsed_s() >= self.deadline_s:
                factors.append(_skipped(name, "the budget ran out before it"))
                continue
            self.budget_hit = False
            try:
                if name == "output_length":
                    f = await self.output_length(tpot_1)
                else:
                    f = await step()
            except InferlabError as e:
                f = _skipped(name, f"failed: {e}")
            if self.budget_hit:
                share = f"its share of the budget ended at {self.deadline_s:,.1f} s"
                if f.measured:
                    f.evidence += f"; cut short: {share}"
                else:
                    f.cost += f" ({share})"
            factors.append(f)
            if name == "prefill" and f.measured:
                fit = PrefillFit(**{**f.data["fit"], "points": [tuple(p) for p in f.data["fit"]["points"]]})
                fit_quality = f.data.get("quality")
            if name == "decode" and f.measured:
                tpot_1 = f.data.get("tpot_ms_at_1")
        if "template" in wanted:
            factors.append(self.template(fit, fit_quality))
        if "temperature" in wanted:
            if not self.config.exact_output:
                self.deadline_s = self.config.budget_s
                try:
                    factors.append(await self.temperature())
                except InferlabError as e:
                    factors.append(_skipped("temperature", f"failed: {e}"))
            else:
                factors.append(_skipped("temperature", "not measured: every request asked for an exact output length (give --no-exact-output to let the model stop on its own)"))
        note_short_budget(factors, self.elapsed_s(), self.config.budget_s, self.scale)
        return Profile(
            self.url if not self.config.embedded else None, self.model, self.engine, self.max_model_len,
            self.max_len_source, self.config.budget_s, round(self.elapsed_s(), 2), self.config.slo, factors,
            self.config.engine_config, self.server_software, self.config.metrics_urls,
        )

    # --- the server ---------------------------------------------------------------------

    async def _server_info(self) -> None:
        """The model, its context length (``/v1/models``' ``max_model_len``, vLLM's) and
        the simulated engine, where the server says."""
        import aiohttp

        from inferlab.client.http import api_base
        from inferlab.results.provenance import ENGINE_ROUTE

        try:
            base = api_base(self.url)
        except ValueError as e:
            raise UsageError(str(e)) from e
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            try:  # (no server at all: one error now, not one failed factor after another)
                async with s.get(base + "/models", headers=headers):
                    pass
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, TimeoutError) as e:
                raise ServerUnreachableError.of(base, e) from e
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with s.get(base + "/models", headers=headers) as resp:
                    data = await resp.json(content_type=None) if resp.status == 200 else {}
                models = data.get("data") if isinstance(data, dict) else None
                if models and isinstance(models[0], dict):
                    self.model = self.model or models[0].get("id")
                    chosen = next((m for m in models if m.get("id") == self.model), models[0])
                    if isinstance(chosen.get("max_model_len"), int):
                        self.max_model_len = chosen["max_model_len"]
                        self.max_len_source = "the server's /v1/models"
            if self.max_len_source.startswith("assumed"):
                # llama.cpp's server: each slot's context (its /v1/models does not say)
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                    async with s.get(base.removesuffix("/v1") + "/props", headers=headers) as resp:
                        props = await resp.json(content_type=None) if resp.status == 200 else {}
                    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
                    if isinstance(n_ctx, int) and n_ctx > 0:
                        self.max_model_len = n_ctx
                        self.max_len_source = "the server's /props (llama.cpp: one slot's context)"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with s.get(base.removesuffix("/v1") + ENGINE_ROUTE, headers=headers) as resp:
                    if resp.status == 200:
                        engine = await resp.json(content_type=None)
                        self.engine = engine if isinstance(engine, dict) else None
        if self.engine is None:  # (a measured server: what it says it is, as bench records it)
            self.server_software = await identify_server(base, headers)

    def longest_prompt(self, output_tokens: int) -> int:
        """The longest user content that fits the context with the template and the output."""
        return self.max_model_len - output_tokens - max(self.overhead_tokens or 0, 0) - 16

    async def _preflight(self) -> None:
        """The probe ``bench`` sends before a run, once before any factor: a server that
        refuses the request outright (no such model: HTTP 404; a bad key: 401, 403) ends
        the profile here with ``UsageError``, one that answers every request the same
        unusable way with ``RunFailedError``, rather than every factor failing after it
        (and a factor that needs no run of its own, the template, being reported from
        nothing)."""
        from inferlab.client.exchange import Endpoint, auth_headers
        from inferlab.client.http import api_base, discover_model
        from inferlab.client.preflight import run_preflight

        base = api_base(self.url)  # (checked by ``_server_info``)
        self.model = self.model or await discover_model(base, auth_headers({}, self.config.api_key))
        endpoint = Endpoint(base_url=base, model=self.model, api=self.config.api, api_key=self.config.api_key)
        pre = await run_preflight(endpoint, exact_output=True, tokenizer=None)
        if isinstance(pre.prompt_overhead_tokens, int):
            self.overhead_tokens = pre.prompt_overhead_tokens

    # --- running one measurement ---------------------------------------------------------

    async def measure(
        self, name: str, concurrency: int, n: int, workload: WorkloadConfig, *, warmup: int = 0,
        deadline_s: float | None = None, extra_body: dict[str, Any] | None = None,
    ) -> _Point:
        """One run, written to ``out_dir/name``, stopped at the factor's deadline."""
        cfg = RunConfig(
            LoadConfig(ClosedLoop(concurrency), num_requests=n, warmup=warmup, seed=self.config.seed),
            workload, self.config.api, self.config.slo, str(self.out / name), overwrite=self.config.overwrite,
        )
        target = HttpTarget(
            self.url, self.model, api_key=self.config.api_key, embedded=self.config.embedded, workers=1,
            extra_body=dict(extra_body or {}), metrics_urls=self.config.metrics_urls,
        )
        stop = asyncio.Event()
        left = (deadline_s if deadline_s is not None else self.deadline_s) - self.elapsed_s()
        if left <= 0:
            self.budget_hit = True
            return _Point(None, "the budget ran out before it")
        timer = asyncio.get_running_loop().call_later(left, stop.set)
        try:
            result = await run(cfg, target, stop=stop)
        except RunFailedError as e:
            return _Point(e.result if isinstance(e.result, RunResult) else None, str(e))
        finally:
            timer.cancel()
        if isinstance(result.summary.prompt_overhead_tokens, int):  # (what the preflight measured)
            self.overhead_tokens = result.summary.prompt_overhead_tokens
        if result.interrupted and stop.is_set():
            self.budget_hit = True
        return _Point(result, "stopped at the end of its share of the budget" if result.interrupted else None)

    # --- the factors ---------------------------------------------------------------------

    async def prefill(self) -> Factor:
        n = self.n(5)
        points: list[tuple[float, float]] = []
        server_points: list[tuple[float, float]] = []  # the server's own TTFT, where it says
        runs: list[str] = []
        counts: list[int] = []  # completed requests behind each point
        done: list[int] = []
        while True:
            # (the longest prompt that fits is known once the first run has measured the
            # template's tokens)
            longest = self.longest_prompt(1)
            rest = [x for x in PROMPT_LADDER if x <= longest and (not done or x > done[-1])]
            if not rest and done and longest > done[-1] * 1.3:
                rest = [longest]
            if not rest:
                break
            L = rest[0]
            done.append(L)
            name = f"prefill/{L}"
            pt = await self.measure(name, 1, n, WorkloadConfig(input_tokens=L, output_tokens=1), warmup=1 if len(done) == 1 else 0)
            runs.append(name)
            ttft, tokens = pt.median("ttft_ms"), pt.input_tokens()
            if ttft is None:  # (longer prompts would fail the same way, or take longer still)
                break
            x = tokens if tokens is not None else float(L)
            points.append((x, ttft))
            counts.append(len(pt.ok()))
            server_ttft = [float(tl["first_token_ms"]) for tl in (r.server_timeline or {} for r in pt.ok()) if tl.get("first_token_ms") is not None]
            if server_ttft:
                server_points.append((x, statistics.median(server_ttft)))
        if len({x for x, _ in points}) < 2:
            return _skipped("prefill", "fewer than two prompt lengths completed", runs)
        fit = prefill_fit(points)
        quality = line_quality(points, min(counts), " tokens")
        rate = "did not grow with length" if fit.prefill_tps is None else f"{fit.prefill_tps:,.0f} tokens/s"
        flags = []
        if fit.superlinear:
            flags.append(f"super-linear: the longest prompts cost {fit.growth_ratio:.2f}× per token what shorter ones do (attention)")
        if fit.step_at_tokens is not None:
            flags.append(f"a step after {fit.step_at_tokens:,.0f} tokens (prefill chunking or a batching budget)")
        fixed = (
            f"{fit.overhead_ms:,.1f} ms fixed" if fit.overhead_ms >= 0
            else f"no fixed cost resolved (the line meets 0 tokens at {fit.overhead_ms:,.1f} ms: TTFT does not grow linearly here)"
        )
        if fit.prefill_tps is not None and not quality.trusted:
            flags.insert(0, f"the rate is {quality.words()}")
        cost = f"{fixed} + prefill at {rate}" + ("; " + "; ".join(flags) if flags else "")
        evidence = (
            f"median TTFT at concurrency 1, {n} requests per length, over {len(points)} prompt lengths "
            f"{points[0][0]:,.0f}–{points[-1][0]:,.0f} tokens; line fit residual {fit.residual_pct:.1f}%{r2_words(quality)}"
        )
        data: dict[str, Any] = {"fit": fit.to_json(), "requests_per_point": n, "server_fit": None, "quality": quality.to_json()}
        if len(server_points) == len(points) and fit.prefill_tps:
            sfit = prefill_fit(server_points)
            data["server_fit"] = sfit.to_json()
            if sfit.prefill_tps:
                # what the client sees beyond the server's own clock, per prompt token:
                # parsing, tokenizing, the network (a cost the engine's rate leaves out)
                extra_us = (1e6 / fit.prefill_tps - 1e6 / sfit.prefill_tps)
                evidence += f"; the server's own TTFT gives {sfit.prefill_tps:,.0f} tokens/s: {front_end_words(extra_us)}"
        return Factor("prefill", "prefill (prompt length)", cost, evidence, data, runs)

    async def decode(self) -> Factor:
        ladder = [c for c in CONCURRENCY_LADDER if c <= self.config.max_concurrency]
        out_tokens = self.n(64, least=32)
        rows: list[dict[str, Any]] = []
        runs: list[str] = []
        share_end = self.deadline_s
        dropped: list[int] = []
        dropped_why = ""
        for c in ladder:
            n = max(DECODE_REQUESTS_PER_USER * c, self.n(4))
            if rows and (why := _point_too_long(rows[-1], c, -(-n // c), share_end - self.elapsed_s())):
                # (the rest take longer still: dropped, not run too short to be steady state)
                dropped = [x for x in ladder if x >= c]
                dropped_why = f"concurrency {', '.join(map(str, dropped))} not run: {why}"
                break
            name = f"decode/c{c}"
            pt = await self.measure(name, c, n, WorkloadConfig(input_tokens=128, output_tokens=out_tokens), deadline_s=share_end)
            runs.append(name)
            if pt.result is None:
                break
            s = pt.result.summary
            rows.append({
                "concurrency": c,
                "completed": s.counts.completed,
                "tpot_ms_p50": None if s.tpot_ms is None else s.tpot_ms.p50,
                "ttft_ms_p50": None if s.ttft_ms is None else s.ttft_ms.p50,
                "e2e_ms_p50": None if s.e2e_ms is None else s.e2e_ms.p50,
                "output_tps": s.output_token_throughput_tps,
                "goodput_rps": s.goodput_rps,
                "interrupted": pt.result.interrupted,
                "duration_s": s.duration_s,
            })
            if pt.result.interrupted:
                break
        rows = [r for r in rows if r["tpot_ms_p50"] is not None and r["output_tps"]]
        if not rows:
            return _skipped("decode", "no run completed", runs)
        k = knee([r["concurrency"] for r in rows], [r["output_tps"] for r in rows], [r["goodput_rps"] for r in rows])
        tpot_1 = rows[0]["tpot_ms_p50"] if rows[0]["concurrency"] == 1 else None
        top = max(rows, key=lambda r: r["output_tps"])
        knee_text = knee_words([r["concurrency"] for r in rows], k.knee_concurrency)
        cost = (
            (f"{tpot_1:.2f} ms per token at concurrency 1 ({1000 / tpot_1:,.0f} tokens/s per stream); " if tpot_1 else "")
            + f"{knee_text}; most output {top['output_tps']:,.0f} tokens/s at {top['concurrency']}"
        )
        quality = decode_quality(rows)
        if not quality["trusted"]:
            cost += f"; {decode_quality_words(quality)}"
        if dropped:
            cost += f"; {dropped_why}"
        slo = self.config.slo
        if k.best_goodput_concurrency is not None:
            cost += (f"; most goodput (requests within TTFT {slo.ttft_ms:g} ms and TPOT {slo.tpot_ms:g} ms: "
                     f"--slo-ttft-ms, --slo-tpot-ms) at concurrency {k.best_goodput_concurrency}")
        evidence = (
            f"closed loops of 128-token prompts, {out_tokens} output tokens, {DECODE_REQUESTS_PER_USER} requests per "
            "user or more, concurrency "
            f"{', '.join(str(r['concurrency']) for r in rows)}: TPOT p50 "
            + ", ".join(f"{r['tpot_ms_p50']:.1f}" for r in rows)
            + " ms; output tokens/s " + ", ".join(f"{r['output_tps']:,.0f}" for r in rows)
            + f"; goodput under TTFT ≤ {slo.ttft_ms:g} ms, TPOT ≤ {slo.tpot_ms:g} ms"
        )
        data = {
            "points": rows, "tpot_ms_at_1": tpot_1, "decode_tps_at_1": None if not tpot_1 else 1000 / tpot_1,
            "knee_concurrency": k.knee_concurrency, "best_goodput_concurrency": k.best_goodput_concurrency,
            "output_tokens": out_tokens, "quality": quality, "requests_per_user": DECODE_REQUESTS_PER_USER,
            "dropped": dropped, "dropped_why": dropped_why or None,
        }
        return Factor("decode", "decode (concurrency)", cost, evidence, data, runs)

    async def output_length(self, tpot_1: float | None = None) -> Factor:
        lengths = [16, 64, self.n(256, least=128)]
        pts: list[tuple[int, float]] = []
        counts: list[int] = []
        runs = []
        for m in lengths:
            name = f"output/{m}"
            pt = await self.measure(name, 1, self.n(5, least=2), WorkloadConfig(input_tokens=128, output_tokens=m))
            runs.append(name)
            e2e = pt.median("e2e_ms")
            if e2e is not None:
                pts.append((m, e2e))
                counts.append(len(pt.ok()))
        if len(pts) < 2:
            return _skipped("output_length", "fewer than two output lengths completed", runs)
        return output_length_factor(pts, min(counts), tpot_1, runs)

    async def prefix_cache(self) -> Factor:
        prefix = max(64, min(2048, self.longest_prompt(4) // 2))
        suffix = 64
        n = self.n(4)
        shared = await self.measure(
            "prefix/shared", 1, n, WorkloadConfig(prefix_groups=1, prefix_tokens=prefix, suffix_tokens=suffix, output_tokens=4), warmup=1,
        )
        unique = await self.measure("prefix/unique", 1, n, WorkloadConfig(input_tokens=prefix + suffix, output_tokens=4))
        runs = ["prefix/shared", "prefix/unique"]
        a, b = shared.median("ttft_ms"), unique.median("ttft_ms")
        if a is None or b is None:
            return _skipped("prefix_cache", "a run did not complete", runs)
        hit_rate, source = _hit_rate(shared)
        saved = b - a
        seen = "not reported by the server" if hit_rate is None else f"{hit_rate:.0%} of prompt tokens cached ({source})"
        cost = (
            f"a shared {prefix:,}-token prefix saves {saved:,.1f} ms TTFT ({saved / b:.0%}); {seen}"
            if saved > 0 else f"no TTFT saved by a shared prefix ({signed_ms(saved)} ms): prefix caching looks off; {seen}"
        )
        evidence = f"median TTFT at concurrency 1: shared prefix {a:,.1f} ms vs unique prompts of the same length {b:,.1f} ms ({n} requests each)"
        data = {"prefix_tokens": prefix, "suffix_tokens": suffix, "ttft_shared_ms": a, "ttft_unique_ms": b, "saved_ms": saved, "hit_rate": hit_rate, "hit_rate_source": source}
        return Factor("prefix_cache", "prefix cache", cost, evidence, data, runs)

    async def response_cache(self) -> Factor:
        n = self.n(4)
        prompt = "Explain briefly how a prefix cache speeds up a language model server. " * 8
        # temperature 0 both ways: a response cache answers only requests whose answer
        # is deterministic (the gateway's, and most others), so a sampled repeat would
        # miss every cache and read as "none detected"
        greedy = {"temperature": 0}
        repeat = await self.measure("response/repeat", 1, n, WorkloadConfig(prompt=prompt, output_tokens=32), warmup=1,
                                    extra_body=greedy)
        tokens = repeat.input_tokens()
        fresh_len = max(16, round(tokens - (self.overhead_tokens or 0)) if tokens else 100)
        fresh = await self.measure("response/fresh", 1, n, WorkloadConfig(input_tokens=fresh_len, output_tokens=32),
                                   extra_body=greedy)
        runs = ["response/repeat", "response/fresh"]
        a, b = repeat.median("e2e_ms"), fresh.median("e2e_ms")
        da, db = _decode_ms(repeat), _decode_ms(fresh)
        if a is None or b is None or da is None or db is None:
            return _skipped("response_cache", "a run did not complete", runs)
        ratio = a / b
        # a prefix cache skips a repeat's prefill (TTFT drops); only a response cache
        # skips its generation too: the decode time is what tells them apart
        decode_ratio = da / db if db > 0 else 1.0
        detected = ratio < RESPONSE_CACHE_RATIO and decode_ratio < RESPONSE_CACHE_RATIO
        verdict = "detected" if detected else "none detected"
        cost = f"{verdict}: a repeated request took {ratio:.0%} of a fresh one's E2E and {decode_ratio:.0%} of its generation time"
        evidence = (
            f"median at concurrency 1, 32 output tokens, temperature 0: the same request repeated E2E {a:,.1f} ms (first token → last "
            f"{da:,.1f} ms) vs fresh prompts of its length {b:,.1f} ms ({db:,.1f} ms)"
        )
        return Factor("response_cache", "response cache (identical requests)", cost, evidence,
                      {"detected": detected, "e2e_repeat_ms": a, "e2e_fresh_ms": b, "ratio": ratio, "decode_ratio": decode_ratio}, runs)

    async def head_of_line(self) -> Factor:
        n = self.n(8, least=4)
        short = WorkloadConfig(input_tokens=64, output_tokens=8)
        alone = await self.measure("hol/short-alone", 1, n, short)
        long_tokens = max(256, self.longest_prompt(1))
        # long prompts keep arriving while the short ones run: the background stops when
        # the foreground is done (its run directory says interrupted: that is by design)
        stop_bg = asyncio.Event()
        bg_cfg = RunConfig(
            LoadConfig(ClosedLoop(2), num_requests=10_000, seed=self.config.seed + 1),
            # one output token: the long requests are (almost) all prefill, back to back
            WorkloadConfig(input_tokens=long_tokens, output_tokens=1), self.config.api, None,
            str(self.out / "hol/long-background"), overwrite=self.config.overwrite,
        )
        target = HttpTarget(self.url, self.model, api_key=self.config.api_key, embedded=self.config.embedded, workers=1,
                            metrics_urls=self.config.metrics_urls)
        timer = asyncio.get_running_loop().call_later(max(0.0, self.deadline_s - self.elapsed_s()), stop_bg.set)
        background = asyncio.ensure_future(run(bg_cfg, target, stop=stop_bg))
        bg: RunResult | None = None
        try:
            await asyncio.sleep(0.5)  # the long prompts are in flight first
            mixed = await self.measure("hol/short-with-long", 1, n, short)
        finally:
            stop_bg.set()
            timer.cancel()
            try:
                bg = await background
            except RunFailedError as e:  # every long prompt failed (too long for this server?)
                bg = e.result if isinstance(e.result, RunResult) else None
            except InferlabError:
                bg = None
        runs = ["hol/short-alone", "hol/short-with-long", "hol/long-background"]
        if bg is None or bg.summary.counts.completed == 0:
            why = "" if bg is None or not bg.summary.error_examples else f": {next(iter(bg.summary.error_examples.values()))}"
            return _skipped("head_of_line", f"the {long_tokens:,}-token prompts did not complete{why}", runs)
        a, b = alone.median("ttft_ms"), mixed.median("ttft_ms")
        if a is None or b is None:
            return _skipped("head_of_line", "a run did not complete", runs)
        inflation = b / a
        cost = f"short requests' TTFT × {inflation:.2f} while {long_tokens:,}-token prompts are in flight ({a:,.1f} → {b:,.1f} ms)"
        evidence = f"median TTFT of 64-token prompts at concurrency 1, alone vs beside 2 closed-loop users sending {long_tokens:,}-token prompts ({n} requests each)"
        return Factor("head_of_line", "head-of-line blocking", cost, evidence,
                      {"short_alone_ttft_ms": a, "short_with_long_ttft_ms": b, "inflation": inflation, "long_tokens": long_tokens}, runs)

    async def temperature(self) -> Factor:
        n = self.n(6, least=4)
        rows = {}
        runs = []
        for t in (0.0, 1.0):
            name = f"temperature/t{t:g}"
            pt = await self.measure(name, 1, n, WorkloadConfig(input_tokens=128, output_tokens=512, exact_output=False),
                                    extra_body={"temperature": t}, deadline_s=self.config.budget_s)
            runs.append(name)
            outs = [r.output_tokens for r in pt.ok() if r.output_tokens is not None]
            if len(outs) >= 2:
                rows[t] = (statistics.fmean(outs), statistics.pstdev(outs), statistics.median(e for e in (request_metrics(r).e2e_ms for r in pt.ok()) if e is not None))
        if len(rows) < 2:
            return _skipped("temperature", "a run did not complete", runs)
        (m0, s0, e0), (m1, s1, e1) = rows[0.0], rows[1.0]
        cost = f"output length {m0:,.0f} ± {s0:,.0f} tokens at temperature 0, {m1:,.0f} ± {s1:,.0f} at 1 (median E2E {e0:,.0f} vs {e1:,.0f} ms)"
        evidence = f"{n} requests at each temperature, 128-token prompts, max_tokens 512, no exact output length (the model stops on its own)"
        if self.engine is not None:
            evidence += "; the simulated model ignores temperature (its lengths are drawn per prompt): any difference here is the prompts'"
        return Factor("temperature", "temperature", cost, evidence,
                      {"t0": {"mean_tokens": m0, "std_tokens": s0, "e2e_ms_p50": e0}, "t1": {"mean_tokens": m1, "std_tokens": s1, "e2e_ms_p50": e1}}, runs)

    def template(self, fit: PrefillFit | None, fit_quality: dict[str, Any] | None = None) -> Factor:
        tokens = self.overhead_tokens
        if self.config.api != "chat":
            return _skipped("template", "not measured: the completions API applies no chat template")
        if tokens is None:
            return _skipped("template", "not measured: no request counted the template's tokens (the probe and every run "
                            "failed, or the server reports no prompt tokens and has no /tokenize)")
        per_token_ms = None if fit is None or not fit.prefill_tps else 1000 / fit.prefill_tps
        cost_ms = None if per_token_ms is None else tokens * per_token_ms
        cost = f"{tokens} tokens per request" + ("" if cost_ms is None else f", about {cost_ms:.2f} ms of TTFT at the measured prefill rate")
        evidence = "the chat template's tokens as the preflight probe counted them (an empty message against a plain prompt)"
        if per_token_ms is not None:
            evidence += f", × {per_token_ms * 1000:.1f} µs per token (the prefill fit)"
            if fit_quality is not None and not fit_quality.get("trusted", True):
                cost += " (the prefill rate is not to be trusted: see prefill)"
        return Factor("template", "chat template", cost, evidence, {"overhead_tokens": tokens, "ttft_cost_ms": cost_ms})


def output_length_factor(points: Sequence[tuple[int, float]], requests_per_point: int, tpot_1: float | None, runs: Sequence[str]) -> Factor:
    """The output length factor from ``points`` ([max tokens, median E2E ms], two
    lengths or more) of ``requests_per_point`` completed requests each at least: the
    slope is the cost per output token, "not determined" where it is not positive, with
    the line's ``LineQuality`` caveats where it is not to be trusted."""
    quality = line_quality([(float(x), y) for x, y in points], requests_per_point, " tokens")
    _, slope = linear_fit([float(x) for x, _ in points], [y for _, y in points])
    per_token = slope if slope > 0 else None
    linear = None if not tpot_1 or per_token is None else abs(per_token / tpot_1 - 1) <= LINEAR_TOLERANCE
    if per_token is None:
        cost = f"not determined: E2E did not grow with the output length ({'; '.join(quality.caveats)})"
    else:
        cost = f"{per_token:.2f} ms per output token" + ("" if quality.trusted else f" ({quality.words()})")
        if linear is not None:
            cost += f"; {'matches' if linear else 'does not match'} TPOT at concurrency 1 ({tpot_1:.2f} ms)"
    evidence = (
        f"median E2E at concurrency 1, 128-token prompts, {requests_per_point} requests per length or more: "
        + ", ".join(f"{m} tokens {e:,.0f} ms" for m, e in points) + r2_words(quality)
    )
    data = {"points": list(points), "ms_per_token": per_token, "linear": linear, "quality": quality.to_json()}
    return Factor("output_length", "output length (max tokens)", cost, evidence, data, list(runs))


def r2_words(quality: LineQuality) -> str:
    """The line's R² as an evidence clause ("" where the points were all equal)."""
    return "" if quality.r2 is None else f"; line fit R² {quality.r2:.2f}"


#: A profile that took less than this share of its budget says why it took no more
#: where a line rests on few requests per point.
SHORT_BUDGET_SHARE = 0.5


def note_short_budget(factors: Sequence[Factor], elapsed_s: float, budget_s: float, scale: float) -> None:
    """Where the profile ended before ``SHORT_BUDGET_SHARE`` of its budget, add to the
    evidence (and ``data["quality"]["budget_note"]``) of each factor whose line rests on
    fewer than ``MIN_REQUESTS_PER_POINT`` requests per point that requests per point
    follow the budget (``scale`` × the default sizes), not the time left over."""
    if elapsed_s >= SHORT_BUDGET_SHARE * budget_s:
        return
    note = (
        f"the profile took {elapsed_s:,.0f} s of its {budget_s:,.0f} s budget: requests per point are sized by the "
        f"budget ({scale:.1f}× the default sizes, which are those of {DEFAULT_BUDGET_S:,.0f} s), not raised to fill "
        f"the time left; a longer --budget takes more (up to 2× at {2 * DEFAULT_BUDGET_S:,.0f} s)"
    )
    for f in factors:
        q = f.data.get("quality") if f.measured else None
        if isinstance(q, dict) and q.get("requests_per_point", MIN_REQUESTS_PER_POINT) < MIN_REQUESTS_PER_POINT:
            q["budget_note"] = note
            f.evidence += f"; {note}"


def decode_quality(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether the decode ladder's points are long enough to be steady state: each with
    ``STEADY_REQUESTS_PER_USER`` completed requests per user or more, and lasting
    ``STEADY_E2E_MULTIPLE`` times its E2E p50 or more (where its duration is recorded:
    not in profiles written before it was). ``trusted``, ``caveats`` (one per short
    point, in words) and ``short`` (their concurrencies), as ``data["quality"]``."""
    caveats, short = [], []
    for r in rows:
        c, done, e2e, took = r.get("concurrency"), r.get("completed"), r.get("e2e_ms_p50"), r.get("duration_s")
        if not isinstance(c, int) or c < 1 or not isinstance(done, int):
            continue
        said = []
        if done < STEADY_REQUESTS_PER_USER * c:
            said.append(f"{done / c:.3g} requests per user (fewer than {STEADY_REQUESTS_PER_USER})")
        if isinstance(took, int | float) and isinstance(e2e, int | float) and e2e > 0 and took * 1000 < STEADY_E2E_MULTIPLE * e2e:
            said.append(f"{took:,.2f} s, {took * 1000 / e2e:.1f}× its E2E p50 (under {STEADY_E2E_MULTIPLE:g}×)")
        if said:
            short.append(c)
            caveats.append(f"concurrency {c}: " + ", ".join(said))
    return {"trusted": not caveats, "caveats": caveats, "short": short}


def _point_too_long(last: dict[str, Any], c: int, rounds: int, left_s: float) -> str | None:
    """Why the decode ladder's point at concurrency ``c`` (``rounds`` requests per user)
    and those past it are not run, in words: its E2E taken to grow in proportion to the users from the last
    point's (``last``: its row), as it does past the knee, it would take longer than the
    ``left_s`` seconds left of the decode factor's share of the budget. None where it
    fits, or the last point has no E2E to go by."""
    e2e, at = last.get("e2e_ms_p50"), last.get("concurrency")
    if not isinstance(e2e, int | float) or not isinstance(at, int) or at < 1:
        return None
    need_s = rounds * e2e * c / at / 1000
    if need_s <= left_s:
        return None
    return (f"at {rounds} requests per user (steady state), concurrency {c} would take about "
            f"{need_s:,.1f} s ({rounds} × the E2E p50 at {at}, {e2e:,.0f} ms, × {c}/{at}: E2E taken to grow with "
            f"the users, as past the knee), more than the {max(left_s, 0.0):,.1f} s left of the decode factor's share of "
            "the budget, and the points past it longer still; a longer --budget runs them, or measure one with inferlab bench -c "
            f"{c} -n {10 * c} --input-tokens 128 (10 requests per user)")


def decode_quality_words(quality: dict[str, Any]) -> str:
    """``decode_quality`` in one clause ("" where trusted): the points too short to be
    steady state, so the knee and the throughput at them are not to be trusted."""
    if quality.get("trusted", True):
        return ""
    short = quality.get("short") or []
    return (f"not to be trusted: {len(short)} of the points too short to be steady state ("
            + "; ".join(quality.get("caveats") or []) + "): measure a point longer, e.g. inferlab bench -c "
            f"{short[-1] if short else 32} -n {10 * (short[-1] if short else 32)} --input-tokens 128 (10 requests per user)")


def knee_words(concurrencies: Sequence[int], knee_at: int | None) -> str:
    """The decode ladder's knee in words: where it is, or that throughput was still
    rising at the highest concurrency, or that one concurrency alone ran (no step up
    to judge a knee by)."""
    if knee_at is not None:
        return f"knee at concurrency {knee_at}"
    if len(concurrencies) < 2:
        return f"only concurrency {concurrencies[0] if concurrencies else '?'} ran (no knee measured)"
    return f"throughput still rising at {concurrencies[-1]} (no knee measured)"


def front_end_words(extra_us: float) -> str:
    """What the front end and the network add per prompt token (the client's prefill
    fit against the server's own), in words; less than 0.05 µs (or below zero: the
    two fits' noise) is nothing measurable, never "-0.0 µs"."""
    if extra_us < 0.05:
        return "the front end and network add nothing measurable per prompt token"
    return f"the front end and network add {extra_us:,.1f} µs per prompt token"


def signed_ms(ms: float) -> str:
    """``ms`` with its sign, one decimal; "0.0" where it rounds to zero (never "-0.0")."""
    return "0.0" if abs(ms) < 0.05 else f"{ms:+,.1f}"


def _skipped(name: str, why: str, runs: Sequence[str] = ()) -> Factor:
    return Factor(name, name.replace("_", " "), why, "", {}, list(runs), measured=False)


def _decode_ms(point: _Point) -> float | None:
    """Median first token → end of a run's completed requests."""
    values = [m.e2e_ms - m.ttft_ms for m in (request_metrics(r) for r in point.ok()) if m.e2e_ms is not None and m.ttft_ms is not None]
    return statistics.median(values) if values else None


def _hit_rate(point: _Point) -> tuple[float | None, str]:
    """Prompt tokens served from the prefix cache: the server's usage, else its /metrics."""
    done = point.ok()
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    prompt = sum(r.input_tokens or 0 for r in done)
    if cached and prompt:
        return sum(cached) / prompt, "the answers' cached tokens (usage.prompt_tokens_details, or llama.cpp's timings.cache_n)"
    if point.result is not None:
        from inferlab.results.telemetry import ServerMetrics

        m = point.result.summary.server_metrics
        if isinstance(m, ServerMetrics) and m.prefix_cache_hit_rate is not None:
            return m.prefix_cache_hit_rate, "the server's /metrics"
    return None, "unknown"


def parse_budget(text: str) -> float:
    """``--budget``: ``300``, ``90s``, ``5m``, ``1h`` → seconds; ``UsageError`` otherwise."""
    t = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    mult = units.get(t[-1:])
    number = t[:-1] if mult is not None else t
    try:
        value = float(number) * (mult or 1.0)
    except ValueError:
        raise UsageError(f"--budget {text!r}: expected seconds, or a number with s, m or h (5m)") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--budget {text!r}: must be positive")
    return value
