"""Distributed load on Locust (the ``locust`` extra): ``LLMUser`` sends inferlab's
workloads from Locust's users, on as many worker machines as Locust has, and the master
writes the usual run directory, with every request's exact record.

Locust decides *when*: each user is a closed-loop user (its next request when its last
one ends), as many users as ``-u``, started at ``-r``, for ``-t``. inferlab decides
*what*: the workload flags (``--inferlab-input-tokens`` ...) build the same requests
``inferlab bench`` sends, each worker its own stream (seeded by the run's seed and the
worker's index). Each request is sent by ``client.gevent_http`` (Locust's users are
greenlets; the asyncio client cannot run there) and read by the same code as
``bench``'s client (``client.exchange``), so its record holds the same raw timestamps:
one clock reading per network read, TTFT/TPOT/ITL as exact as ``bench``'s, not
Locust's rounded response times. Workers send their records to the master in batches
(Locust's custom messages, about once a second and at the end); the master appends
them to ``OUT/locust-records.jsonl`` as they come and, when the test stops, asks every
worker for its last batch, waits for it, and writes ``config.json``,
``requests.jsonl`` and ``summary.json`` (``load.distributed``). A worker stopped on its
own (Ctrl-C, SIGTERM) while the test runs stops its users and sends its last batch,
saying so, before Locust tells the master that it quit: the summary names it. Locust's
own statistics see every request too (its ``request`` event: the E2E time, the output
characters).

Run (docs: README, "Distributed load on Locust")::

    # locustfile.py
    from inferlab.load.locust import LLMUser  # noqa: F401

    locust -f locustfile.py --master --headless -u 64 -r 16 -t 2m --expect-workers 2 \\
        --host http://server:8000 --inferlab-out runs/locust1 --inferlab-input-tokens 256 \\
        --inferlab-output-tokens 64
    locust -f locustfile.py --worker --master-host MASTER   # on each worker machine

Importing this module imports Locust, which patches the standard library for gevent:
import it only in a Locust process (a locustfile), never next to asyncio code.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
from locust import User, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from inferlab._clock import NS_PER_S, WallClock, epoch_anchor_ns
from inferlab._errors import InferlabError, UsageError
from inferlab.client.exchange import Endpoint, api_base, request_body
from inferlab.client.gevent_http import GeventClient
from inferlab.load.distributed import (
    CONFIG_FILE,
    RAW_FILE,
    Batch,
    append_batch,
    describe,
    finish_run,
)
from inferlab.load.http import GoneWatch
from inferlab.results.records import ErrorKind, RequestRecord
from inferlab.results.runfiles import check_out_dir
from inferlab.workload.config import WorkloadConfig
from inferlab.workload.spec import RequestSpec

__all__ = ["LLMUser"]

log = logging.getLogger("inferlab")

#: Worker → master: a ``Batch``. Master → worker: stop now and send your last batch.
RECORDS_MESSAGE = "inferlab_records"
STOP_MESSAGE = "inferlab_stop"
#: How often a worker sends the records that ended since its last batch.
BATCH_INTERVAL_S = 1.0
#: How long the master waits for the workers' last batches beyond Locust's stop timeout.
FINAL_WAIT_S = 30.0


def _options(parser: Any, **_: Any) -> None:
    """inferlab's flags, on Locust's command line (the master passes them to workers)."""
    parser.add_argument("--inferlab-out", default="", help="master: the run directory to write (required)")
    parser.add_argument("--inferlab-overwrite", action="store_true", help="replace a run already in --inferlab-out")
    parser.add_argument("--inferlab-model", default="", help="the model (default: the first one /v1/models lists)")
    parser.add_argument("--inferlab-api", default="chat", choices=["chat", "completions"], help="the API to call")
    parser.add_argument("--inferlab-input-tokens", default="", help="prompt length spec (e.g. 256, uniform:100:900)")
    parser.add_argument("--inferlab-output-tokens", default="", help="output length spec (exact where the server allows)")
    parser.add_argument("--inferlab-prompt", default="", help="one fixed prompt for every request")
    parser.add_argument("--inferlab-tokenizer", default="", help="a local tokenizer.json: exact prompt lengths")
    parser.add_argument("--inferlab-seed", type=int, default=0, help="the workload's seed (each worker adds its index)")
    parser.add_argument("--inferlab-prompt-salt", default="", help="the prompts' salt (default: fresh each run)")
    parser.add_argument("--inferlab-timeout", type=float, default=600.0, help="seconds for a whole request")
    parser.add_argument("--inferlab-idle-timeout", type=float, default=60.0, help="seconds without a byte mid-response")


def _workload_config(o: Any) -> WorkloadConfig:
    return WorkloadConfig(
        input_tokens=o.inferlab_input_tokens or None,
        output_tokens=o.inferlab_output_tokens or None,
        prompt=o.inferlab_prompt or None,
        tokenizer=o.inferlab_tokenizer or None,
        prompt_salt=o.inferlab_prompt_salt or None,
    )


def _opts(environment: Environment) -> Any:
    """Locust's parsed command line, inferlab's flags included."""
    return environment.parsed_options


def _endpoint(environment: Environment, model: str) -> Endpoint:
    o = _opts(environment)
    if not environment.host:
        raise UsageError("--host is required: the server's URL, e.g. http://127.0.0.1:8000")
    try:
        base = api_base(environment.host)
    except ValueError as e:
        raise UsageError(f"--host: {e}") from None
    return Endpoint(
        base_url=base, model=model, api=o.inferlab_api, timeout_s=o.inferlab_timeout,
        idle_timeout_s=o.inferlab_idle_timeout,
    )


def _workload(o: Any, index: int) -> Iterator[RequestSpec]:
    """This worker's stream of requests: the run's workload, seeded for worker ``index``."""
    wcfg = _workload_config(o)
    salt = o.inferlab_prompt_salt or ""
    built = wcfg.build(o.inferlab_seed + 1_000_003 * index, o.inferlab_api, builder=wcfg.builder(o.inferlab_api, salt=salt))
    if not isinstance(built, Iterator):
        raise UsageError("under Locust, only request-by-request workloads run (not traces or sessions)")
    return built


class _Sender:
    """One sending process (a worker, or a local run): its clock's zero, its workload and
    the records not yet sent to the master."""

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        runner = environment.runner
        self.name = runner.client_id if isinstance(runner, WorkerRunner) else "local"
        index = runner.worker_index if isinstance(runner, WorkerRunner) else 0
        o = _opts(environment)
        self.clock = WallClock()
        epoch_ns, mono_ns = epoch_anchor_ns()
        self.t0_ns = self.clock.now_ns()
        self.t0_epoch_ns = epoch_ns + (self.t0_ns - mono_ns)
        model = o.inferlab_model
        if not model:
            probe = GeventClient(_endpoint(environment, ""), self.now_ns)
            try:
                model = probe.discover_model()
            finally:
                probe.close()
        self.endpoint = _endpoint(environment, model)
        self.workload = _workload(o, index)
        self.pending: list[dict[str, Any]] = []
        self.next_index = 0
        self.in_flight = 0
        self.watch = GoneWatch()
        self.gone: str | None = None  # why this sender stopped: the server stopped answering
        self.stopped_early = False  # this worker was stopped (Ctrl-C, SIGTERM) while its test ran
        self.finished = False
        self._flusher = gevent.spawn(self._flush_every)

    def now_ns(self) -> int:
        return self.clock.now_ns() - self.t0_ns

    def started(self) -> None:
        """A user sent a request."""
        self.in_flight += 1
        self.watch.peak = max(self.watch.peak, self.in_flight)

    def add(self, record: RequestRecord) -> None:
        """``record``'s request ended: keep it for the next batch; stop this process's
        users once the server has stopped answering (``bench``'s rule: a closed-loop user
        re-sends at once, so a dead server would turn the rest of the run into thousands
        of instant failures a second)."""
        self.in_flight -= 1
        self.pending.append(record.to_json())
        now_s = self.now_ns() / NS_PER_S
        self.watch.note(record, now_s)
        if self.gone is None and self.watch.gone(now_s, at_end=False):
            self.gone = self.watch.why
            log.error("inferlab: %s", self.watch.error())
            self.environment.process_exit_code = 1
            if self.environment.runner is not None:  # (not from this user's greenlet: stop kills it)
                gevent.spawn(self.environment.runner.quit)

    def flush(self, final: bool = False) -> None:
        """Send the pending records (and, ``final``, say there will be no more)."""
        if self.finished or (not self.pending and not final):
            return
        batch = Batch(self.name, self.t0_epoch_ns, self.pending, final, self.endpoint.model, self.gone if final else None,
                      final and self.stopped_early)
        self.pending = []
        self.finished = final
        if final:
            self._flusher.kill(block=False)
        runner = self.environment.runner
        if isinstance(runner, WorkerRunner):
            runner.send_message(RECORDS_MESSAGE, batch.to_json())
        elif _collector is not None:
            _collector.add(batch)

    def _flush_every(self) -> None:
        while True:
            gevent.sleep(BATCH_INTERVAL_S)
            self.flush()


class _Collector:
    """The master's side (or a local run's): the raw file, and who has sent its last batch."""

    def __init__(self, environment: Environment, out: Path) -> None:
        self.environment = environment
        self.out = out
        self.seen: set[str] = set()
        self.final: set[str] = set()
        self.written = False

    def add(self, batch: Batch) -> None:
        append_batch(self.out / RAW_FILE, batch)
        self.seen.add(batch.worker)
        if batch.final:
            self.final.add(batch.worker)

    def on_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        try:
            self.add(Batch.from_json(msg.data))
        except ValueError as e:
            log.error("inferlab: a worker sent what is not a batch of records (%s)", e)

    def finish(self) -> None:
        """Ask every worker for its last batch, wait for them, write the run directory."""
        if self.written:
            return
        runner = self.environment.runner
        if _sender is not None:
            _sender.flush(final=True)
        expected = set(self.seen)
        if isinstance(runner, MasterRunner):
            for client in runner.clients.all:
                expected.add(client.id)
                runner.send_message(STOP_MESSAGE, None, client.id)
        deadline = gevent.Timeout(self.environment.stop_timeout + FINAL_WAIT_S)
        deadline.start()
        try:  # (not for a worker Locust has found missing: killed, or its machine gone)
            while expected - self.final - _missing(runner):
                gevent.sleep(0.05)
        except gevent.Timeout:
            pass
        finally:
            deadline.cancel()
        if expected - self.final:
            log.error("inferlab: no last batch from %s; writing the run without it", sorted(expected - self.final))
        _note_in_config(self.out, "workers", sorted(expected))  # (one that sent no batch too)
        self.written = True
        try:
            summary, merged = finish_run(self.out)
        except InferlabError as e:
            log.error("inferlab: %s", e)
            self.environment.process_exit_code = 1  # (no run written)
            return
        print(f"inferlab: {describe(merged)} -> {self.out} ({summary.counts.completed} completed)", file=sys.stderr)
        if merged.gone:  # (as bench's: a run the server walked out of failed)
            self.environment.process_exit_code = 1


def _missing(runner: Any) -> set[str]:
    """The workers a master has stopped hearing from (none for a local run)."""
    if not isinstance(runner, MasterRunner):
        return set()
    return {c.id for c in runner.clients.all if c.state == STATE_MISSING}


_sender: _Sender | None = None
_collector: _Collector | None = None


def _config_json(environment: Environment) -> dict[str, Any]:
    """config.json of the run, as far as the master knows it (the model, the workers
    and their counts are added at the end)."""
    import dataclasses

    o = _opts(environment)
    users = getattr(o, "num_users", None)
    return {
        "load": {
            "executor": "locust",
            "schedule": {"kind": "ClosedLoop", "concurrency": users},
            "locust": {"users": users, "spawn_rate": getattr(o, "spawn_rate", None), "run_time_s": getattr(o, "run_time", None)},
            "seed": o.inferlab_seed,
            "warmup": 0,
        },
        "workload": dataclasses.asdict(_workload_config(o)),
        "url": environment.host,
        "model": o.inferlab_model or None,
        "api": o.inferlab_api,
        "stream": True,
        "timeout_s": o.inferlab_timeout,
        "idle_timeout_s": o.inferlab_idle_timeout,
        "preflight": False,
        "resolved": {"prompt_salt": o.inferlab_prompt_salt},
    }


def _fail(message: str) -> None:
    print(f"inferlab: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _on_init(environment: Environment, **_: Any) -> None:
    global _collector
    runner = environment.runner
    o = _opts(environment)
    if o is None or runner is None:
        return
    # gevent's loop keeps the time of its last turn; importing inferlab blocked it for a
    # while, and Locust's -t timer, set from that stale time, would end the run early
    gevent.get_hub().loop.update_now()
    if isinstance(runner, WorkerRunner):
        runner.register_message(STOP_MESSAGE, _on_stop_message, concurrent=True)
        # (after the runner's own, so before it: Locust fires quitting's listeners last
        # first, and the runner's tells the master that this worker quit)
        environment.events.quitting.add_listener(_on_worker_quitting)  # type: ignore[no-untyped-call]
        return
    if not o.inferlab_out:
        _fail("--inferlab-out is required: the run directory to write")
    if not o.inferlab_prompt_salt:  # fresh prompts each run; the workers get it with their orders
        o.inferlab_prompt_salt = secrets.token_hex(4)
    try:
        _workload(o, 0)  # (bad workload flags fail here, before any worker starts)
    except InferlabError as e:  # (its message names bench's flags: ours have a prefix)
        _fail(re.sub(r"--(?!inferlab-)([a-z][a-z-]*)", r"--inferlab-\1", str(e)))
    try:
        if environment.host:
            _endpoint(environment, "")
        out = Path(o.inferlab_out)
        check_out_dir(out, o.inferlab_overwrite, setting="--inferlab-out",
                      remedy="give another folder, or --inferlab-overwrite")
        out.mkdir(parents=True, exist_ok=True)
        if (out / RAW_FILE).exists() and not o.inferlab_overwrite:
            raise UsageError(f"--inferlab-out {out}: holds a Locust run already (add --inferlab-overwrite)")
        (out / RAW_FILE).write_text("")
        (out / CONFIG_FILE).write_text(json.dumps(_config_json(environment), indent=2) + "\n")
    except InferlabError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"--inferlab-out: {e}")
    _collector = _Collector(environment, out)
    # (here, after the runner's own: Locust fires quitting's listeners last first, and the
    # master's stops the test, which writes the run)
    environment.events.quitting.add_listener(_on_quitting)  # type: ignore[no-untyped-call]
    if isinstance(runner, MasterRunner):
        runner.register_message(RECORDS_MESSAGE, _collector.on_message)


def _on_test_start(environment: Environment, **_: Any) -> None:
    global _sender
    if isinstance(environment.runner, MasterRunner) or _sender is not None:
        return
    try:
        _sender = _Sender(environment)
    except InferlabError as e:
        log.error("inferlab: %s", e)
        environment.process_exit_code = 1  # (Locust's own would be 0: no request failed, none was sent)
        if environment.runner is not None:
            environment.runner.quit()


def _on_test_stop(environment: Environment, **_: Any) -> None:
    if _sender is not None:
        _sender.flush(final=True)
    if _collector is not None:
        _collector.finish()


def _on_quitting(environment: Environment, **_: Any) -> None:
    """Locust is shutting down before the run was written: the master (or a local run)
    was stopped (Ctrl-C, SIGTERM) before its -t ended. Said in locust-config.json, so
    the summary (``locust-merge``'s too) says the run was interrupted."""
    o = _opts(environment)
    if _collector is None or _collector.written or o is None or not getattr(o, "run_time", None):
        return
    _note_in_config(_collector.out, "stopped_early", f"the test was stopped before its -t of {o.run_time} s ended")


def _on_worker_quitting(environment: Environment, **_: Any) -> None:
    """A worker is shutting down while its test runs (Ctrl-C, SIGTERM on it; the
    master's quit comes after its stop and the last batch): stop its users and send the
    last batch, saying so, before Locust tells the master it quit (the master, its last
    worker gone, then stops the test and writes the run: marked interrupted)."""
    if _sender is None or _sender.finished:
        return
    _sender.stopped_early = True
    if environment.runner is not None:
        environment.runner.stop()  # (its users' requests in flight recorded as cancelled; test_stop sends the batch)
    _sender.flush(final=True)


def _note_in_config(out: Path, key: str, value: object) -> None:
    """Set ``key`` of load.locust in ``out``'s locust-config.json (what ``finish_run``
    reads, ``locust-merge``'s too)."""
    path = out / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
        config["load"]["locust"][key] = value
        path.write_text(json.dumps(config, indent=2) + "\n")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.error("inferlab: cannot write %s's %s: %s", path, key, e)


def _on_stop_message(environment: Environment, msg: Any, **_: Any) -> None:
    """The master is finishing: stop the users (they finish their requests within
    Locust's --stop-timeout) and send the last batch."""
    if environment.runner is not None:
        environment.runner.stop()
    if _sender is not None:
        _sender.flush(final=True)


# (Locust's add_listener is untyped)
events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]
events.init.add_listener(_on_init)  # type: ignore[no-untyped-call]
events.test_start.add_listener(_on_test_start)  # type: ignore[no-untyped-call]
events.test_stop.add_listener(_on_test_stop)  # type: ignore[no-untyped-call]


