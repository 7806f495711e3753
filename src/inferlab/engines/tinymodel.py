"""A tiny Llama-architecture model, generated offline, for real engines to serve.

No model can be downloaded here, and serving behaviour (batching, prefill cost growing
with the prompt, the prompt cache, the context limit) depends on the architecture and
size, not on what the weights say. So the weights are random (numpy, fixed seed) and the
tokenizer is a byte-level BPE trained (``tokenizers``) on text every machine has: the
Python standard library's own sources. ChatML specials and a ChatML chat template make
the chat API work as it does for Qwen-style models.

Every generated token is printable text: the logits of end-of-generation, special and
non-printable tokens (control characters, newlines, partial UTF-8) are pushed far down,
so every request generates exactly ``max_tokens`` tokens, one content chunk each, and
tests can assert exact counts. How: hidden dimension 0 of the residual stream is held
at a constant (every token's embedding has it; no layer writes to it), so after the
final RMSNorm it is a large positive number, and the LM head's column 0 is a large
negative weight for the banned tokens only.

``tiny_model()`` returns a cached directory with ``model.gguf`` (F16, what llama.cpp
serves) and ``tokenizer.json`` (the same tokenizer, for ``--tokenizer``); it is made once
per machine and configuration (``python -m inferlab.engines.tinymodel`` prints the path).
Needs the ``engines`` extra (``gguf``, ``numpy``, ``tokenizers``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferlab.engines.cache import cache_dir, made_once

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Bumped whenever what ``generate`` writes changes, so cached models are remade.
GENERATOR_VERSION = 1
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: ChatML, rendering exactly what ``inferlab.workload.tokenizers.chatml`` renders.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
#: How much standard-library source the tokenizer is trained on (bytes, whole files).
TRAINING_BYTES = 4_000_000
#: The constant held in the residual stream's dimension 0, and the LM-head weight that
#: turns it into a banned token's logit penalty (about -BAN_WEIGHT * sqrt(hidden / 2)).
_RESIDUAL_CONSTANT = 1.0
_BAN_WEIGHT = 30.0
_INIT_STD = 0.02


@dataclass(frozen=True)
class TinyLlamaConfig:
    """The model's shape. The default (4 layers, hidden 256, 8k vocabulary: about 7.5 M
    parameters, 15 MB as F16) prefills about a thousand tokens a second on one core:
    long prompts cost visibly more than short ones, and a test suite stays fast."""

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    vocab_size: int = 8192
    context_tokens: int = 8192  # the model's trained context (llama.context_length)
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must divide into heads, and heads into kv_heads groups")
        if self.vocab_size < 512:
            raise ValueError("vocab_size must be at least 512 (256 bytes, specials, merges)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class TinyModel:
    """A generated model on disk: ``gguf`` (llama.cpp) and ``tokenizer`` (a
    ``tokenizer.json`` equal to the GGUF's vocabulary); ``name`` the cache entry's name,
    ``printable_tokens`` how many tokens generation can pick from."""

    path: Path
    name: str
    printable_tokens: int

    @property
    def gguf(self) -> Path:
        return self.path / "model.gguf"

    @property
    def tokenizer(self) -> Path:
        return self.path / "tokenizer.json"


def tiny_model(config: TinyLlamaConfig | None = None) -> TinyModel:
    """The model for ``config`` (default ``TinyLlamaConfig()``), generated on first use
    and cached (a few seconds); later calls return at once. The cache key covers the
    configuration, ``GENERATOR_VERSION``, the ``tokenizers`` version and the training
    text, so the same machine always serves the same bytes. ``ImportError`` without the
    ``engines`` extra."""
    config = config or TinyLlamaConfig()
    files = training_files()
    path = cache_dir() / "models" / f"tiny-llama-{_key(config, files)}"
    made_once(path, lambda out: generate(config, out, files))
    info = json.loads((path / "inferlab-model.json").read_text())
    return TinyModel(path, path.name, int(info["printable_tokens"]))


def training_files() -> list[Path]:
    """The standard library's top-level modules, in name order, up to
    ``TRAINING_BYTES``: text present on every machine with this Python."""
    out: list[Path] = []
    total = 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if total >= TRAINING_BYTES:
            break
        out.append(f)
        total += f.stat().st_size
    return out


def _key(config: TinyLlamaConfig, files: list[Path]) -> str:
    import tokenizers

    h = hashlib.sha256()
    h.update(json.dumps([GENERATOR_VERSION, dataclasses.asdict(config), tokenizers.__version__]).encode())
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _texts(files: list[Path]) -> Iterator[str]:
    for f in files:
        yield f.read_text(encoding="utf-8", errors="replace")


def generate(config: TinyLlamaConfig, out: Path, files: list[Path] | None = None) -> None:
    """Write the model for ``config`` into the new directory ``out``: ``model.gguf``,
    ``tokenizer.json`` and ``inferlab-model.json`` (the configuration and the printable
    token count). Deterministic: the same configuration and training files give the
    same bytes."""
    import numpy as np

    out.mkdir(parents=True)
    tok = train_tokenizer(config.vocab_size, files if files is not None else training_files())
    tok.save(str(out / "tokenizer.json"))
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError("the trained vocabulary's ids are not 0..n-1")
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    allowed = np.array([t not in SPECIALS and _printable(t) for t in tokens])
    weights = _weights(config, len(tokens), allowed)
    _write_gguf(out / "model.gguf", config, tokens, merges, weights)
    info = {"config": dataclasses.asdict(config), "printable_tokens": int(allowed.sum()),
            "vocab_size": len(tokens), "generator_version": GENERATOR_VERSION}
    (out / "inferlab-model.json").write_text(json.dumps(info, indent=1) + "\n")


def train_tokenizer(vocab_size: int, files: list[Path]) -> Any:
    """A byte-level BPE (GPT-2 pre-tokenization, no prefix space, no BOS added) with
    ``SPECIALS`` as ids 0, 1, 2, trained on ``files``; a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(files), trainer)
    return tok


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte (what ``tokenizers`` uses too)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTES = _byte_decoder()


