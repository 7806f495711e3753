"""The client at scale: CPU per streamed chunk and chunks/s next to AIPerf and GuideLLM,
TTFT error against the simulator's own timeline at 1-512 streams, an open-loop Poisson
run over two workers, and the client-bottleneck verdict.

Server and tools are pinned to different cores (``--server-cpus``, ``--client-cpus``).
Parts (``--parts``, all by default):

- ``server``: the mock server's own ceiling, against a client that parses nothing.
- ``cpu``: against the fast mock (``bench/mock_server.py``: no simulated delay; each
  step writes one vLLM chat chunk to every open stream, one write each), each tool
  runs as a subprocess with the same closed loop (32 streams) at 64 and at 512 chunks
  per request. Its process tree's CPU is sampled from ``/proc`` every 0.1 s and the
  server counts chunks in 0.1 s buckets, so both are read over the same steady window
  (the middle 80 % of the stream; start-up, tokenizer loading and result writing fall
  outside it). Per chunk c(k) = a + b/k at k chunks per request: a is the marginal CPU
  per chunk, b the per-request CPU; two k give both. Sustained chunks/s is the server's
  count over the same window: the server never waits, so that is what the tool's core
  allowed, unless the server's core was full (printed beside it). ``inferlab-1`` sends
  with the stack ``bench`` picks (httptools where the ``fast`` extra installed it),
  ``inferlab-1-aiohttp`` with ``--http-client aiohttp``, ``inferlab-1@REV`` is
  ``inferlab-1`` as git revision REV of this repository had it (its ``src/``).
- ``ttft``: ``inferlab bench`` against ``inferlab sim serve`` (Qwen2.5-7B on H100, 256
  prompt tokens, 64 output tokens) at 1, 64, 256 and 512 streams with 1 and 2 workers (2 where the client has 2 cores):
  client TTFT minus the server's own TTFT per request (the summary's
  ``server_timeline``), the summary's ``client`` block (bottleneck verdict, busiest
  process, loop lag) and how late the simulator itself emitted tokens (its
  ``inferlab:token_emit_lag_seconds``). Run as root, the error is split at the first
  token's packet arriving on loopback (``bench/wire_capture.py``): the client's own
  part, from that arrival to its stamp, and the rest (the server's lateness and the
  request's way to it). A last run (``--hogs``, 3 by default) repeats the largest
  level on one worker with busy loops on the client's core: a starved client, for the
  bottleneck verdict beside what the client was measured to add.
- ``poisson``: open-loop Poisson runs (``--rates``) with 2 workers (where the client has 2 cores) against the mock,
  which stamps each request's arrival: the number that arrived, every record once, and
  the Kolmogorov-Smirnov distance of the inter-arrival gaps from the requested
  exponential (the schedule, the client's send stamps, the server's arrival stamps).

    python bench/client_scale.py --quick     # about 7 minutes on a busy 2-core machine
    python bench/client_scale.py             # about 15 minutes
    python bench/client_scale.py --parts cpu --tools inferlab-1,aiperf --rounds 3
    python bench/client_scale.py --parts cpu --tools inferlab-1,inferlab-1-aiohttp --rounds 3
    python bench/client_scale.py --parts cpu --tools inferlab-1,inferlab-1@main --rounds 3
    python bench/client_scale.py --setup     # first: the peers' venvs under /tmp
    python bench/client_scale.py --parts cpu --tools inferlab-1,inferlab-2 --server-cpus any \
        --client-cpus any --mock-batch 32     # workers where the server costs little per chunk

Loopback only; every load is bounded in requests and time; every process started here
is stopped on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wire_capture
from gateway_overhead import checkout

from inferlab.results.clientload import CPU_BUSY, ClientLoad
from inferlab.results.telemetry import emit_lag

BENCH = Path(__file__).resolve().parent
MOCK = BENCH / "mock_server.py"
MODEL = "inferlab/mock-8b"  # (what the mock serves)
INPUT_TOKENS = 16
PEER_VENVS = {"aiperf": Path("/tmp/peer-venv"), "guidellm": Path("/tmp/guidellm-venv")}
PEER_PACKAGES = {"aiperf": ["aiperf==0.13.0"], "guidellm": ["guidellm==0.8.1"]}
#: GuideLLM imports torch; a CPU build is enough (it runs no model here).
TORCH_CPU_WHEELS = Path("/opt/wheels")
TOKENIZER_DIR = Path(tempfile.gettempdir()) / "client-scale-tokenizer"
TOOL_TIMEOUT_S = 300.0
#: vLLM's Rust client, as quoted by issue #18 (measured earlier, not in this run).
RUST_CLIENT_MS_PER_1K = 35.0


# --- processes and their CPU -----------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of one process (not its children), seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    return out


def machine_load() -> str:
    """How busy the machine is besides this run: the load average and the share of the
    last 10 s in which some runnable task waited for a CPU (Linux PSI)."""
    out = f"load average {os.getloadavg()[0]:.1f}"
    with contextlib.suppress(OSError), open("/proc/pressure/cpu") as f:
        out += f", CPU pressure {float(f.readline().split()[1].split('=')[1]):.0f} %"
    return out


def _reaped_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


class Sampler(threading.Thread):
    """Every 0.1 s: (monotonic s, CPU s of every process ever seen below ``root`` (its
    last value once gone), CPU s of ``server``)."""

    def __init__(self, root: int, server: int) -> None:
        super().__init__(daemon=True)
        self.root, self.server = root, server
        self.seen: dict[int, float] = {}
        self.series: list[tuple[float, float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            todo, done = [self.root, *self.seen], set()
            while todo:
                pid = todo.pop()
                if pid in done:
                    continue
                done.add(pid)
                cpu = _proc_cpu_s(pid)
                if cpu is not None:
                    self.seen[pid] = max(cpu, self.seen.get(pid, 0.0))
                    todo += _children(pid)
            srv = _proc_cpu_s(self.server) or 0.0
            self.series.append((time.monotonic(), sum(self.seen.values()), srv))
            self._halt.wait(0.1)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def at(self, t: float) -> tuple[float, float]:
        """(tool CPU, server CPU) at monotonic time ``t``, interpolated."""
        s = self.series
        i = min(max(1, bisect.bisect_left(s, (t,))), len(s) - 1)
        (t0, a0, b0), (t1, a1, b1) = s[i - 1], s[i]
        f = 0.0 if t1 == t0 else min(1.0, max(0.0, (t - t0) / (t1 - t0)))
        return a0 + f * (a1 - a0), b0 + f * (b1 - b0)


class Processes:
    """Every process this script starts, so that all of them stop on exit or Ctrl-C."""

    def __init__(self) -> None:
        self.popen: list[subprocess.Popen[Any]] = []

    def start(self, cmd: Sequence[str], cpus: set[int] | None, **kw: Any) -> subprocess.Popen[Any]:
        """``cmd`` in its own process group, pinned to ``cpus`` (by inheritance: this
        thread's affinity at the fork, then restored)."""
        mine = os.sched_getaffinity(0)
        if cpus:
            os.sched_setaffinity(0, cpus)
        try:
            p = subprocess.Popen(list(cmd), process_group=0, **kw)
        finally:
            os.sched_setaffinity(0, mine)
        self.popen.append(p)
        return p

    def stop(self, p: subprocess.Popen[Any]) -> None:
        """Stop ``p``'s whole process group (SIGTERM, then SIGKILL after 10 s)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # (anything left in its group)
        if p in self.popen:
            self.popen.remove(p)

    def stop_all(self) -> None:
        for p in list(self.popen):
            self.stop(p)


PROCS = Processes()


class Server:
    """A server in a child process, pinned to ``cpus``: the mock (``sim=False``) or
    ``inferlab sim serve``."""

    def __init__(self, cpus: set[int] | None, sim: bool = False, batch: int = 1) -> None:
        if sim:
            cmd = [sys.executable, "-m", "inferlab", "sim", "serve", "--port", "0", "--announce"]
        else:
            cmd = [sys.executable, str(MOCK), "serve", "--batch", str(batch)]
        self.proc = PROCS.start(cmd, cpus, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError("the server did not start")
        self.url = line if sim else f"http://127.0.0.1:{int(line)}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:  # loopback only
            return str(r.read().decode())

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.get("/mock/stats"))
        return out

    def close(self) -> None:
        PROCS.stop(self.proc)


@dataclass
class Measured:
    """One tool run against the mock: its return code, wall time, output, the server's
    counts and the CPU samples."""

    rc: int
    wall_s: float
    stdout: str
    stderr: str
    server: dict[str, Any]
    sampler: Sampler
    reaped_cpu_s: float  # getrusage(RUSAGE_CHILDREN) over the run

    def steady(self) -> tuple[float, float, float, float]:
        """Over the middle 80 % of the time chunks flowed: (chunks, seconds, tool CPU s,
        server CPU s)."""
        b = {int(k): int(v) for k, v in self.server["buckets"]}
        lo, hi = min(b), max(b) + 1  # in 0.1 s
        cut = max(1, (hi - lo) // 10)
        a, z = lo + cut, hi - cut
        if z <= a:
            a, z = lo, hi
        chunks = sum(v for k, v in b.items() if a <= k < z)
        (ca, sa), (cz, sz) = self.sampler.at(a / 10), self.sampler.at(z / 10)
        return chunks, (z - a) / 10, cz - ca, sz - sa

    def cpu_after_stream_s(self) -> float:
        """The tool's CPU after the server wrote its last chunk (shutdown, result files,
        and any backlog of per-chunk work the window did not see)."""
        last = (max(int(k) for k, _ in self.server["buckets"]) + 1) / 10
        return self.whole_cpu_s() - self.sampler.at(last)[0]

    def whole_cpu_s(self) -> float:
        """The tool's CPU over the whole run, start-up and result files included (what
        its reaped tree reported, or the last sample if more)."""
        return max(self.reaped_cpu_s, self.sampler.series[-1][1] if self.sampler.series else 0.0)


def measure(cmd: Sequence[str], server: Server, cpus: set[int] | None, work: Path,
            env: dict[str, str] | None = None) -> Measured:  # fmt: skip
    """Run ``cmd`` pinned to ``cpus`` against the mock ``server``, sampling its CPU."""
    server.get("/mock/reset")
    t0, reaped0 = time.monotonic(), _reaped_cpu_s()
    with open(work / "stdout.txt", "w+") as out, open(work / "stderr.txt", "w+") as err:
        p = PROCS.start(cmd, cpus, stdout=out, stderr=err, env=env, cwd=work)
        sampler = Sampler(p.pid, server.proc.pid)
        sampler.start()
        try:
            rc = p.wait(timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = -1
        finally:
            sampler.stop()
            PROCS.stop(p)
        out.seek(0)
        err.seek(0)
        wall, reaped = time.monotonic() - t0, _reaped_cpu_s() - reaped0
        return Measured(rc, wall, out.read(), err.read(), server.stats(), sampler, reaped)


# --- the tools -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    concurrency: int
    requests: int
    chunks: int  # content chunks (output tokens) per request


Command = Callable[[str, Load, Path], tuple[list[str], dict[str, str] | None]]


@dataclass(frozen=True)
class Tool:
    name: str
    label: str
    command: Command
    venv: Path | None = None  # a peer's own environment
    #: chunks per run in the cpu part (fewer for the peers: their runs take as long; a run
    #: of a few seconds, so that its steady window is seconds long)
    chunks_per_run: int = 1_000_000  # (inferlab: runs of 3-4 s, a steady window of seconds)


def _inferlab(workers: int, http_client: str = "auto", rev: str | None = None) -> Command:
    """``inferlab bench``; of this checkout, or of git revision ``rev`` (its ``src/``
    first on the path: the same interpreter and installed libraries)."""
    src: list[Path] = []

    def command(url: str, w: Load, work: Path) -> tuple[list[str], dict[str, str] | None]:
        env = None
        if rev is not None:
            if not src:
                src.append(checkout(rev, Path(tempfile.mkdtemp(prefix="client-scale-rev-"))))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src[0]), os.environ.get("PYTHONPATH", "")]))
        return [
            sys.executable, "-m", "inferlab", "bench", "--url", url, "--model", MODEL,
            "--concurrency", str(w.concurrency), "--num-requests", str(w.requests),
            "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(w.chunks),
            "--workers", str(workers), "--http-client", http_client, "--out", str(work / "out"), "--json",
        ], env  # fmt: skip

    return command


def _peer_env(work: Path) -> dict[str, str]:
    # (as in peer_compare.py: aiperf 0.13 cannot load a local tokenizer directory under
    # HF_HUB_OFFLINE; with a path nothing is fetched. TMPDIR: their caches go with `work`.)
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(HF_HUB_DISABLE_TELEMETRY="1", TMPDIR=str(work), NO_COLOR="1", TERM="dumb")
    return env


def _aiperf(url: str, w: Load, work: Path) -> tuple[list[str], dict[str, str] | None]:
    return [
        str(PEER_VENVS["aiperf"] / "bin" / "aiperf"), "profile", "--model", MODEL, "--url", url,
        "--endpoint-type", "chat", "--streaming", "--tokenizer", str(TOKENIZER_DIR),
        "--synthetic-input-tokens-mean", str(INPUT_TOKENS), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(w.chunks), "--output-tokens-stddev", "0",
        "--concurrency", str(w.concurrency), "--request-count", str(w.requests),
        "--use-server-token-count", "--random-seed", "0", "--ui-type", "none",
        "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot",
        "--output-artifact-dir", str(work / "artifacts"),
    ], _peer_env(work)  # fmt: skip


def _guidellm(url: str, w: Load, work: Path) -> tuple[list[str], dict[str, str] | None]:
    return [
        str(PEER_VENVS["guidellm"] / "bin" / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={url},model={MODEL}",
        "--profile", f"kind=concurrent,streams={w.concurrency}",
        "--constraint", f"kind=max_requests,count={w.requests}",
        "--data", f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={w.chunks}",
        "--tokenizer", f"kind=huggingface_auto,model={TOKENIZER_DIR}",
        "--output", f"kind=json,path={work / 'out.json'}", "--disable-console-interactive",
    ], _peer_env(work)  # fmt: skip


TOOLS = {
    "inferlab-1": Tool("inferlab-1", "inferlab --workers 1", _inferlab(1)),
    "inferlab-2": Tool("inferlab-2", "inferlab --workers 2", _inferlab(2)),
    # (``inferlab-1`` sends with httptools where the ``fast`` extra installed it)
    "inferlab-1-aiohttp": Tool("inferlab-1-aiohttp", "inferlab --workers 1 --http-client aiohttp", _inferlab(1, "aiohttp")),
    "aiperf": Tool("aiperf", "AIPerf", _aiperf, PEER_VENVS["aiperf"], 96_000),
    "guidellm": Tool("guidellm", "GuideLLM", _guidellm, PEER_VENVS["guidellm"], 96_000),
}


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A scratch directory, removed afterwards, except after a RuntimeError (a tool
    failed: its output stays there, and the error names the directory)."""
    work = Path(tempfile.mkdtemp(prefix=f"client-scale-{name}-"))
    try:
        yield work
    except RuntimeError:
        raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)


