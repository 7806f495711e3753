"""Formatting only: the live progress line and the final table (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from inferlab._clock import NS_PER_S, Clock
from inferlab.results.clientload import CPU_BUSY, MIN_TIMERS, ClientLoad
from inferlab.results.loaddiff import load_text
from inferlab.results.metrics import Distribution
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.summary import OMITTED, Summary
from inferlab.results.telemetry import GatewayQueue, ServerMetrics

_ROWS = (
    ("TTFB", "ttfb_ms", "ms"),
    ("TTFT", "ttft_ms", "ms"),
    ("TPOT", "tpot_ms", "ms"),
    ("ITL", "itl_ms", "ms"),
    ("E2E", "e2e_ms", "ms"),
    ("Decode speed", "decode_tps", "tok/s"),
    ("Client send lag", "queue_delay_ms", "ms"),
    ("Connect wait", "connect_wait_ms", "ms"),
)


class Progress:
    """Counts requests as they finish and redraws one status line (stderr)."""

    def __init__(self, console: Console, clock: Clock, total: int | None) -> None:
        self.console = console
        self.clock = clock
        self.total = total
        self.done = self.failed = self.tokens = 0
        self.t0 = clock.now_ns()
        self._status = console.status("starting", spinner="dots") if console.is_terminal else None

    def __enter__(self) -> Self:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)

    def update(self, r: RequestRecord) -> None:
        if r.ok:
            self.done += 1
            self.tokens += r.output_tokens or len(r.content_ns)
        elif r.error_kind is not ErrorKind.CANCELLED:
            self.failed += 1
        if self._status is not None:
            self._status.update(self.line())

    def line(self) -> str:
        elapsed = max(1e-9, (self.clock.now_ns() - self.t0) / NS_PER_S)
        of = f"/{self.total}" if self.total else ""
        return (
            f"{self.done + self.failed}{of} requests · {self.failed} failed · "
            f"{self.done / elapsed:.2f} req/s · {self.tokens / elapsed:.0f} output tok/s · {elapsed:.1f} s"
        )


def _fmt(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def _cached(n: int | None) -> str:
    if n is None:  # unknown is not zero
        return "cached in unknown (the server did not say; vLLM says with --enable-prompt-tokens-details)"
    return f"{n:,} cached in"


def _tokens_line(s: Summary) -> str:
    """The tokens row: the answers' counts and their cached tokens; where the answers did
    not say them and the server's /metrics counted its prefix cache's tokens, those
    counts, said as the server's over the run (the warning on a warm cache quotes them)."""
    head = f"{_count(s.input_tokens)} in, {s.output_tokens:,} out"
    m = s.server_metrics
    counted = m.prefix_cache_tokens() if s.cached_tokens is None and isinstance(m, ServerMetrics) else None
    if counted is None:
        return f"{head}, {_cached(s.cached_tokens)} ({s.token_source})"
    hits, queries = counted
    warm = " (warm-ups included)" if s.counts.warmup else ""
    return (f"{head} ({s.token_source}); cached: not in the answers; the server's /metrics counted "
            f"{hits:,} of {queries:,} prompt tokens cached over the run{warm}")


def _client_line(load: ClientLoad) -> str:
    """One line on the client's own load: its processes, the busiest's CPU and loop lag."""
    n = len(load.processes)
    hot = load.busiest
    lag = hot.loop_lag_ms
    who = "1 process" if n == 1 else f"{n} processes, busiest {hot.role}"
    verdict = "[yellow]likely the bottleneck[/yellow]" if load.bottleneck else "kept up"
    if load.bottleneck is None:  # (every process that measures too brief for MIN_TIMERS loop timers)
        verdict = f"no verdict: too few loop-timer samples (under {MIN_TIMERS}: a run under half a second)"
    if load.bottleneck and hot.cpu_share < CPU_BUSY:  # (late, yet mostly idle: the warning says why)
        verdict = "[yellow]likely the bottleneck, waiting for a core[/yellow]"
    lags = "" if lag is None else f", loop lag p50 {_fmt(lag.p50, 2)} / p99 {_fmt(lag.p99, 2)} ms"
    if hot.late_share is not None and hot.late_share >= 0.01:
        lags += f", late {hot.late_share:.0%} of the run"
    return f"{verdict} ({who}: CPU {hot.cpu_share:.0%} of a core{lags})"


#: The percentiles the table shows unless others are chosen (``--metric-percentiles``).
TABLE_PERCENTILES = (50.0, 90.0, 99.0)


