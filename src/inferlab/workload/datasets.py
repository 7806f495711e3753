"""Prompts from local dataset files, sampled with or without replacement.

Formats (named, or detected from the extension and first character):

- ``jsonl``: one object per line with ``prompt`` (a string) or ``messages`` (OpenAI
  chat messages, the last one from the user), optional ``max_tokens`` or
  ``output_tokens``;
- ``sharegpt``: a JSON list of ``{"conversations": [{"from": "human"|"gpt", "value":
  ...}]}``; the first human turn is the prompt and the gpt turn after it gives the
  output length (entries without such a pair are skipped, as other tools do);
- ``csv``: a ``prompt`` column, optional ``max_tokens`` or ``output_tokens``; read
  strictly (a quote left open, or a row with more or fewer fields than the header, is
  an error, not a prompt).

Input lengths (for ``min_input_tokens``/``max_input_tokens`` and ``empirical:PATH``)
are tokenizer counts with a tokenizer, else word counts; ShareGPT output lengths too.
A bad row raises ``UsageError`` naming the file, the line (the entry, for JSON) and the
problem.
"""

from __future__ import annotations

import csv
import io
import json
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from inferlab._errors import UsageError
from inferlab.workload.lengths import LengthDist
from inferlab.workload.spec import RequestSpec
from inferlab.workload.tokenizers import Tokenizer
from inferlab.workload.traces.rows import MAX_ROW_TOKENS

DatasetFormat = Literal["jsonl", "sharegpt", "csv"]
FORMATS: tuple[str, ...] = ("jsonl", "sharegpt", "csv")
Sampling = Literal["with-replacement", "without-replacement"]
SAMPLINGS: tuple[str, ...] = ("with-replacement", "without-replacement")
_ROLES = ("system", "user", "assistant", "developer", "tool")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


@dataclass(frozen=True)
class DatasetRow:
    """One prompt: ``messages`` as ``(role, content)``, the last from the user."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    where: str  # "path:line" or "path: entry N", for messages
    output_length: int | None = None  # ShareGPT: the answer's length (words or tokens)

    def spec(self, max_tokens: int | None, exact_output: bool) -> RequestSpec:
        msgs = list(self.messages)
        system = msgs.pop(0)[1] if msgs[0][0] == "system" and len(msgs) > 1 else None
        prompt = msgs.pop()[1]
        return RequestSpec(prompt, max_tokens, exact_output and max_tokens is not None,
                           system=system, context=tuple(msgs))

    def text(self) -> str:
        return "\n\n".join(c for _, c in self.messages)


def count(text: str, tokenizer: Tokenizer | None) -> int:
    return len(tokenizer.encode(text)) if tokenizer is not None else len(text.split())


@dataclass(frozen=True)
class DatasetConfig:
    """Which file and which of its rows: ``min``/``max_input_tokens`` filter by length."""

    path: str
    format: DatasetFormat | None = None
    sample: Sampling = "without-replacement"
    min_input_tokens: int | None = None
    max_input_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.sample not in SAMPLINGS:
            raise UsageError(f"--sample {self.sample!r}: expected {' or '.join(SAMPLINGS)}")
        lo, hi = self.min_input_tokens, self.max_input_tokens
        if (lo is not None and lo < 1) or (hi is not None and hi < 1):
            raise UsageError("--min-input-tokens/--max-input-tokens must be at least 1")
        if lo is not None and hi is not None and hi < lo:
            raise UsageError("--max-input-tokens is below --min-input-tokens")

    def rows(self, tokenizer: Tokenizer | None = None) -> list[DatasetRow]:
        """The kept rows; ``UsageError`` if none is left after the length filters, or if
        a filter is set without ``tokenizer`` to count tokens with (word counts are not
        token counts: a limit in tokens must be measured in tokens)."""
        return self.read(tokenizer)[0]

    def read(self, tokenizer: Tokenizer | None = None) -> tuple[list[DatasetRow], list[str]]:
        """``rows`` and what the summary says of the rows left out: skipped by the reader
        (also warned as read) or by the length filters, with their counts."""
        lo, hi = self.min_input_tokens, self.max_input_tokens
        if (lo is not None or hi is not None) and tokenizer is None:
            raise UsageError(
                "--min-input-tokens/--max-input-tokens count tokens: give --tokenizer (the server's tokenizer.json)"
            )
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            rows = read_dataset(self.path, self.format, tokenizer)
        for w in said:  # (still said as read)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        notes = [str(w.message) for w in said]
        if lo is not None or hi is not None:
            total = len(rows)
            rows = [r for r in rows if (lo or 0) <= count(r.text(), tokenizer) <= (hi or 1 << 62)]
            if not rows:
                raise UsageError(f"{self.path}: no prompt within the input length limits")
            if len(rows) < total:
                limits = f"{lo or 1:,}–{hi:,}" if hi is not None else f"{lo:,} or more"
                notes.append(f"{self.path}: {len(rows):,} of {total:,} prompts kept: the others are outside "
                             f"--min-input-tokens/--max-input-tokens ({limits} tokens)")
        return rows, notes


class DatasetWorkload:
    """Specs drawn from ``rows``: with replacement forever, or each row once in a seeded
    shuffle (then ``exhausted`` is set and the iterator ends). Output length: the given
    distribution, else the row's ``max_tokens``, else the server decides."""

    def __init__(self, rows: list[DatasetRow], sample: Sampling, output_tokens: LengthDist | None,
                 seed: int = 0, exact_output: bool = True, in_words: bool = False, notes: tuple[str, ...] = ()) -> None:
        self.rows = rows
        self.notes = notes  # (the rows left out, in words: ``DatasetConfig.read``)
        self.drawn: set[int] = set()  # the rows drawn so far, by position
        self.draws = 0
        self.in_words = in_words  # (ShareGPT answers' lengths counted in words: no tokenizer)
        self.sample = sample
        self.output_tokens = output_tokens
        self.exact_output = exact_output
        self.exhausted = False
        self._rng = random.Random(seed)
        self._it = self._draw()

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        row = next(self._it)
        out = (self.output_tokens.sample(self._rng) if self.output_tokens is not None
               else row.max_tokens or row.output_length)
        return row.spec(out, self.exact_output)

    def _draw(self) -> Iterator[DatasetRow]:
        if self.sample == "with-replacement":
            while True:
                k = self._rng.randrange(len(self.rows))  # (as choice draws)
                self.drawn.add(k)
                self.draws += 1
                yield self.rows[k]
        order = list(self.rows)
        self._rng.shuffle(order)
        yield from order
        self.exhausted = True

    def warnings(self) -> list[str]:
        out = list(self.notes)
        if self.sample == "with-replacement" and self.draws > len(self.drawn):
            out.append(f"{self.draws:,} requests drawn (with replacement) from {len(self.drawn):,} distinct prompts "
                       f"of the {len(self.rows):,} used: some prompts were sent more than once")
        if self.in_words and self.output_tokens is None and any(r.max_tokens is None and r.output_length for r in self.rows):
            out.append("output lengths are the dataset answers' word counts (no --tokenizer): approximate, fewer tokens "
                       "than the answers (words undercount tokens), each asked for exactly" if self.exact_output else
                       "output lengths are capped at the dataset answers' word counts (no --tokenizer): approximate, "
                       "fewer tokens than the answers (words undercount tokens)")
        if self.exhausted:
            out.append(f"the dataset ran out after its {len(self.rows)} prompts (sampled without "
                       "replacement): fewer requests were sent than asked")
        return out


