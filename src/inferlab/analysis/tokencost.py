"""Template cost (``inferlab tokens``): what each part of a prompt costs in tokens, and
the TTFT those tokens cost at a prefill rate — the numbers behind "slim the template".

Parts, counted by each message's role: the system prompt (every ``system`` or
``developer`` message, wherever it is), the user content (the user's messages and the
earlier turns: assistant and tool messages), and the chat template's wrapping (role
markers, separators, the generation prompt: everything the template adds around the
text; the templated prompt's tokens less the parts counted apart). Where the template
joins texts without a separator, BPE can merge tokens across the join, so the templated
prompt is shorter than its parts counted apart: that prompt's template share is 0, and
the tokens merged are counted (``merged_tokens``).

Over a prompt set the token counts are means per prompt (and the total's p50, p99 and
max), and the TTFT is each prompt's own, summarised as mean, p50 and p99 (the TTFT of a
prompt of mean length is not the mean TTFT: prefill is not linear in length). The
prefill cost is ``tokens / prefill_tps``, or, without a rate, the simulator's time for
one prefill of that length alone on an idle engine (no prefix cache hit); a prompt
longer than the simulated model's context has none (``PromptTooLong``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from inferlab.results.metrics import percentile
from inferlab.workload.spec import RequestSpec
from inferlab.workload.tokenizers import TemplateRefused, Tokenizer

#: The roles counted as the system prompt (OpenAI's newer name for it is ``developer``).
SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class TokenCost:
    """Mean tokens per prompt by part (and the total's p50, p99 and max over prompts),
    and TTFT in ms: the mean, p50 and p99 of each prompt's own for the whole prompt,
    the mean for the prompt without the system prompt and template (its user content
    alone), and the mean of each prompt's difference (``ttft_saved_ms``).

    ``ttft_prompts``: how many prompts the TTFT covers (those the simulated model's
    context holds: ``context_tokens`` is that context where some prompt exceeds it, else
    None); the TTFT fields are None where it is 0. ``merged_tokens``: tokens the
    template's joins merged away, over all prompts (``module docstring``)."""

    prompts: int
    system_tokens: float
    user_tokens: float
    template_tokens: float
    total_tokens: float
    total_tokens_p50: float
    total_tokens_p99: float
    total_tokens_max: int
    overhead_share: float  # (system + template) / total
    prefill_source: str
    ttft_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttft_user_only_ms: float | None
    ttft_saved_ms: float | None
    ttft_prompts: int
    context_tokens: int | None
    merged_tokens: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


PrefillTime = Callable[[int], float]  # prompt tokens → seconds to first token


class PromptTooLong(ValueError):
    """A prompt longer than the simulated model's context: no prefill to time."""

    def __init__(self, tokens: int, context: int) -> None:
        super().__init__(f"a prompt of {tokens:,} tokens exceeds the model's context of {context:,} tokens")
        self.tokens = tokens
        self.context = context


def _parts(spec: RequestSpec, tokenizer: Tokenizer) -> tuple[int, int, int]:
    """(system, user, templated total) tokens of one prompt, counted by role."""
    system = user = 0
    messages = spec.messages()
    for m in messages:
        n = len(tokenizer.encode(m["content"])) if m["content"] else 0
        if m["role"] in SYSTEM_ROLES:
            system += n
        else:
            user += n
    return system, user, len(tokenizer.apply_chat_template(messages))


def token_cost(
    specs: Sequence[RequestSpec], tokenizer: Tokenizer, prefill: PrefillTime | None, source: str,
    where: Sequence[str] = (),
) -> TokenCost:
    """Measure ``specs`` (at least one) with ``tokenizer``'s counts and chat template.
    ``where``: each spec's place (a dataset's ``path:line``), named when the template
    refuses its messages (``TemplateRefused``)."""
    if not specs:
        raise ValueError("no prompts to measure")
    systems, users, totals, templates = [], [], [], []
    merged = 0
    for i, s in enumerate(specs):
        try:
            sys_n, user_n, total_n = _parts(s, tokenizer)
        except TemplateRefused as e:
            if i < len(where):
                raise TemplateRefused(f"{where[i]}: {e}") from None
            raise
        systems.append(sys_n)
        users.append(user_n)
        totals.append(total_n)
        template_n = total_n - sys_n - user_n
        merged += max(0, -template_n)
        templates.append(max(0, template_n))
    n = len(specs)
    system, user, template, total = sum(systems), sum(users), sum(templates), sum(totals)
    ordered = sorted(totals)
    ttfts: list[float] = []
    user_only: list[float] = []
    context = None
    if prefill is not None:
        for total_n, user_n in zip(totals, users, strict=True):
            try:
                whole, alone_n = prefill(total_n) * 1e3, prefill(max(1, user_n)) * 1e3
            except PromptTooLong as e:
                context = e.context
                continue
            ttfts.append(whole)
            user_only.append(alone_n)
    ranked = sorted(ttfts)
    ttft = sum(ttfts) / len(ttfts) if ttfts else None
    alone = sum(user_only) / len(user_only) if user_only else None
    return TokenCost(
        n, system / n, user / n, template / n, total / n,
        percentile(ordered, 50), percentile(ordered, 99), ordered[-1],
        (system + template) / total if total else 0.0, source,
        ttft, percentile(ranked, 50) if ranked else None, percentile(ranked, 99) if ranked else None,
        alone, None if ttft is None or alone is None else ttft - alone,
        len(ttfts), context, merged,
    )


def rate_prefill(prefill_tps: float) -> PrefillTime:
    return lambda n: n / prefill_tps


def sim_prefill(model: str, gpu: str) -> PrefillTime:
    """One prefill of ``n`` tokens on an idle simulated engine (``UsageError`` for an
    unknown model or GPU, ``PromptTooLong`` for a prompt the model's context cannot take
    with one token of output); includes the engine's per-request API cost. Each length
    is simulated once."""
    from inferlab.load.virtual import serve_timelines
    from inferlab.sim.engine.engine import Engine, EngineConfig
    from inferlab.sim.engine.hardware import resolve_model

    context = resolve_model(model).max_position_embeddings

    @functools.cache
    def time_s(n: int) -> float:
        if n + 1 > context:
            raise PromptTooLong(n, context)
        cfg = EngineConfig(model=model, gpu=gpu, max_model_len=min(context, max(4096, n + 16)),
                           enable_prefix_caching=False)
        tl = serve_timelines(Engine(cfg), [(0.0, "r", list(range(1000, 1000 + n)), 1)])["r"]
        assert tl.first_token_s is not None
        return tl.first_token_s  # from arrival: includes the per-request API cost

    return time_s