def server_metrics_line(m: ServerMetrics) -> str:
    """The server's own telemetry over a run, in one line (or why there is none)."""
    if not m.available:
        return f"not available ({m.reason})"
    c, g = m.counters, m.gauges
    parts = []
    if c.get("prompt_tokens") is not None or c.get("generation_tokens") is not None:
        parts.append(f"{_count(_int(c.get('prompt_tokens')))} prompt, {_count(_int(c.get('generation_tokens')))} generated tokens")
    if m.prefix_cache_hit_rate is not None:
        parts.append(f"prefix-cache hits {m.prefix_cache_hit_rate:.0%}")
    if c.get("preemptions") is not None:
        parts.append(f"{_int(c.get('preemptions'))} preemptions")
    if not m.samples:
        parts.append("gauges not sampled (the run ended before the first sample, at 1 s)")
    for key, label in (("running", "running"), ("waiting", "waiting")):
        if key in g:
            parts.append(f"{label} max {g[key].max:g}")
    if "kv_usage" in g:
        parts.append(f"KV cache max {g['kv_usage'].max:.0%}")
    if m.reason:  # (a caveat: the page after the run could not be read)
        parts.append(m.reason)
    return f"{m.server or 'unknown server'}: " + ", ".join(parts) if parts else f"{m.server}: nothing inferlab reads"


def _pages_read(config: dict[str, Any]) -> str:
    """Where the server metrics came from, where not beside the API URL (``--metrics-url``)."""
    pages = config.get("metrics_urls") or []
    return f"; read from {' + '.join(pages)} (--metrics-url)" if pages else ""


def gateway_queue_line(q: GatewayQueue, ttft: Distribution | None = None) -> str:
    """inferlab gateway's queue over a run in one line (or why it is not known): the
    admitted requests' wait beside the run's own TTFT mean, which that wait is part of,
    then the requests the queue refused (never admitted: no TTFT)."""
    if not q.available:
        return f"not known ({q.reason})"
    parts = [f"{q.queued if q.queued is not None else '?'} of {q.admitted:,} admissions waited"]
    w = q.wait
    if w is not None:
        bounds = ", ".join(f"{k} ≤ {_fmt(v)}" for k, v in (("p50", w.p50_ms), ("p90", w.p90_ms)) if v is not None)
        parts.append(f"admitted requests' wait mean {_fmt(w.mean_ms)} ms" + (f" ({bounds} ms)" if bounds else "")
                     + (f" of a TTFT mean of {_fmt(ttft.mean)} ms here" if ttft is not None else ""))
    if q.queued_mean_ms is not None:
        parts.append(f"{_fmt(q.queued_mean_ms)} ms mean of those that waited")
    refused = [f"{n:,} {'with the queue full' if why == 'queue_full' else 'timed out waiting'}"
               for why, n in q.refused.items() if n]
    if refused:
        parts.append("refused, not admitted (503): " + ", ".join(refused))
    return "; ".join(parts) + " (gateway-wide over the run: warm-ups and any other client's requests included)"


def _gateway_part(s: Summary) -> str:
    """The gateway's share of the client's TTFT beyond the server's, in words, where the
    run went through inferlab gateway (its queue and relay come before the engine's
    receipt); empty otherwise."""
    q = s.gateway_queue
    if isinstance(q, GatewayQueue) and q.available and q.wait is not None:
        return f"inferlab gateway's queue (its admitted requests' wait mean {_fmt(q.wait.mean_ms)} ms) and relay, "
    if isinstance(q, GatewayQueue) or (s.config.get("resolved") or {}).get("gateway"):
        return "inferlab gateway's queue and relay, "
    return ""


def _int(v: float | None) -> int | None:
    return None if v is None else round(v)


def _gateway_line(g: dict[str, Any]) -> str:
    """The summary's ``gateway`` in words: admitted, refused, the queue's wait."""
    refused = g["refused"]
    how = "admission off" if g["mode"] == "off" else f"admission by {g['mode']}"
    line = (f"{how}: {g['admitted']:,} admitted, {refused.get('queue_full', 0):,} refused with the queue "
            f"full, {refused.get('queue_timeout', 0):,} after waiting too long (503)")
    w = g.get("queue_wait_ms")
    if w:
        line += f"; queue wait p50 {_fmt(w['p50'])}, p99 {_fmt(w['p99'])}, max {_fmt(w['max'])} ms"
    return line


def print_uncut(console: Console, table: Table) -> None:
    """Print ``table`` whole: one wider than the console (a pipe's or a terminal's 80
    columns, with extra percentiles or parameters) is printed at its own width, so that no
    number is cut ("17,974…")."""
    needed = Measurement.get(console, console.options.update_width(10_000), table).maximum  # (unclamped)
    width = console.width
    console.width = max(width, needed)
    try:
        console.print(table)
    finally:
        console.width = width


