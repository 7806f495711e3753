"""llama.cpp's ``llama-server``: built from source once per machine, then started at will.

``build_llama_server()`` builds it from the ``llama-cpp-python`` sdist on PyPI (which
vendors the whole llama.cpp tree, server included), with CMake and Ninja, and caches the
binary as ``<cache>/llama-server-<version>`` (see ``engines.cache``): ≈7–11 min on two
cores the first time, then it returns at once. ``LlamaServer`` starts it on a free
loopback port and stops it (its whole process group) on exit, whatever happened.

    python -m inferlab.engines.llamacpp          # build (or find) it; print its path

Needs a C and C++ compiler; CMake and Ninja are installed with pip when missing. Nothing
is downloaded at build time but the sdist: the options below turn off the web UI's
prebuilt download, tests, examples and HTTPS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from inferlab._cores import usable_cores
from inferlab._errors import InferlabError
from inferlab.engines.cache import cache_dir, made_once

#: The ``llama-cpp-python`` release whose vendored llama.cpp is built.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: Only the server, statically linked, with nothing fetched at build time.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # (ON downloads the web UI at build time)
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


class EngineUnavailable(InferlabError):
    """The engine cannot be built on this machine (no compiler, no package registry).
    A failed compile is ``BuildFailed`` instead."""


class BuildFailed(InferlabError):
    """A build step failed; the message names the step and the log file."""


def server_path(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where the cached binary for ``version`` is (or will be)."""
    return cache_dir() / f"llama-server-{version}"


def build_llama_server(version: str = LLAMA_CPP_PYTHON_VERSION, *, log: IO[str] | None = None) -> Path:
    """The ``llama-server`` binary of ``llama-cpp-python==version``: the cached one, or
    built now (its progress on ``log``; the build's own output goes to
    ``<cache>/llama-server-<version>.build.log``). Concurrent callers wait for one build.
    ``EngineUnavailable`` without a compiler or the sdist; ``BuildFailed`` if CMake fails."""
    path = server_path(version)
    if path.exists():
        return path

    def make(out: Path) -> None:
        _build(version, out, path.with_name(path.name + ".build.log"), log)

    return made_once(path, make)


def _say(log: IO[str] | None, message: str) -> None:
    if log is not None:
        print(f"[llama-server] {message}", file=log, flush=True)


def _tools(log: IO[str] | None) -> dict[str, str]:
    """Paths of cmake, ninja and the compilers; pip installs cmake/ninja if missing."""
    cc, cxx = shutil.which("cc") or shutil.which("gcc"), shutil.which("c++") or shutil.which("g++")
    if cc is None or cxx is None:
        raise EngineUnavailable("no C/C++ compiler (cc, c++) on PATH: cannot build llama-server")
    scripts = sysconfig.get_path("scripts")

    def find(name: str) -> str | None:
        return shutil.which(name) or shutil.which(name, path=scripts)

    if find("cmake") is None or find("ninja") is None:
        _say(log, "cmake/ninja missing: pip install cmake ninja")
        _run([sys.executable, "-m", "pip", "install", "-q", "cmake", "ninja"], "pip install cmake ninja", None,
             unavailable=True)
    cmake, ninja = find("cmake"), find("ninja")
    if cmake is None or ninja is None:
        raise EngineUnavailable("cmake and ninja are not on PATH, and pip did not provide them")
    return {"cmake": cmake, "ninja": ninja, "cc": cc, "cxx": cxx}


def _run(cmd: Sequence[str], step: str, logfile: Path | None, *, cwd: Path | None = None,
         unavailable: bool = False) -> None:
    """Run one build step; its output goes to ``logfile`` (appended) or is kept for the
    error. ``unavailable``: a failure means the machine cannot build (no registry)."""
    with open(logfile, "a") if logfile else open(os.devnull, "w") as sink:
        proc = subprocess.run(
            list(cmd), cwd=cwd, stdout=sink if logfile else subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, check=False,
        )
    if proc.returncode == 0:
        return
    tail = (proc.stdout or "").strip().splitlines()[-5:] if not logfile else []
    where = f"; see {logfile}" if logfile else (": " + " / ".join(tail) if tail else "")
    error = EngineUnavailable if unavailable else BuildFailed
    raise error(f"{step} failed (exit {proc.returncode}){where}")