def dataset_lengths(
    path: str, tokenizer: Tokenizer | None = None,
) -> tuple[list[int], list[int], tuple[tuple[int, int], ...]]:
    """Input lengths of every row, output lengths of the rows that give one, and the
    (input, output) pairs of those rows."""
    rows = read_dataset(path, None, tokenizer)
    ins = [max(1, count(r.text(), tokenizer)) for r in rows]
    outs = [r.output_length or r.max_tokens for r in rows]
    return ins, [o for o in outs if o], tuple((i, o) for i, o in zip(ins, outs, strict=True) if o)


# -- reading ------------------------------------------------------------------------


def detect_format(path: str, first_char: str) -> str:
    lower = path.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if first_char == "[":
        return "sharegpt"
    if first_char == "{":
        return "jsonl"
    raise UsageError(f"{path}: cannot tell the dataset format; give --dataset-format")


def read_dataset(path: str, fmt: str | None = None, tokenizer: Tokenizer | None = None) -> list[DatasetRow]:
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown dataset format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # (a spreadsheet's BOM is no text)
            text = f.read()
    except OSError as e:
        hint = ""
        if isinstance(e, FileNotFoundError) and path.strip().lower() in ("sharegpt", "random", "sonnet"):
            # (vllm bench serve's --dataset-name, given as a file)
            name = path.strip().lower()
            hint = ("; --dataset reads a file (ShareGPT's JSON among them); ShareGPT's lengths without the file: "
                    "--input-tokens empirical:sharegpt --output-tokens empirical:sharegpt" if name == "sharegpt"
                    else "; --dataset reads a file; random prompts of stated lengths are --input-tokens/--output-tokens"
                    if name == "random"
                    else "; --dataset reads a file; prompts that share a prefix are --prefix-tokens/--prefix-groups")
        raise UsageError(f"{path}: {e.strerror or e}{hint}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    kind = fmt or detect_format(path, text.lstrip()[:1])
    rows = _jsonl(path, text) if kind == "jsonl" else _sharegpt(path, text, tokenizer) if kind == "sharegpt" else _csv(path, text)
    if not rows:
        raise UsageError(f"{path}: the dataset has no prompts")
    return rows


def _jsonl(path: str, text: str) -> list[DatasetRow]:
    rows = []
    # lines end at \n only: str.splitlines also splits at U+2028, \x0c, ..., which JSON
    # strings may hold as they are
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UsageError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: expected a JSON object")
        if "prompt" in obj and "messages" in obj:  # (one would be ignored)
            raise UsageError(f"{where}: give 'prompt' or 'messages', not both")
        if "messages" in obj:
            msgs: tuple[tuple[str, str], ...] = _messages(where, obj["messages"])
        elif isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
            msgs = (("user", obj["prompt"]),)
        else:
            raise UsageError(f"{where}: needs 'prompt' (a non-empty string) or 'messages'")
        rows.append(DatasetRow(msgs, _max_tokens(where, obj), where))
    return rows


def _messages(where: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: 'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise UsageError(f"{where}: message {i} needs a role ({', '.join(_ROLES)}) and string content")
        out.append((str(m["role"]), str(m["content"])))
    if out[-1][0] != "user":
        raise UsageError(f"{where}: the last message must be from the user")
    if not out[-1][1].strip():  # (as an empty 'prompt' is refused)
        raise UsageError(f"{where}: the last user message is empty")
    return tuple(out)


def _max_tokens(where: str, obj: dict[str, Any]) -> int | None:
    for key in ("max_tokens", "output_tokens"):
        v = obj.get(key)
        if v is None or v == "":
            continue
        try:
            n = int(v) if not isinstance(v, bool) and float(v) == int(float(v)) else -1
        except (TypeError, ValueError, OverflowError):  # (OverflowError: inf, as JSON's Infinity or CSV's "inf")
            n = -1
        if n > MAX_ROW_TOKENS:
            raise UsageError(f"{where}: {key} must be at most {MAX_ROW_TOKENS:,} (no model takes more), got {v!r}")
        if n < 1:
            raise UsageError(f"{where}: {key} must be a positive integer, got {v!r}")
        return n
    return None


def _sharegpt(path: str, text: str, tokenizer: Tokenizer | None) -> list[DatasetRow]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise UsageError(f"{path}: a ShareGPT file is a JSON list of conversations")
    rows = []
    for i, item in enumerate(data):
        where = f"{path}: entry {i}"
        conv = item.get("conversations", item.get("conversation")) if isinstance(item, dict) else None
        if not isinstance(conv, list):
            raise UsageError(f"{where}: expected an object with a 'conversations' list")
        turns = []
        for t in conv:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                raise UsageError(f"{where}: each turn needs 'from' and a string 'value'")
            turns.append((_SHAREGPT_ROLES.get(str(t.get("from", "")).lower(), "?"), t["value"]))
        human = next((k for k, (r, v) in enumerate(turns) if r == "user" and v.strip()), None)
        if human is None or human + 1 >= len(turns) or turns[human + 1][0] != "assistant":
            continue  # no prompt/answer pair: skipped, as other tools do
        system = [turns[0]] if turns[0][0] == "system" and human > 0 else []
        answer = turns[human + 1][1]
        rows.append(DatasetRow((*system, turns[human]), None, where, max(1, count(answer, tokenizer))))
    if len(rows) < len(data):
        warnings.warn(f"{path}: {len(data) - len(rows):,} of {len(data):,} conversations skipped: no user turn "
                      "answered by the assistant (as other tools skip them)", stacklevel=2)
    return rows


def _csv(path: str, text: str) -> list[DatasetRow]:
    # the text as a file (read with newline=""): a quoted field keeps its line breaks,
    # and a \x0c or U+2028 inside one does not end the row. Strict: a quote left open
    # (which would swallow the rest of the file into one field) or stray text after a
    # closing quote is an error, as is a row with more or fewer fields than the header
    reader = csv.reader(io.StringIO(text), strict=True)
    rows: list[DatasetRow] = []
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1  # (the line this row starts on)
        try:
            fields = next(reader, None)
        except csv.Error as e:
            raise UsageError(f"{path}:{start}: malformed CSV row ({e}; an unclosed quote runs to the end of the file)") from None
        if fields is None:
            break
        if header is None:
            header = fields
            if "prompt" not in header:
                raise UsageError(f"{path}:1: a CSV dataset needs a 'prompt' column")
            continue
        if not fields:  # (a blank line)
            continue
        where = f"{path}:{start}"
        if len(fields) != len(header):
            raise UsageError(f"{where}: {len(fields)} field{'s' * (len(fields) != 1)}, but the header has {len(header)} ({', '.join(header)})")
        row = dict(zip(header, fields, strict=True))
        prompt = row["prompt"]
        if not prompt.strip():
            raise UsageError(f"{where}: empty prompt")
        rows.append(DatasetRow((("user", prompt),), _max_tokens(where, row), where))
    return rows
