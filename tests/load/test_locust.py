"""Distributed load on Locust, for real: a Locust master and two workers as local
processes against ``sim serve`` on loopback. What the master wrote (the run directory)
must hold exactly the records the workers' users measured: same count, and each record
the same but for its number and one offset per worker (its clock's zero on the run's).

Skipped where the ``locust`` extra is not installed. Locust is never imported here: it
patches the standard library for gevent, which the asyncio tests must not get."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from inferlab.sim.server.launch import ChildServer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="the locust extra is not installed")

LOCUSTFILE = '''
import json, os
import inferlab.load.locust as il


class SentUser(il.LLMUser):
    """LLMUser, also writing each record it measured to this process's own file."""

    def on_record(self, record):
        path = os.path.join(os.environ["SENT_DIR"], f"{os.getpid()}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(record.to_json()) + "\\n")
        # (a test's event, at this process's Nth record: KILL="<after> <pid> <signal>")
        after, pid, sig = (os.environ.get("KILL") or "0 0 0").split()
        with open(path) as f:
            if int(after) and sum(1 for _ in f) == int(after):
                os.kill(int(pid) or os.getpid(), int(sig))
'''
TIMES = ("intended_send_ns", "send_ns", "ttfb_ns", "end_ns")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def locust(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "locust", "-f", "locustfile.py", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def relative(r: dict[str, Any]) -> tuple[Any, ...]:
    """A record without its number, its times relative to its own send."""
    send = r["send_ns"]
    rest = {k: v for k, v in r.items() if k not in (*TIMES, "index", "content_ns")}
    times = [None if r[k] is None else r[k] - send for k in TIMES]
    return (json.dumps(rest, sort_keys=True), *times, tuple(t - send for t in r["content_ns"]))


@pytest.fixture(scope="module")
def server() -> Any:
    with ChildServer() as s:
        yield s


def test_a_master_and_two_workers_write_exactly_what_the_workers_measured(server: ChildServer, tmp_path: Path) -> None:
    (tmp_path / "locustfile.py").write_text(LOCUSTFILE)
    sent_dir = tmp_path / "sent"
    sent_dir.mkdir()
    out = tmp_path / "run"
    env = {**os.environ, "SENT_DIR": str(sent_dir)}
    port = free_port()
    master = locust(
        "--master", "--headless", "-u", "4", "-r", "4", "-t", "3s", "--expect-workers", "2",
        "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port), "--stop-timeout", "20",
        "--host", server.url, "--inferlab-out", str(out), "--inferlab-input-tokens", "32",
        "--inferlab-output-tokens", "8", "--only-summary", cwd=tmp_path, env=env,
    )
    workers = [
        locust("--worker", "--master-host", "127.0.0.1", "--master-port", str(port), cwd=tmp_path, env=env)
        for _ in range(2)
    ]
    try:
        master_log, _ = master.communicate(timeout=150)
        logs = [w.communicate(timeout=30)[0] for w in workers]
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert master.returncode == 0, master_log[-3000:]
    assert all(w.returncode == 0 for w in workers), logs

    sent_files = sorted(sent_dir.glob("*.jsonl"))
    assert len(sent_files) == 2  # both workers measured requests
    sent = {f.stem: [json.loads(line) for line in f.read_text().splitlines()] for f in sent_files}
    assert all(sent.values())
    merged = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]

    # the same records: as many, each the same but for its number and absolute times
    assert len(merged) == sum(map(len, sent.values()))
    assert Counter(map(relative, merged)) == Counter(relative(r) for rs in sent.values() for r in rs)
    # numbered 0..n-1 in the order they were sent
    assert [r["index"] for r in merged] == list(range(len(merged)))
    assert [r["send_ns"] for r in merged] == sorted(r["send_ns"] for r in merged)
    # one offset per worker (its t0 on the run's clock), the earliest worker's is zero
    by_key = {relative(r): r for r in merged}
    offsets = []
    for rs in sent.values():
        shifts = {by_key[relative(r)]["send_ns"] - r["send_ns"] for r in rs}
        assert len(shifts) == 1
        offsets.append(shifts.pop())
    assert min(offsets) == 0 and max(offsets) >= 0

    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["counts"]["total"] == len(merged)
    assert summary["counts"]["completed"] == sum(r["error_kind"] is None for r in merged) > 0
    assert sorted(config["resolved"]["workers"].values()) == sorted(map(len, sent.values()))
    assert config["load"]["executor"] == "locust" and config["load"]["locust"]["users"] == 4
    assert "inferlab: " in master_log and f"{len(merged)} records from 2 worker(s)" in master_log
    # no preflight and no tokenizer: the prompts' lengths are approximate, and the summary
    # says so as bench's does (the README said it did; it said nothing)
    assert summary["input_length_source"].startswith("approximate")
    assert f"prompt lengths are {summary['input_length_source']}" in summary["warnings"]

    # inferlab locust-merge rebuilds the same run from what the master received
    before = {name: (out / name).read_bytes() for name in ("requests.jsonl", "summary.json", "config.json")}
    p = subprocess.run([sys.executable, "-m", "inferlab", "locust-merge", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert {name: (out / name).read_bytes() for name in before} == before
    assert f"{len(merged)} records from 2 worker(s)" in p.stderr


def test_a_folder_holding_a_run_is_refused_with_locusts_own_flag_names(tmp_path: Path) -> None:
    # (bench's check, whose message named bench's --out and --overwrite: no flags of Locust's)
    (tmp_path / "locustfile.py").write_text(LOCUSTFILE)
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    p = locust(
        "--headless", "-u", "1", "-r", "1", "-t", "1s", "--host", "http://127.0.0.1:9",
        "--inferlab-out", str(out), cwd=tmp_path, env={**os.environ, "SENT_DIR": str(tmp_path)},
    )
    log, _ = p.communicate(timeout=120)
    assert p.returncode == 2, log[-3000:]
    line = next(x for x in log.splitlines() if x.startswith("inferlab: error:"))
    assert "--inferlab-out" in line and "--inferlab-overwrite" in line
    assert " --out" not in line and " --overwrite" not in line
    assert (out / "summary.json").read_text() == "{}"  # the run already there is untouched


def test_a_sender_that_cannot_reach_the_server_exits_1(tmp_path: Path) -> None:
    # no model to discover, so nothing is sent: Locust alone would exit 0 (no request failed)
    (tmp_path / "locustfile.py").write_text(LOCUSTFILE)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    p = locust(
        "--headless", "-u", "1", "-r", "1", "-t", "2s", "--host", f"http://127.0.0.1:{closed}",
        "--inferlab-out", str(tmp_path / "run"), cwd=tmp_path, env={**os.environ, "SENT_DIR": str(tmp_path)},
    )
    log, _ = p.communicate(timeout=120)
    assert p.returncode == 1, log[-3000:]
    assert "inferlab: cannot reach" in log


def distributed(
    tmp_path: Path, url: str, *args: str, workers: int = 1, kill: str = "", kill_worker: int = 0,
) -> tuple[subprocess.Popen[str], list[subprocess.Popen[str]]]:
    """A master (``args`` added) and ``workers`` workers against ``url``, writing
    ``tmp_path/run``; ``kill`` (the locustfile's ``KILL``: "<after> <pid> <signal>", pid 0
    the worker itself, MASTER the master) for worker ``kill_worker`` only."""
    (tmp_path / "locustfile.py").write_text(LOCUSTFILE)
    (tmp_path / "sent").mkdir()
    env = {**os.environ, "SENT_DIR": str(tmp_path / "sent")}
    port = free_port()
    master = locust(
        "--master", "--headless", "--expect-workers", str(workers), "--master-bind-host", "127.0.0.1",
        "--master-bind-port", str(port), "--host", url, "--inferlab-out", str(tmp_path / "run"),
        "--inferlab-input-tokens", "32", "--inferlab-output-tokens", "8", "--only-summary", *args,
        cwd=tmp_path, env=env,
    )
    procs = []
    for i in range(workers):
        event = kill.replace("MASTER", str(master.pid)) if i == kill_worker else ""
        procs.append(locust("--worker", "--master-host", "127.0.0.1", "--master-port", str(port), cwd=tmp_path,
                            env={**env, "KILL": event}))
    return master, procs


def finish(master: subprocess.Popen[str], workers: list[subprocess.Popen[str]], timeout: float = 150) -> str:
    """The master's log once it and its workers have ended (killed if they do not)."""
    try:
        log, _ = master.communicate(timeout=timeout)
        for w in workers:
            w.communicate(timeout=30)
        return log
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_server_that_stops_answering_stops_the_run_as_it_does_bench(tmp_path: Path) -> None:
    # (its users re-sent at once: tens of thousands of instant failures until -t, a 99%
    # failure rate, and nothing said of the server; bench stops the run and says so)
    from inferlab.load.http import GONE_CAP_PER_SLOT

    server = ChildServer()
    try:
        master, workers = distributed(tmp_path, server.url, "-u", "4", "-r", "4", "-t", "30s", "--stop-timeout", "10",
                                      kill=f"8 {server.pid} {int(signal.SIGTERM)}")
        log = finish(master, workers)
    finally:
        server.close()
    assert master.returncode == 1, log[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] and summary["counts"]["completed"] >= 8
    # (the rule's cap for 4 users, and the requests in flight as the worker stopped them)
    assert 0 < summary["counts"]["after_server_gone"] <= summary["counts"]["failed"] <= (GONE_CAP_PER_SLOT + 1) * 4
    assert any(w.startswith("the server stopped answering") for w in summary["warnings"])


def test_a_master_stopped_before_its_run_time_says_the_run_was_interrupted(server: ChildServer, tmp_path: Path) -> None:
    # (Ctrl-C on the master wrote a run of 30 s's -t that looked complete)
    master, workers = distributed(tmp_path, server.url, "-u", "2", "-r", "2", "-t", "30s", "--stop-timeout", "10",
                                  kill=f"6 MASTER {int(signal.SIGINT)}")
    log = finish(master, workers)
    assert master.returncode == 0, log[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] and summary["counts"]["completed"] >= 6
    assert any("stopped before its -t of 30 s" in w for w in summary["warnings"])
    # locust-merge says the same from what the master kept
    p = subprocess.run([sys.executable, "-m", "inferlab", "locust-merge", "--json", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0 and json.loads(p.stdout)["interrupted"], p.stderr


def test_the_master_does_not_wait_for_a_last_batch_from_a_worker_locust_found_missing(
    server: ChildServer, tmp_path: Path,
) -> None:
    # (it waited --stop-timeout + 30 s for a worker killed mid-run: here 150 s; and a
    # worker killed before its first batch went unsaid)
    master, workers = distributed(tmp_path, server.url, "-u", "4", "-r", "4", "-t", "8s", "--stop-timeout", "120",
                                  workers=2, kill=f"4 0 {int(signal.SIGKILL)}")
    log = finish(master, workers, timeout=75)
    assert master.returncode == 0, log[-3000:]
    assert workers[0].returncode == -signal.SIGKILL
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert any(w.startswith("no last batch came from worker(s)") for w in summary["warnings"])
    assert summary["counts"]["completed"] > 4


def sent_records(tmp_path: Path) -> Counter[tuple[Any, ...]]:
    """What the workers' users measured (``relative``), from their own files."""
    return Counter(relative(json.loads(line)) for f in (tmp_path / "sent").glob("*.jsonl")
                   for line in f.read_text().splitlines())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_worker_stopped_before_the_masters_run_time_says_the_run_was_interrupted(
    server: ChildServer, tmp_path: Path, sig: signal.Signals,
) -> None:
    # (Ctrl-C on the only worker: the master, its last worker gone, stopped the test; the
    # worker's last batch came after it said it quit, so the master wrote no run at all
    # (its records lost) or, after earlier batches, one that looked complete)
    master, workers = distributed(tmp_path, server.url, "-u", "2", "-r", "2", "-t", "30s", "--stop-timeout", "10",
                                  kill=f"6 0 {int(sig)}")
    log = finish(master, workers)
    assert master.returncode == 0, log[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (name,) = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["workers"]
    assert summary["interrupted"] and summary["counts"]["completed"] >= 6
    assert any(w.startswith(f"the test ended early: worker(s) {name} stopped before the master ended it")
               for w in summary["warnings"])
    # every record the worker measured reached the master
    merged = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert Counter(map(relative, merged)) == sent_records(tmp_path)


def test_a_worker_stopped_while_others_run_on_is_named_and_the_run_is_not_cut_short(
    server: ChildServer, tmp_path: Path,
) -> None:
    # (Locust gives a quitting worker's users to the others, which run to -t: the run is
    # whole, but its load was moved; it went unsaid)
    master, workers = distributed(tmp_path, server.url, "-u", "4", "-r", "4", "-t", "8s", "--stop-timeout", "10",
                                  workers=2, kill=f"4 0 {int(signal.SIGTERM)}")
    log = finish(master, workers)
    assert master.returncode == 0, log[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    names = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["workers"]
    assert len(names) == 2 and not summary["interrupted"]
    said = [w for w in summary["warnings"] if " stopped before the master ended the test" in w]
    assert len(said) == 1 and sum(f"worker(s) {n} stopped" in said[0] for n in names) == 1, summary["warnings"]
    merged = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert Counter(map(relative, merged)) == sent_records(tmp_path)