def render_summary(console: Console, s: Summary, title: str, percentiles: Sequence[float] = TABLE_PERCENTILES) -> None:
    """The summary as a table of distributions (mean, ``percentiles``, max) and the
    run's totals below it. Each of ``percentiles`` must be in the summary's
    distributions (fixed, or added with ``with_percentiles``)."""
    c = s.counts
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("metric", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    for k in ("mean", *(f"p{q:g}" for q in percentiles), "max"):
        table.add_column(k, justify="right", no_wrap=True)
    for label, key, unit in _ROWS:
        d: Distribution | None = getattr(s, key)
        if d:
            cells = [d.mean, *(d.percentile(q) for q in percentiles), d.max]
            digits = 0 if max(abs(v) for v in cells) >= 10_000 else 1
            table.add_row(label, unit, *(_fmt(v, digits) for v in cells))
    print_uncut(console, table)

    tput = Table(show_header=False, box=None, pad_edge=False)
    tput.add_column(style="bold", no_wrap=True)
    tput.add_column()  # left-aligned, next to its label
    failed = f"{c.failed} failed" + (
        " (" + ", ".join(f"{k} {v}" for k, v in sorted(c.errors.items())) + ")" if c.errors else ""
    )
    if c.after_server_gone:  # (its users' re-sends once the server was gone: a warning says so)
        failed += f", {c.after_server_gone:,} of them after the server stopped answering"
    rows = [("load", what)] if (what := load_text(s.config)) else []
    rows += [
        ("requests", f"{c.completed} completed, {failed}" + (f", {c.cancelled} cancelled" if c.cancelled else "")),
        ("duration", f"{_fmt(s.duration_s, 2)} s" if c.completed else "—"),
        ("request throughput", f"{_fmt(s.request_throughput_rps, 2)} req/s"),
        ("output tokens/s", f"{_fmt(s.output_token_throughput_tps)} tok/s  ({_fmt(s.output_tpm, 0)} TPM)"),
        ("total tokens/s", f"{_fmt(s.total_token_throughput_tps)} tok/s  ({_fmt(s.total_tpm, 0)} TPM)"),
        ("tokens", _tokens_line(s)),
    ]
    if s.input_length_source is not OMITTED and s.input_length_source:
        oh = s.prompt_overhead_tokens
        shown = "unknown" if oh is None or oh is OMITTED else oh
        # (the probe's prompt is one user message: a conversation's turn has several,
        # each with the template's own tokens, and a system prompt)
        talks = bool((s.config.get("workload") or {}).get("sessions"))
        overhead = (f"template/special tokens of a one-message prompt: {shown} (a conversation's turn adds the "
                    "template's tokens of each of its messages)" if talks else f"template/special tokens per prompt: {shown}")
        rows.append(("prompt lengths", f"{s.input_length_source}; {overhead}"))
    if s.goodput_rps is not None:
        rows.append(("goodput", f"{_fmt(s.goodput_rps, 2)} req/s within SLO"))
    sv = s.server_timeline
    # (in virtual time no client stands between: the two are the same, nothing to show)
    if sv is not None and max(abs(sv.ttft_error_ms.min), abs(sv.ttft_error_ms.max)) >= 0.01:
        err = sv.ttft_error_ms
        rows.append((
            "client vs server TTFT",
            f"{err.p50:+,.2f} ms p50, {err.p99:+,.2f} ms p99 (server TTFT p50 {_fmt(sv.server_ttft_ms.p50)} ms; "
            f"{_gateway_part(s)}the network, the HTTP stacks, the client and the simulator's own lateness)",
        ))
    if isinstance(s.client, ClientLoad):
        rows.append(("client", _client_line(s.client)))
    if isinstance(s.server_metrics, ServerMetrics):
        rows.append(("server /metrics", server_metrics_line(s.server_metrics) + _pages_read(s.config)))
    if isinstance(s.gateway_queue, GatewayQueue):
        rows.append(("gateway queue", gateway_queue_line(s.gateway_queue, s.ttft_ms)))
    if isinstance(s.gateway, dict):
        rows.append(("gateway (simulated)", _gateway_line(s.gateway)))
    b = s.latency_breakdown
    if b is not None:
        parts = [("client send lag", b.client_queue_ms), ("gateway queue", b.gateway_queue_ms), ("server queue", b.server_queue_ms), ("prefill", b.prefill_ms), ("decode", b.decode_ms), ("other", b.other_ms)]
        rows.append(("latency breakdown", ", ".join(f"{k} {_fmt(v.mean)}" for k, v in parts if v is not None) + f" ms (mean; from {b.source})"))
    trace = s.trace_comparison if isinstance(s.trace_comparison, dict) else {}
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        t = trace.get(key)
        if t:
            def pct(v: float | None) -> str:
                return "" if v is None else f" ({v:+.1f}%)"

            text = f"mean {_fmt(t.predicted_mean)} vs {_fmt(t.measured_mean)} ms{pct(t.error_pct)}"
            text += f", p50 {_fmt(t.predicted_median)} vs {_fmt(t.measured_median)} ms{pct(t.median_error_pct)}"
            text += f"; {t.requests:,} request{'s' if t.requests != 1 else ''}"  # (those measured in both)
            rows.append((f"{label} here vs trace", text))
    for k, v in rows:
        tput.add_row(k, v)
    console.print(tput)
    for kind, msg in s.error_examples.items():
        console.print(f"[red]{kind}[/red]: {msg}")
    for w in s.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