def run_tool(tool: Tool, server: Server, w: Load, cpus: set[int] | None) -> Measured:
    """One run of ``tool``; fails (with where its output was kept) unless every chunk
    was sent."""
    with scratch(tool.name) as work:
        cmd, env = tool.command(server.url, w, work)
        m = measure(cmd, server, cpus, work, env)
        expected = w.requests * w.chunks
        if m.rc != 0 or m.server["chunks"] < expected:
            raise RuntimeError(
                f"{tool.label} exited {m.rc} after {m.server['chunks']:,} of {expected:,} "
                f"chunks; its output is in {work}: {m.stderr.strip()[-400:]}"
            )
        return m


# --- the parts -------------------------------------------------------------------------------


def part_server(server: Server, cpus: set[int] | None, seconds: float) -> None:
    """The mock's ceiling: chunks/s with a client that parses nothing."""
    cmd = [sys.executable, str(MOCK), "drain", "--url", server.url,
           "--conns", "32", "--chunks", "2048", "--seconds", str(seconds)]  # fmt: skip
    with scratch("drain") as work:
        m = measure(cmd, server, cpus, work)
    if m.rc != 0:
        raise RuntimeError(f"the byte-counting client failed: {m.stderr[-400:]}")
    chunks, secs, cpu, srv = m.steady()
    print(
        f"\nmock server against a client that parses nothing (32 streams x 2,048 chunks, "
        f"{seconds:g} s): {chunks / secs:,.0f} chunks/s, server core {100 * srv / secs:.0f} % "
        f"busy, client core {100 * cpu / secs:.0f} %; server CPU {1e6 * srv / chunks:.1f} ms "
        f"per 1,000 chunks, so at most ~{chunks / srv:,.0f} chunks/s on its core"
    )


