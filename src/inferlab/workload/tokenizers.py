"""Tokenizers behind one small Protocol: the simulator's built-in one, or a local
``tokenizer.json`` through the optional ``tokenizers`` package: a path, or a Hugging Face
model id found in the local hub cache (no hub downloads).

The chat template of a local tokenizer is the model's own when a
``tokenizer_config.json`` beside its ``tokenizer.json`` has a ``chat_template``, or a
``chat_template.jinja`` lies beside it (rendered with Jinja2, as ``transformers`` and vLLM
render it); otherwise, and for the built-in
tokenizer, ChatML (as Qwen uses it). ``HFTokenizer.template_source`` says which.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from inferlab._errors import UsageError
from inferlab.workload.text import PASSAGE


class Tokenizer(Protocol):
    """What the client and the simulator need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def template_source(self) -> str:
        """Which chat template ``apply_chat_template`` renders (a file, or ChatML)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
    ) -> list[int]: ...

    def output_token(self, index: int) -> int: ...

    def output_piece(self, index: int) -> str: ...


def content_text(content: object) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content-part
    list joined (as vLLM does for text-only models). ``ValueError`` for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError("message content must be a string or a list of content parts")


def chatml(messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True) -> str:
    """ChatML text, with the assistant generation prompt appended unless told not to."""
    parts = [f"<|im_start|>{m.get('role', 'user')}\n{content_text(m.get('content'))}<|im_end|>\n" for m in messages]
    return "".join(parts) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


#: What ``template_source`` says when a tokenizer has no template of its own.
CHATML = "ChatML (built in; the tokenizer has no chat_template)"


class ChatTemplate:
    """A model's Jinja chat template from its ``tokenizer_config.json``, rendered as
    ``transformers`` renders it: a sandboxed environment with ``trim_blocks`` and
    ``lstrip_blocks``, the special tokens the config names, ``raise_exception`` and
    ``strftime_now``. Content-part lists are joined into text first."""

    def __init__(self, source: str, tokens: Mapping[str, str], origin: str) -> None:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise UsageError(
                f"{origin} has a chat_template, which needs the 'jinja2' package to render: "
                "pip install 'inferlab[tokenizers]'"
            ) from None
        self._error = TemplateError
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise UsageError(f"{origin}: its chat_template does not parse ({e})") from None
        self._tokens = dict(tokens)
        self.origin = origin

    def render(self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True) -> str:
        """The prompt text; ``TemplateRefused`` (a ``ValueError``: a server's 400; a usage
        error on the command line) when the template refuses the messages."""
        plain = [{**m, "content": content_text(m.get("content"))} for m in messages]
        try:
            return str(self._template.render(messages=plain, add_generation_prompt=add_generation_prompt, **self._tokens))
        except self._error as e:
            roles = "/".join(dict.fromkeys(str(m.get("role", "user")) for m in messages))
            raise TemplateRefused(f"the chat template ({self.origin}) refuses these messages ({roles}): {e}") from None


class TemplateRefused(UsageError, ValueError):
    """A chat template that refuses the messages it was given (its ``raise_exception``:
    a system message the model has no role for, roles out of turn)."""


def _raise_template_error(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


def _special_token(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or an
    ``AddedToken`` object with its ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def read_chat_template(tokenizer_file: str) -> ChatTemplate | None:
    """The chat template in the ``tokenizer_config.json`` beside ``tokenizer_file``, else
    in a ``chat_template.jinja`` beside it (where ``transformers`` >= 4.43 saves it), or
    ``None`` when there is neither. A list of named templates (the newer form) gives the
    one named ``default``. ``UsageError`` for a config that is not JSON or a template
    that does not parse."""
    folder = os.path.dirname(tokenizer_file)
    config_file = os.path.join(folder, "tokenizer_config.json")
    try:
        with open(config_file, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = "{}"
    try:
        config = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{config_file}: not JSON ({e})") from None
    source = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(source, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    origin = config_file
    if not isinstance(source, str):
        jinja_file = os.path.join(folder, "chat_template.jinja")
        try:
            with open(jinja_file, encoding="utf-8") as f:
                source = f.read()
        except OSError:
            return None
        origin = jinja_file
    if not isinstance(config, dict):
        config = {}
    tokens = {
        name: token
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (token := _special_token(config.get(name))) is not None
    }
    return ChatTemplate(source, tokens, origin)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json``. Encoding adds no
    special tokens (the server adds BOS itself where the model needs one)."""

    def __init__(self, tok: Any, path: str, template: ChatTemplate | None = None) -> None:
        self._tok = tok
        self.path = path
        self.template = template
        self._passage: list[int] = self.encode(PASSAGE) or [0]

    @property
    def template_source(self) -> str:
        return self.template.origin if self.template else CHATML

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def num_special_tokens_to_add(self) -> int:
        """The special tokens the tokenizer adds around one sequence (a BOS, say), as
        ``transformers``' method of this name counts them for a fast tokenizer: what
        ``vllm bench serve``'s random dataset takes off ``--random-input-len``."""
        return int(self._tok.num_special_tokens_to_add(False))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True
    ) -> list[int]:
        if self.template is None:
            return self.encode(chatml(messages, add_generation_prompt))
        return self.encode(self.template.render(messages, add_generation_prompt))

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
    return HFTokenizer(tok, file, read_chat_template(file))
