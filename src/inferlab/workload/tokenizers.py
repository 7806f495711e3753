"""Tokenizers behind one small Protocol: the simulator's built-in one, or a local
``tokenizer.json`` through the optional ``tokenizers`` package (no hub downloads).

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


def load_tokenizer(path: str) -> HFTokenizer:
    """A ``tokenizer.json`` file, or a directory holding one. ``UsageError`` if the
    ``tokenizers`` extra is missing or the file cannot be read."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise UsageError(f"{path}: no tokenizer.json there")
    try:
        from tokenizers import Tokenizer as _Tok
    except ImportError:
        raise UsageError("--tokenizer needs the 'tokenizers' package: pip install 'inferlab[tokenizers]'") from None
    try:
        tok = _Tok.from_file(file)
    except Exception as e:  # the library raises plain Exception subclasses for bad files
        raise UsageError(f"{file}: not a tokenizer.json ({str(e).splitlines()[0][:200]})") from e
    return HFTokenizer(tok, file)
