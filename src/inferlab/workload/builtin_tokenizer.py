"""The simulator's built-in tokenizer: deterministic, reversible, no files needed.

Vocabulary: three ChatML special tokens, the 256 byte values, then each built-in word
in four forms (``" word"``, ``"word"``, ``" Word"``, ``"Word"``). Text is split into a
space plus letters, or single characters; a piece in the vocabulary is one token,
anything else falls back to its UTF-8 bytes. Every text round-trips exactly, and a
synthetic prompt made of built-in words costs exactly one token per word.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from inferlab.workload.text import PASSAGE, WORDS
from inferlab.workload.tokenizers import chatml

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_BYTE_BASE = len(SPECIAL_TOKENS)
_WORD_BASE = _BYTE_BASE + 256
_PIECE = re.compile(r" ?[A-Za-z]+|.", re.DOTALL)
_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


class BuiltinTokenizer:
    """Word-level tokenizer with byte fallback. ``encode``/``decode`` are exact inverses."""

    def __init__(self) -> None:
        pieces: list[str] = []
        for w in WORDS:
            cap = w[0].upper() + w[1:]
            pieces += [" " + w, w, " " + cap, cap]
        self._pieces = pieces
        self._ids = {p: _WORD_BASE + i for i, p in enumerate(pieces)}
        self._special_ids = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
        self._after_space_ids = {p[1:]: i for p, i in self._ids.items() if p.startswith(" ")}
        self._passage = self.encode(PASSAGE)

    @property
    def vocab_size(self) -> int:
        return _WORD_BASE + len(self._pieces)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        # Fast path: plain words separated by single spaces, every one in the vocabulary
        # (synthetic prompts). Anything else raises KeyError and takes the general path,
        # which gives the same ids for such text.
        words = text.split(" ")
        try:
            return [self._ids[words[0]], *map(self._after_space_ids.__getitem__, itertools.islice(words, 1, None))]
        except KeyError:
            pass
        ids_out: list[int] = []
        parts = _SPECIAL.split(text) if allow_special else [text]
        for part in parts:
            special = self._special_ids.get(part) if allow_special else None
            if special is not None:
                ids_out.append(special)
                continue
            for piece in _PIECE.findall(part):
                tid = self._ids.get(piece)
                if tid is not None:
                    ids_out.append(tid)
                else:
                    ids_out.extend(_BYTE_BASE + b for b in piece.encode("utf-8"))
        return ids_out

    def decode(self, ids: Iterable[int]) -> str:
        out: list[str] = []
        pending = bytearray()
        for tid in ids:
            if tid < 0:
                raise ValueError(f"token id {tid} is negative")
            if _BYTE_BASE <= tid < _WORD_BASE:
                pending.append(tid - _BYTE_BASE)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if tid < _BYTE_BASE:
                out.append(SPECIAL_TOKENS[tid])
            elif tid < self.vocab_size:
                out.append(self._pieces[tid - _WORD_BASE])
            else:
                raise ValueError(f"token id {tid} is out of range (vocab size {self.vocab_size})")
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    @property
    def template_source(self) -> str:
        return "ChatML (the built-in tokenizer's)"

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
    ) -> list[int]:
        """ChatML, as Qwen2.5 uses it, with the assistant generation prompt appended
        unless told not to."""
        return self.encode(chatml(messages, add_generation_prompt))

    def output_token(self, index: int) -> int:
        """The ``index``-th generated token: the built-in passage, cycled."""
        return self._passage[index % len(self._passage)]

    def output_piece(self, index: int) -> str:
        return self.decode([self.output_token(index)])