def _build(version: str, out: Path, logfile: Path, log: IO[str] | None) -> None:
    tools = _tools(log)
    work = out.parent
    logfile.write_text("")
    _say(log, f"downloading the llama-cpp-python {version} sdist")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={version}", "-d", str(work / "sdist")], "pip download", logfile, unavailable=True)
    (sdist,) = (work / "sdist").glob("llama_cpp_python-*.tar.gz")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(work / "src", members=members, filter="data")
    source, build = work / "src" / prefix, work / "build"
    env_cmake = [tools["cmake"], "-S", str(source), "-B", str(build), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}", f"-DCMAKE_C_COMPILER={tools['cc']}",
                 f"-DCMAKE_CXX_COMPILER={tools['cxx']}", *CMAKE_OPTIONS]
    _say(log, f"configuring (log: {logfile})")
    _run(env_cmake, "cmake configure", logfile)
    jobs = usable_cores()
    _say(log, f"compiling llama-server with {jobs} jobs (several minutes on two cores)")
    started = time.monotonic()
    _run([tools["cmake"], "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
         "cmake build", logfile)
    binary = build / "bin" / "llama-server"
    _run([str(binary), "--version"], "llama-server --version", logfile)
    shutil.copy2(binary, out)
    _say(log, f"built in {time.monotonic() - started:.0f} s")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """(In the child, before exec.) Have the kernel SIGTERM the server when the process
    that started it dies, also when that process is killed and no ``finally`` runs."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class LlamaServer:
    """``llama-server`` serving ``model`` on ``127.0.0.1`` at a free port, while the
    ``with`` block runs. ``ctx_tokens`` is the KV budget shared by ``slots`` parallel
    sequences (each slot holds ``ctx_tokens // slots``); ``threads`` compute threads
    (1 leaves a core to a load generator on a two-core machine). The process runs in its
    own process group, which is stopped on exit (SIGTERM, then SIGKILL); on Linux it is
    also stopped if the starting process dies without exiting the block. Entering raises
    ``InferlabError`` with the log's tail if the server is not healthy within
    ``ready_timeout_s``."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        alias: str = "tiny-llama",
        ctx_tokens: int = 16384,
        slots: int = 8,
        threads: int = 1,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        ready_timeout_s: float = _READY_TIMEOUT_S,
    ) -> None:
        self.binary = binary
        self.model = model
        self.alias = alias
        self.ctx_tokens = ctx_tokens
        self.slots = slots
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The server root, ``http://127.0.0.1:PORT`` (the OpenAI API is under ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        return [
            str(self.binary), "-m", str(self.model), "-a", self.alias, "--host", "127.0.0.1",
            "--port", str(self.port), "-c", str(self.ctx_tokens), "-np", str(self.slots),
            "-t", str(self.threads), "--metrics", "--no-webui", *self.extra_args,
        ]

    def __enter__(self) -> Self:
        self.port = free_port()
        self._log = open(self.log_path, "wb") if self.log_path else None
        try:
            self._proc = subprocess.Popen(
                self.args(), stdin=subprocess.DEVNULL, stdout=self._log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT, process_group=0,  # not a session: see launch.EngineProcess.start
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise InferlabError(f"llama-server exited with {self._proc.returncode}: {self._log_tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                if resp.status == 200:  # (503 while the model loads)
                    return
            time.sleep(0.1)
        raise InferlabError(f"llama-server not healthy after {self.ready_timeout_s:g} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return " / ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-5:])

    def stop(self) -> None:
        """Stop the server's process group (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def main(argv: list[str] | None = None) -> int:
    """``python -m inferlab.engines.llamacpp``: build (or find) the binary, print its path."""
    import argparse

    p = argparse.ArgumentParser(description="Build llama-server once per machine and print its path.")
    p.add_argument("--version", default=LLAMA_CPP_PYTHON_VERSION, help="llama-cpp-python release to build")
    args = p.parse_args(argv)
    try:
        print(build_llama_server(args.version, log=sys.stderr))
    except InferlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