class LLMUser(User):
    """A closed-loop user: sends the worker's next request as soon as its last one ended
    (add ``wait_time`` in a subclass for think time). ``on_record`` sees each record as
    its request ends."""

    def on_start(self) -> None:
        if _sender is None:
            raise StopUser()
        self.sender = _sender
        self.client = GeventClient(_sender.endpoint, _sender.now_ns)
        # the connection opened before the first request (as bench warms its pool): its
        # set-up is no request's queue delay (a failure to connect is the first record's)
        with contextlib.suppress(Exception):
            self.client.connection.socket()

    def on_stop(self) -> None:
        self.client.close()

    @task
    def send(self) -> None:
        sender = self.sender
        if sender.gone is not None:  # (its runner is stopping: no more sends)
            raise StopUser()
        try:
            spec = next(sender.workload)
        except StopIteration:  # a dataset ran out
            raise StopUser() from None
        record = RequestRecord(index=sender.next_index)
        sender.next_index += 1
        record.session, record.turn = spec.session, spec.turn
        record.requested_input_tokens = spec.input_tokens
        record.requested_output_tokens = spec.max_tokens
        record.intended_send_ns = sender.now_ns()
        body = json.dumps(request_body(sender.endpoint, spec)).encode()  # (serialised once)
        sender.started()
        try:
            self.client.send(body, record)
        finally:  # (also when Locust stops the user mid-request: the record says cancelled)
            sender.add(record)
            self.on_record(record)
            self._report(record)

    def on_record(self, record: RequestRecord) -> None:
        """Called with each request's record as it ends (a hook for subclasses)."""

    def _report(self, record: RequestRecord) -> None:
        """Locust's own statistics: the request's E2E time and output characters (not for
        a request cut short by Locust stopping the user: it is neither)."""
        if record.error_kind is ErrorKind.CANCELLED:
            return
        start = record.send_ns if record.send_ns is not None else record.intended_send_ns or 0
        end = record.end_ns if record.end_ns is not None else self.sender.now_ns()
        failed = record.error_kind is not None
        self.environment.events.request.fire(
            request_type="POST", name=self.sender.endpoint.api, response_time=(end - start) / 1e6,
            response_length=record.output_chars, exception=Exception(record.error) if failed else None,
            context={}, url=self.sender.endpoint.url,
        )
