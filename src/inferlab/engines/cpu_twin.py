"""The pieces of a simulator twin of llama.cpp on this machine's CPU (``sim calibrate``
on runs against it; ``bench/llamacpp_twin.py``): the CPU as the simulator's device, the
tiny model's shape as the simulator's model, and the engine both make.

The CPU device has none of a GPU's fixed per-step costs (kernel launches, a sampler's
device sync, elementwise kernels' floor): ``CPU_BASE`` sets them to zero and streams the
weights at the measured rate (``weight_stream`` 1); llama-server's C++ HTTP threads have
none of vLLM V1's API-server CPU, which ``CPU_BASE`` sets to zero too. A fit is left with
``CPU_FIT``:
the compute rates (``gemm_compute`` for prompt rows, ``decode_compute`` for one-token
rows, which a batch does not share on one thread), attention (``attention_compute`` for
prefill, ``kv_stream`` for a decode's read of its cached context: on one CPU thread a
token at 1,536 tokens of context costs two to three times one at 64), the host's cost per
step and the fixed cost per request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inferlab._errors import RunFailedError
from inferlab.engines.tinymodel import TinyLlamaConfig
from inferlab.sim.engine.engine import EngineConfig

#: The CPU has no GPU's fixed per-step costs; its weight reads are measured. llama-server
#: answers HTTP in C++ threads beside its compute thread: none of vLLM V1's Python API
#: server's CPU (intake, tokenization, per-token and per-step streaming) is charged; its
#: fixed cost per request is fitted (``api_overhead_s``). Still vLLM V1's, not fitted:
#: the host cost per scheduled sequence (``per_seq_s``, 20 us; 0.16 ms a step at 8 users).
CPU_BASE = {
    "eager_launch_per_layer_s": 0.0, "sampler_s": 0.0, "elementwise_per_layer_s": 0.0, "weight_stream": 1.0,
    "api_intake_s": 0.0, "api_intake_per_token_s": 0.0, "api_stream_s": 0.0, "api_stream_per_step_s": 0.0,
}
#: The constants a twin of llama.cpp on a CPU fits (see the module docstring).
CPU_FIT = ("gemm_compute", "decode_compute", "attention_compute", "kv_stream", "cpu_step_eager_s", "api_overhead_s")


def weight_bytes(cfg: TinyLlamaConfig) -> int:
    """F16 bytes a decode step reads: every layer's matrices and the LM head."""
    hd = cfg.hidden // cfg.heads
    per_layer = cfg.hidden * (2 * cfg.heads * hd + 2 * cfg.kv_heads * hd) + 3 * cfg.hidden * cfg.ffn
    return 2 * (cfg.layers * per_layer + cfg.hidden * cfg.vocab_size)


# One thread's float32 GEMM rate and copy rate, measured in a fresh interpreter whose
# BLAS is held to one thread (a BLAS reads its thread count once, when numpy is first
# imported: setting it later in this process does nothing).
_MEASURE = """
import json, sys, time
import numpy as np
a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
b = a.copy()
a @ b  # warm
reps, t0 = 8, time.perf_counter()
for _ in range(reps):
    a @ b
flops = reps * 2 * 1024**3 / (time.perf_counter() - t0)
src = np.ones(int(sys.argv[1]) // 4, dtype=np.float32)
dst = np.empty_like(src)
np.copyto(dst, src)
reps, t0 = 200, time.perf_counter()
for _ in range(reps):
    np.copyto(dst, src)
print(json.dumps({"flops": flops, "bandwidth": reps * 2 * src.nbytes / (time.perf_counter() - t0)}))
"""
_ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def measure_device(path: Path, weight_bytes: int) -> dict[str, float]:
    """One thread's float32 GEMM rate and the rate it copies ``weight_bytes`` (read +
    write), as the one-thread server computes: measured in a subprocess with its BLAS
    held to one thread, whatever this process imported before; written to ``path`` as a
    GPU file."""
    env = {**os.environ, **dict.fromkeys(_ONE_THREAD, "1")}
    what = "measuring this CPU's GEMM and copy rates"
    try:
        out = subprocess.run([sys.executable, "-I", "-c", _MEASURE, str(weight_bytes)], env=env, capture_output=True,
                             text=True, timeout=300, check=True)
        rates = json.loads(out.stdout)
        flops, bandwidth = float(rates["flops"]), float(rates["bandwidth"])
    except subprocess.TimeoutExpired as e:
        raise RunFailedError(f"{what} took longer than {e.timeout:g} s") from e
    except subprocess.CalledProcessError as e:
        last = (e.stderr or "").strip().splitlines()
        raise RunFailedError(f"{what} failed (exit {e.returncode}): {last[-1] if last else 'no message'}") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RunFailedError(f"{what} failed: {e}") from e
    spec = {"name": "cpu-thread", "bf16_dense_tflops": flops / 1e12, "hbm_gb": 8, "hbm_bw_tbs": bandwidth / 1e12,
            "bus_bw_gbs": 10}
    path.write_text(json.dumps(spec, indent=2) + "\n")
    return {"gflops": flops / 1e9, "gb_s": bandwidth / 1e9}


def model_config(folder: Path, cfg: TinyLlamaConfig) -> Path:
    """The tiny model's shape as an HF ``config.json`` in ``folder`` (the simulator's
    model spec); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn,
        "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "num_hidden_layers": cfg.layers,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_tokens, "torch_dtype": "float16",
    }, indent=2) + "\n")
    return path


def twin_engine(folder: Path, cfg: TinyLlamaConfig, *, slots: int, slot_tokens: int) -> tuple[EngineConfig, dict[str, float]]:
    """The simulated engine for llama-server with ``slots`` slots of ``slot_tokens``
    (eager: no CUDA graphs on a CPU), and the device's rates as measured now: the
    device, the model's shape and ``CPU_BASE`` are written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rates = measure_device(folder / "device.json", weight_bytes(cfg))
    model = model_config(folder / "model", cfg)
    (folder / "cpu.json").write_text(json.dumps(CPU_BASE, indent=2) + "\n")
    engine = EngineConfig(
        model=str(model), gpu=str(folder / "device.json"), max_num_seqs=slots, max_model_len=slot_tokens,
        max_num_batched_tokens=2048, num_gpu_blocks_override=slots * slot_tokens // 16, enforce_eager=True,
        overlap_schedule=False,  # llama-server computes a batch, then schedules the next
        efficiencies_path=str(folder / "cpu.json"),
    )
    return engine, rates
