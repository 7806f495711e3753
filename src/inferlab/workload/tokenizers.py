"""Tokenizers behind one small Protocol: the simulator's built-in one, or a local
``tokenizer.json`` through the optional ``tokenizers`` package: a path, or a Hugging Face
model id found in the local hub cache (no hub downloads).

A chat template is ChatML (as Qwen uses it) for both: a bare ``tokenizer.json`` carries
no template, and rendering Jinja templates would need another dependency.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from inferlab._errors import UsageError
from inferlab.workload.text import PASSAGE


class Tokenizer(Protocol):
    """What the client and the simulator need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, object]]) -> list[int]: ...

    def output_token(self, index: int) -> int: ...

    def output_piece(self, index: int) -> str: ...


def chatml(messages: Sequence[Mapping[str, object]]) -> str:
    """ChatML text with the assistant generation prompt appended."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content or ''}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json``. Encoding adds no
    special tokens (the server adds BOS itself where the model needs one)."""

    def __init__(self, tok: Any, path: str) -> None:
        self._tok = tok
        self.path = path
        self._passage: list[int] = self.encode(PASSAGE) or [0]

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def apply_chat_template(self, messages: Sequence[Mapping[str, object]]) -> list[int]:
        return self.encode(chatml(messages))

    def output_token(self, index: int) -> int:
        return self._passage[index % len(self._passage)]

    def output_piece(self, index: int) -> str:
        return self.decode([self.output_token(index)])


def hf_hub_cache() -> str:
    """The local Hugging Face hub cache, as ``huggingface_hub`` finds it:
    ``HF_HUB_CACHE`` (or the older ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME``/hub, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def cached_tokenizer_file(model_id: str) -> str | None:
    """The ``tokenizer.json`` of Hugging Face model ``model_id`` (``ORG/NAME``) in the
    local hub cache (``hf_hub_cache``), or ``None``: the snapshot ``refs/main`` names
    when it has one, else the newest snapshot that has the file. Reads the disk only."""
    repo = os.path.join(hf_hub_cache(), "models--" + model_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            main = f.read().strip()
    except OSError:
        main = ""
    try:
        names = os.listdir(snapshots)
    except OSError:
        return None
    files = [os.path.join(snapshots, n, "tokenizer.json") for n in names]
    found = [f for f in files if os.path.isfile(f)]
    if not found:
        return None
    preferred = os.path.join(snapshots, main, "tokenizer.json")
    # (the newest by modification time, the name breaking ties: the same answer each time)
    return preferred if preferred in found else max(found, key=lambda f: (os.path.getmtime(f), f))


def _looks_like_model_id(text: str) -> bool:
    """``ORG/NAME`` or ``NAME`` as the hub writes model ids, nothing that reads as a
    path (``./x``, ``~/x``, ``a/b/c``, ``x.json``)."""
    parts = text.split("/")
    return len(parts) <= 2 and all(parts) and not text.startswith((".", "~")) and not text.endswith(".json")


def resolve_tokenizer_file(path: str) -> str:
    """The ``tokenizer.json`` that ``path`` means: the file itself, the one in a
    directory, or a Hugging Face model id's in the local hub cache (offline: inferlab
    never downloads). ``UsageError`` saying where it looked when there is none."""
    if os.path.isdir(path):
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise UsageError(f"{path}: no tokenizer.json there")
        return file
    if os.path.isfile(path):
        return path
    if _looks_like_model_id(path):
        cached = cached_tokenizer_file(path)
        if cached is not None:
            return cached
        where = os.path.join(hf_hub_cache(), "models--" + path.replace("/", "--"))
        raise UsageError(
            f"{path}: not a file, and not in the local Hugging Face cache ({where} has no "
            f"tokenizer.json); inferlab does not download: `huggingface-cli download {path} "
            "tokenizer.json` fetches it, or give a tokenizer.json path"
        )
    raise UsageError(f"{path}: no such file (give a tokenizer.json, a directory with one, or a Hugging Face model id)")


def load_tokenizer(path: str) -> HFTokenizer:
    """A ``tokenizer.json`` file, a directory holding one, or a Hugging Face model id
    whose tokenizer is in the local hub cache (``resolve_tokenizer_file``). ``UsageError``
    if there is none, the ``tokenizers`` extra is missing or the file cannot be read."""
    file = resolve_tokenizer_file(path)
    try:
        from tokenizers import Tokenizer as _Tok
    except ImportError:
        raise UsageError("--tokenizer needs the 'tokenizers' package: pip install 'inferlab[tokenizers]'") from None
    try:
        tok = _Tok.from_file(file)
    except Exception as e:  # the library raises plain Exception subclasses for bad files
        raise UsageError(f"{file}: not a tokenizer.json ({str(e).splitlines()[0][:200]})") from e
    return HFTokenizer(tok, file)