@dataclass
class CpuRow:
    per_1k: dict[int, list[float]] = field(default_factory=dict)  # chunks/request -> ms
    rate: dict[int, list[float]] = field(default_factory=dict)  # -> chunks/s
    server_busy: dict[int, list[float]] = field(default_factory=dict)  # -> share of a core
    whole: dict[int, list[float]] = field(default_factory=dict)  # -> ms/1k, whole run


def part_cpu(server: Server, tools: list[Tool], cpus: set[int] | None, rounds: int,
             scale: float) -> dict[str, float]:  # fmt: skip
    """CPU per 1,000 chunks at 64 and 512 chunks per request, the marginal CPU and the
    sustained chunks/s; returns the marginal ms per 1,000 chunks per tool."""
    counts, conc = (64, 512), 32
    print(
        f"\nclient CPU per 1,000 chunks and chunks/s, {conc} streams, {counts[0]} and {counts[1]} "
        f"chunks per request, over the steady middle 80 % of each run; {rounds} round(s), "
        f"order rotating, medians"
    )
    rows = {t.name: CpuRow() for t in tools}
    for r in range(rounds):
        for tool in tools[r % len(tools) :] + tools[: r % len(tools)]:
            for k in counts if r % 2 == 0 else counts[::-1]:
                n = max(2 * conc, round(tool.chunks_per_run * scale / k / conc) * conc)
                m = run_tool(tool, server, Load(conc, n, k), cpus)
                chunks, secs, cpu, srv = m.steady()
                row = rows[tool.name]
                row.per_1k.setdefault(k, []).append(1e6 * cpu / chunks)
                row.rate.setdefault(k, []).append(chunks / secs)
                row.server_busy.setdefault(k, []).append(srv / secs)
                row.whole.setdefault(k, []).append(1e6 * m.whole_cpu_s() / m.server["chunks"])
                print(
                    f"  round {r + 1} {tool.label:21} {k:4} chunks x {n:5} requests: "
                    f"{1e6 * cpu / chunks:7.1f} ms/1k, {chunks / secs:8,.0f} chunks/s, client core "
                    f"{100 * cpu / secs:3.0f} %, server core {100 * srv / secs:3.0f} %, "
                    f"{m.wall_s:5.1f} s wall, {m.cpu_after_stream_s():.1f} s CPU after the last "
                    f"chunk; {machine_load()}",
                    file=sys.stderr,
                )
    lo, hi = counts
    head = (
        f"{'tool':21} {f'ms/1k @{lo}':>10} {f'ms/1k @{hi}':>10} {'marginal':>9} "
        f"{'per request':>11} {f'chunks/s @{lo}':>14} {f'chunks/s @{hi}':>14} {'server core':>11}"
        f" {'whole run @' + str(lo) + '/' + str(hi):>17}"
    )
    print(head + "\n" + "-" * len(head))
    marginal: dict[str, float] = {}
    all_in: dict[str, float] = {}
    rate: dict[str, float] = {}
    for tool in tools:
        row = rows[tool.name]
        c_lo, c_hi = statistics.median(row.per_1k[lo]), statistics.median(row.per_1k[hi])
        a = (hi * c_hi - lo * c_lo) / (hi - lo)  # c(k) = a + b/k
        b_ms = (c_lo - a) * lo / 1000  # ms per request
        marginal[tool.name], all_in[tool.name] = a, c_lo
        rate[tool.name] = statistics.median(row.rate[hi])
        busy = max(statistics.median(v) for v in row.server_busy.values())
        print(
            f"{tool.label:21} {c_lo:10.1f} {c_hi:10.1f} {a:9.1f} {b_ms:8.2f} ms "
            f"{statistics.median(row.rate[lo]):14,.0f} {rate[tool.name]:14,.0f} "
            f"{100 * busy:9.0f} % {statistics.median(row.whole[lo]):8.0f}/"
            f"{statistics.median(row.whole[hi]):.0f}"
        )
    print(
        "(ms/1k: ms of the tool's process tree per 1,000 chunks, all its processes; marginal "
        "and per request: from c(k) = marginal + per_request/k; server core: the busiest of "
        "the server's core in that tool's runs: near 100 % means the server, not the tool, "
        "set the chunks/s; whole run: ms per 1,000 chunks of the whole run, start-up, "
        "tokenizer loading and result files included)"
    )
    base = marginal.get("inferlab-1")
    if base:
        print(
            f"ratios to inferlab --workers 1 (higher is costlier): marginal CPU per chunk; CPU per "
            f"chunk at {lo} chunks per request, all in; chunks/s at {hi} chunks per request"
        )
        for tool in tools:
            if tool.name != "inferlab-1":
                print(
                    f"  {tool.label:21} {marginal[tool.name] / base:7.2f}x "
                    f"{all_in[tool.name] / all_in['inferlab-1']:7.2f}x "
                    f"{rate[tool.name] / rate['inferlab-1']:7.2f}x"
                )
        print(
            f"  vLLM's Rust client    {RUST_CLIENT_MS_PER_1K / base:7.2f}x  ({RUST_CLIENT_MS_PER_1K:g} ms "
            "marginal per 1,000 as quoted in issue #18: not measured in this run)"
        )
    return marginal