def _printable(token: str) -> bool:
    """Whether a byte-level token decodes, alone, to non-empty printable UTF-8 text."""
    try:
        text = bytes(_BYTES[c] for c in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return False
    return bool(text) and text.isprintable()


def _weights(config: TinyLlamaConfig, vocab: int, allowed: npt.NDArray[np.bool_]) -> dict[str, npt.NDArray[Any]]:
    """Random weights in HF layout (``[out, in]``), F16 matrices and F32 norms, named as
    llama.cpp names them. Dimension 0 of the residual stream is the constant channel."""
    import numpy as np

    rng = np.random.default_rng(config.seed)
    h, hd = config.hidden, config.head_dim

    def mat(rows: int, cols: int) -> npt.NDArray[np.float32]:
        return rng.normal(0.0, _INIT_STD, size=(rows, cols)).astype(np.float32)

    def no_write(w: npt.NDArray[np.float32]) -> npt.NDArray[np.float16]:
        w[0, :] = 0.0  # this layer adds nothing to the constant channel
        return w.astype(np.float16)

    embd = mat(vocab, h)
    embd[:, 0] = _RESIDUAL_CONSTANT
    out: dict[str, npt.NDArray[Any]] = {"token_embd.weight": embd.astype(np.float16)}
    ones = np.ones(h, dtype=np.float32)
    for i in range(config.layers):
        b = f"blk.{i}."
        out[b + "attn_norm.weight"] = ones.copy()
        out[b + "attn_q.weight"] = mat(config.heads * hd, h).astype(np.float16)
        out[b + "attn_k.weight"] = mat(config.kv_heads * hd, h).astype(np.float16)
        out[b + "attn_v.weight"] = mat(config.kv_heads * hd, h).astype(np.float16)
        out[b + "attn_output.weight"] = no_write(mat(h, config.heads * hd))
        out[b + "ffn_norm.weight"] = ones.copy()
        out[b + "ffn_gate.weight"] = mat(config.ffn, h).astype(np.float16)
        out[b + "ffn_up.weight"] = mat(config.ffn, h).astype(np.float16)
        out[b + "ffn_down.weight"] = no_write(mat(h, config.ffn))
    out["output_norm.weight"] = ones.copy()
    head = mat(vocab, h)
    head[:, 0] = np.where(allowed, 0.0, -_BAN_WEIGHT)
    out["output.weight"] = head.astype(np.float16)
    return out


def _write_gguf(
    path: Path, config: TinyLlamaConfig, tokens: list[str], merges: list[str], weights: dict[str, npt.NDArray[Any]]
) -> None:
    import gguf

    special = {t: tokens.index(t) for t in SPECIALS}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("inferlab tiny llama")
    w.add_context_length(config.context_tokens)
    w.add_embedding_length(config.hidden)
    w.add_block_count(config.layers)
    w.add_feed_forward_length(config.ffn)
    w.add_head_count(config.heads)
    w.add_head_count_kv(config.kv_heads)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_eps)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # GPT-2's split regex: what the ByteLevel pre-tokenizer uses
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(special["<|endoftext|>"])
    w.add_eos_token_id(special["<|im_end|>"])
    w.add_pad_token_id(special["<|endoftext|>"])
    w.add_add_bos_token(False)  # as the tokenizer.json: prompts get no BOS
    w.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in weights.items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m inferlab.engines.tinymodel``: print the default model's directory."""
    import argparse

    p = argparse.ArgumentParser(description="Generate (once) and print the tiny Llama model's cache directory.")
    p.parse_args(argv)
    print(tiny_model().path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
