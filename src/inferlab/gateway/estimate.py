"""How many tokens a request will hold on its engine, before it is sent: its prompt (by
a tokenizer, or estimated from its length) plus the output it may produce. Admission
and per-key limits reserve this much; the reservation is trued up to the engine's own
count (``usage``) when the request ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferlab._errors import UsageError
from inferlab.workload.tokenizers import chatml

#: Characters per token of English text with common BPE vocabularies (a rough, usually
#: high, estimate: it reserves a little more than a request will use).
CHARS_PER_TOKEN = 4

Counter = Callable[[str], int]


def prompt_counter(tokenizer: str) -> Counter:
    """A function from prompt text to its token count: ``estimate`` (one token per
    ``CHARS_PER_TOKEN`` characters), ``builtin`` (the simulator's tokenizer, exact for
    ``sim serve``) or the path of a tokenizer.json (needs the ``tokenizers`` extra).
    ``UsageError`` if the tokenizer cannot be loaded."""
    if tokenizer == "estimate":
        return lambda text: -(-len(text) // CHARS_PER_TOKEN)
    if tokenizer == "builtin":
        from inferlab.workload.builtin_tokenizer import BuiltinTokenizer

        builtin = BuiltinTokenizer()
        return lambda text: len(builtin.encode(text))
    from inferlab.workload.tokenizers import load_tokenizer

    try:
        hf = load_tokenizer(tokenizer)
    except (OSError, ValueError) as e:
        raise UsageError(f"[admission] tokenizer {tokenizer!r}: {e}") from None
    return lambda text: len(hf.encode(text))


def prompt_of(body: dict[str, Any], chat: bool) -> str | list[Any]:
    """A checked request's prompt as its engine will read it: a chat request's messages
    as ChatML text (so the template's tokens count too), a completions prompt's text, or
    its token ids."""
    if chat:
        return chatml(body["messages"])
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    return prompt if isinstance(prompt, list) else str(prompt)


def count_prompt(prompt: str | list[Any], count: Counter) -> int:
    """The tokens of a ``prompt_of``: text by ``count``, token ids as given."""
    return len(prompt) if isinstance(prompt, list) else count(prompt)


def prompt_tokens(body: dict[str, Any], chat: bool, count: Counter) -> int:
    """A checked request's prompt tokens (``prompt_of``, counted by ``count``)."""
    return count_prompt(prompt_of(body, chat), count)