def part_ttft(levels: list[int], workers: list[int], server_cpus: set[int] | None,
              client_cpus: set[int] | None, hogs: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Client TTFT minus the simulator's own at each concurrency and worker count (and, with
    ``hogs``, at the largest on one worker sharing its cores with that many busy loops)."""
    print(
        "\nTTFT error: inferlab bench against inferlab sim serve (Qwen2.5-7B, H100, real time), "
        "256 prompt / 64 output tokens; error = client TTFT - the server's own TTFT per "
        "request (the summary's server_timeline); client = the summary's client block"
    )
    no_wire = wire_capture.available()
    print(
        "the error split at the first token's packet arriving on loopback (kernel receive time, "
        "bench/wire_capture.py, the capture on the server's cores): client's own = its stamp "
        "minus that arrival (what the client adds); the rest = that arrival, from the send, "
        "less the simulator's own TTFT (the server's lateness, and the request's way to it)"
        if no_wire is None
        else f"(the error is not split at the wire: {no_wire})"
    )
    head = (
        f"{'streams':>7} {'workers':>7} {'reqs':>5} {'server TTFT p50':>15} {'error p50':>9} "
        f"{'error p99':>9} {'client own p50/p99':>18} {'the rest p50/p99':>19} "
        f"{'sim late ≤1ms/≤5ms':>18}  client block"
    )
    print(head + "\n" + "-" * (len(head) + 40))
    rows = []
    server = Server(server_cpus, sim=True)
    port = urllib.parse.urlsplit(server.url).port
    assert port is not None
    # every level at each worker count, then the largest level on one worker with
    # ``hogs`` busy loops sharing the client's cores: a client starved of its core
    fit = [w for w in workers if w <= _most_workers(w, client_cpus)]
    if fit != workers:
        print(f"(no run with --workers {max(workers)}: it needs as many client cores, --client-cpus or any)")
    plan = [(c, w, 0) for c in levels for w in fit] + ([(max(levels), 1, hogs)] if hogs else [])
    try:
        for c, w, n_hogs in plan:
            n = max(16, 2 * c)
            cmd = [sys.executable, "-m", "inferlab", "bench", "--url", server.url,
                   "-c", str(c), "-n", str(n), "--input-tokens", "256",
                   "--output-tokens", "64", "--workers", str(w)]  # fmt: skip
            lag0 = emit_lag(server.get("/metrics"))
            with scratch("ttft") as work:
                capture: contextlib.AbstractContextManager[Any] = (
                    contextlib.nullcontext()
                    if no_wire is not None
                    else wire_capture.Capture(port, work / "packets.pickle", server_cpus)
                )
                loops = [PROCS.start([sys.executable, "-c", "while True: pass"], client_cpus)
                         for _ in range(n_hogs)]  # fmt: skip
                with capture:
                    p = PROCS.start([*cmd, "--out", str(work / "run")], client_cpus,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
                    try:
                        _, err = p.communicate(timeout=TOOL_TIMEOUT_S)
                    finally:
                        PROCS.stop(p)
                        for loop in loops:
                            PROCS.stop(loop)
                if p.returncode != 0:
                    raise RuntimeError(f"inferlab bench failed at c={c}: {err.strip()[-400:]}")
                s = json.loads((work / "run" / "summary.json").read_text())
                wire: dict[str, Any] | None = None
                if no_wire is None:
                    lines = (work / "run" / "requests.jsonl").read_text().splitlines()
                    wire = wire_capture.match(work / "packets.pickle", [json.loads(x) for x in lines if x])
            lag = {k: v - lag0.get(k, 0.0) for k, v in emit_lag(server.get("/metrics")).items()}
            e, cl = s["server_timeline"]["ttft_error_ms"], s["client"]
            busiest = ClientLoad.from_json(cl).busiest  # (the summary's own choice)
            bl = busiest.loop_lag_ms
            verdict = "ok"
            if cl["bottleneck"]:  # (as the warning words it: its own CPU, or a wait for one)
                own = busiest.cpu_share >= CPU_BUSY
                verdict = "BOTTLENECK, " + ("its own CPU" if own else "waited for a core")
            warned = any("client was likely the bottleneck" in w for w in s["warnings"])
            total = lag.get(math.inf, 0.0) or 1.0
            late = f"{lag.get(0.001, 0) / total:.0%}/{lag.get(0.005, 0) / total:.0%}"
            split = mine = side = "-"
            if wire is not None:
                d, before = wire["delay_ms"], wire["rest_ms"] or [math.nan]
                mine = f"{wire_capture.quantile(d, 0.5):.3f}/{wire_capture.quantile(d, 0.99):.3f} ms"
                side = f"{wire_capture.quantile(before, 0.5):.2f}/{wire_capture.quantile(before, 0.99):.2f} ms"
                split = f"{wire['joined']} of {wire['records']} records joined to their packets"
                if wire["joined"] < wire["records"]:  # (the split is of a subset: say so in the row)
                    mine += f" ({wire['joined']}/{wire['records']})"
                    split += f" (not joined: index, responses alike, nearest gap ms: {wire['unjoined']})"
            if n_hogs:
                print(f"  starved: {n_hogs} busy loops on the client's core{'s' * (len(client_cpus or ()) > 1)}:")
            print(
                f"{c:7} {w:7} {n:5} {s['server_timeline']['server_ttft_ms']['p50']:12.1f} ms "
                f"{e['p50']:6.2f} ms {e['p99']:6.2f} ms {mine:>18} {side:>19} {late:>18}  {verdict}: busiest "
                f"{busiest.role} CPU {busiest.cpu_share:.0%}, loop lag p90 "
                f"{0.0 if bl is None else bl.p90:.1f} ms; inflation p50/p99 {cl['inflation_ms']['p50']:.1f}/"
                f"{cl['inflation_ms']['p99']:.1f} ms; warning {'yes' if warned else 'no'}"
            )
            print(f"{'':16}({split}; {machine_load()})", file=sys.stderr)
            rows.append({"c": c, "workers": w, "error": e, "client": cl, "warned": warned, "wire": wire,
                         "hogs": n_hogs})  # fmt: skip
    finally:
        server.close()
    print(
        "(sim late: share of the simulator's steps whose tokens left within 1 / 5 ms of their "
        "simulated time; a late step is in the error too, not only the client)"
    )
    by = {(r["c"], r["workers"]): r["error"] for r in rows if not r["hogs"]}
    if len(fit) > 1:
        w0, w1 = fit[0], fit[-1]
        print(
            f"error ratio, {w1} workers / {w0} (p50, p99): "
            + "; ".join(
                f"{c} stream{'s' * (c != 1)} {by[c, w1]['p50'] / by[c, w0]['p50']:.2f}, "
                f"{by[c, w1]['p99'] / by[c, w0]['p99']:.2f}"
                for c in levels
            )
        )
    for r in rows:
        beside = f", {r['hogs']} busy loops beside it" if r["hogs"] else ""
        if r["c"] == max(levels) and r["wire"] is not None:
            d = r["wire"]["delay_ms"]
            p50, p99 = wire_capture.quantile(d, 0.5), wire_capture.quantile(d, 0.99)
            print(
                f"the client's own TTFT error at {r['c']} streams, {r['workers']} worker(s){beside}: "
                f"p50 {p50:.3f} ms, p99 {p99:.3f} ms (issue #18's target: p50 < 1 ms, p99 < 5 ms): "
                + ("met" if p50 < 1 and p99 < 5 else "NOT met")
            )
    print("bottleneck verdict beside what the client added (its own TTFT error at p99, where measured):")
    for r in rows:
        if r["workers"] == 1 and r["c"] in (min(levels), max(levels)):
            beside = f", {r['hogs']} busy loops beside it" if r["hogs"] else ""
            own = "" if r["wire"] is None else f", own error p99 {wire_capture.quantile(r['wire']['delay_ms'], 0.99):.2f} ms"
            print(
                f"  {r['c']} stream(s), 1 worker{beside}: bottleneck {r['client']['bottleneck']}, "
                f"warned {r['warned']}{own}"
            )
    return rows


def ks_exponential(times_ns: Sequence[int], rate_rps: float) -> tuple[float, float, int]:
    """Kolmogorov-Smirnov distance of the gaps between sorted ``times_ns`` from the
    exponential distribution of ``rate_rps``: (D, the 5 % critical value, gaps)."""
    t = sorted(times_ns)
    gaps = sorted((b - a) / 1e9 for a, b in itertools.pairwise(t))
    n = len(gaps)
    d = 0.0
    for i, g in enumerate(gaps):
        f = 1.0 - math.exp(-rate_rps * g)
        d = max(d, (i + 1) / n - f, f - i / n)
    return d, 1.358 / math.sqrt(n), n


def _most_workers(workers: int, cpus: set[int] | None) -> int:
    """``workers``, or fewer where the client is pinned to fewer cores: ``inferlab bench``
    refuses more workers than the cores it may run on (its CPU affinity), so a run
    with 2 workers needs ``--client-cpus`` of 2 cores (or ``any``)."""
    return workers if not cpus else min(workers, len(cpus))


def part_poisson(server: Server, cpus: set[int] | None, rate: float, seconds: float) -> None:
    """An open-loop Poisson run with 2 workers (1 on a client pinned to one core):
    count, merging and the arrival process."""
    n = round(rate * seconds)
    workers = _most_workers(2, cpus)
    if workers < 2:
        print("\n(the Poisson run with 1 worker: --workers 2 needs 2 client cores, --client-cpus 0,1 or any)")
    with scratch("poisson") as work:
        cmd = [sys.executable, "-m", "inferlab", "bench", "--url", server.url, "--model", MODEL,
               "--rate", f"{rate:g}", "--arrival", "poisson", "-n", str(n), "--seed", "7",
               "--input-tokens", str(INPUT_TOKENS), "--output-tokens", "16", "--workers", str(workers),
               "--no-preflight", "--out", str(work / "out")]  # fmt: skip
        m = measure(cmd, server, cpus, work)
        if m.rc != 0:
            raise RuntimeError(f"the Poisson run failed: {m.stderr.strip()[-400:]}")
        s = json.loads((work / "out" / "summary.json").read_text())
        with open(work / "out" / "requests.jsonl") as f:
            recs = [json.loads(line) for line in f]
    arrived = m.server["arrivals_ns"]
    indexes = sorted(r["index"] for r in recs)
    print(
        f"\nopen loop, Poisson {rate:g} req/s, {n} requests, 16 chunks each, --workers {workers} "
        f"(resolved: {s['config']['resolved'].get('workers')}), client on {sorted(cpus or []) or 'any'}:"
    )
    print(
        f"  count: server received {len(arrived)}, records {len(recs)} (indexes 0..{n - 1} each "
        f"once: {indexes == list(range(n))}), summary completed {s['counts']['completed']}"
    )
    delay = s["queue_delay_ms"]
    print(f"  send delay (sent - intended): p50 {delay['p50']:.2f} ms, p99 {delay['p99']:.2f} ms")
    sources = [
        ("schedule (intended send times)", [r["intended_send_ns"] for r in recs]),
        ("client's send stamps", [r["send_ns"] for r in recs if r["send_ns"] is not None]),
        ("server's arrival stamps", arrived),
    ]
    for label, times in sources:
        d, crit, gaps = ks_exponential(times, rate)
        span = (max(times) - min(times)) / 1e9
        print(
            f"  {label:31}: {gaps / span:7.1f} req/s over {span:.2f} s; KS D = {d:.4f} against "
            f"exponential({rate:g}/s) ({'within' if d < crit else 'ABOVE'} the 5 % critical "
            f"value {crit:.4f})"
        )
    cl = s["client"]
    print(
        f"  client block: bottleneck {cl['bottleneck']}, inflation p50/p99 "
        f"{cl['inflation_ms']['p50']:.1f}/{cl['inflation_ms']['p99']:.1f} ms; "
        + ", ".join(f"{p['role']} CPU {p['cpu_share']:.0%}" for p in cl["processes"])
    )


# --- setup and main ------------------------------------------------------------------------


def setup() -> None:
    """Create each peer's venv under /tmp from the package index (never inferlab's)."""
    for name, venv in PEER_VENVS.items():
        if (venv / "bin" / name).exists():
            print(f"{name}: already in {venv}")
            continue
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pkgs = list(PEER_PACKAGES[name])
        cpu = sorted(TORCH_CPU_WHEELS.glob("torch-*+cpu-*.whl"))
        if name == "guidellm" and cpu:
            pkgs = [str(cpu[-1]), *pkgs]  # (else pip takes the index's default torch build)
        print(f"{name}: pip install {' '.join(pkgs)} into {venv}")
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", *pkgs], check=True, timeout=1800
        )


def _versions() -> str:
    from importlib.metadata import version

    out = [f"python {sys.version.split()[0]}", f"aiohttp {version('aiohttp')}"]
    for name, venv in PEER_VENVS.items():
        if (venv / "bin" / "python").exists():
            p = subprocess.run(
                [str(venv / "bin" / "python"), "-c",
                 f"import importlib.metadata as m; print(m.version('{name}'))"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            out.append(f"{name} {p.stdout.strip() or '?'}")
    return ", ".join(out)


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def _cpus(spec: str) -> set[int] | None:
    return None if spec in ("", "any") else {int(c) for c in spec.split(",")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--setup", action="store_true", help="create the peers' venvs, then run")
    ap.add_argument("--quick", action="store_true", help="smaller runs, one round (~5 min)")
    ap.add_argument("--parts", default="server,cpu,ttft,poisson")
    ap.add_argument("--tools", default=",".join(TOOLS), help="of " + ", ".join(TOOLS))
    ap.add_argument("--server-cpus", default="0", help="the server's cores ('any': not pinned)")
    ap.add_argument("--client-cpus", default="1", help="the tools' cores ('any': not pinned)")
    ap.add_argument("--rounds", type=int, help="cpu part: repetitions (default 2, quick 1)")
    ap.add_argument("--rates", default="200,500", help="poisson part: requests/s, comma-separated")
    ap.add_argument("--mock-batch", type=_at_least(1), default=1,
                    help="content chunks the mock writes to a stream at a time (each its own HTTP chunk): "
                    "a server that costs little per chunk, for the tools' scaling")  # fmt: skip
    ap.add_argument("--hogs", type=_at_least(0), default=3,
                    help="ttft part: busy loops on the client's cores for a last, starved run (0: none)")  # fmt: skip
    args = ap.parse_args(argv)

    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in ("server", "cpu", "ttft", "poisson")]:
        ap.error(f"unknown parts: {', '.join(unknown)}")
    for name in args.tools.split(","):
        if name.startswith("inferlab-1@"):  # (this tool at another revision)
            TOOLS[name] = Tool(name, f"inferlab --workers 1 at {name[11:]}", _inferlab(1, rev=name[11:]))
    if unknown := [n for n in args.tools.split(",") if n not in TOOLS]:
        ap.error(f"unknown tools: {', '.join(unknown)}")
    if args.setup:
        setup()
    tools = []
    for name in args.tools.split(","):
        tool = TOOLS[name]
        if tool.name == "inferlab-2" and _most_workers(2, _cpus(args.client_cpus)) < 2:
            print(f"skipping {tool.label}: it needs 2 client cores (--client-cpus 0,1 or any)", file=sys.stderr)
            continue
        if tool.venv is not None and not (tool.venv / "bin" / name).exists():
            print(f"skipping {tool.label}: not in {tool.venv} (run with --setup)", file=sys.stderr)
        else:
            tools.append(tool)
    server_cpus, client_cpus = _cpus(args.server_cpus), _cpus(args.client_cpus)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    print(
        f"client_scale, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {len(os.sched_getaffinity(0))} "
        f"cores; server on {sorted(server_cpus or []) or 'any'}, tools on "
        f"{sorted(client_cpus or []) or 'any'}; {_versions()}; at the start: {machine_load()}"
    )
    try:
        if "cpu" in parts and any(t.venv for t in tools):
            sys.path.insert(0, str(BENCH))
            from peer_compare import train_tokenizer  # the tiny offline BPE peers insist on

            train_tokenizer(next(t.venv for t in tools if t.venv), TOKENIZER_DIR)
        if {"server", "cpu", "poisson"} & set(parts):
            mock = Server(server_cpus, batch=args.mock_batch)
            try:
                if "server" in parts:
                    part_server(mock, client_cpus, 3.0 if args.quick else 6.0)
                if "cpu" in parts:
                    part_cpu(mock, tools, client_cpus, args.rounds or (1 if args.quick else 2),
                             0.5 if args.quick else 1.0)  # fmt: skip
                if "poisson" in parts:
                    for rate in (float(r) for r in args.rates.split(",")):
                        part_poisson(mock, client_cpus, rate, 2.0 if args.quick else 4.0)
            finally:
                mock.close()
        if "ttft" in parts:
            levels = [1, 64, 256] if args.quick else [1, 64, 256, 512]
            if args.hogs and not client_cpus:
                print("(no starved run: --hogs needs the client pinned, --client-cpus)")
            part_ttft(levels, [1, 2], server_cpus, client_cpus, args.hogs if client_cpus else 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        PROCS.stop_all()
    print(f"\n({time.monotonic() - started:.0f} s; at the end: {machine_load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
