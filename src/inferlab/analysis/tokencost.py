"""Template cost (``inferlab tokens``): what each part of a prompt costs in tokens, and
the TTFT those tokens cost at a prefill rate — the numbers behind "slim the template".

Parts: the system prompt, the user content (and earlier turns), and the chat template's
wrapping (role markers, separators, the generation prompt: everything the template adds
around the text). Over a prompt set the numbers are means per prompt. The prefill cost
is ``tokens / prefill_tps``, or, without a rate, the simulator's time for one prefill of
that length alone on an idle engine (no prefix cache hit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from inferlab.workload.spec import RequestSpec
from inferlab.workload.tokenizers import Tokenizer


@dataclass(frozen=True)
class TokenCost:
    """Mean tokens per prompt by part, and TTFT in ms for the whole prompt and for the
    prompt without the system prompt and template (``ttft_saved_ms`` is the difference)."""

    prompts: int
    system_tokens: float
    user_tokens: float
    template_tokens: float
    total_tokens: float
    overhead_share: float  # (system + template) / total
    prefill_source: str
    ttft_ms: float | None
    ttft_user_only_ms: float | None
    ttft_saved_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


PrefillTime = Callable[[int], float]  # prompt tokens → seconds to first token


def token_cost(
    specs: Sequence[RequestSpec], tokenizer: Tokenizer, prefill: PrefillTime | None, source: str
) -> TokenCost:
    """Measure ``specs`` (at least one) with ``tokenizer``'s counts and chat template."""
    if not specs:
        raise ValueError("no prompts to measure")
    system = user = total = 0
    for s in specs:
        sys_n = len(tokenizer.encode(s.system)) if s.system else 0
        user_n = sum(len(tokenizer.encode(m["content"])) for m in s.messages() if m["role"] != "system")
        system += sys_n
        user += user_n
        total += len(tokenizer.apply_chat_template(s.messages()))
    n = len(specs)
    template = total - system - user
    mean_total, mean_user = total / n, user / n
    ttft = ttft_user = None
    if prefill is not None:
        ttft = prefill(round(mean_total)) * 1e3
        ttft_user = prefill(max(1, round(mean_user))) * 1e3
    return TokenCost(
        n, system / n, mean_user, template / n, mean_total,
        (system + template) / total if total else 0.0, source,
        ttft, ttft_user, None if ttft is None or ttft_user is None else ttft - ttft_user,
    )


def rate_prefill(prefill_tps: float) -> PrefillTime:
    return lambda n: n / prefill_tps


def sim_prefill(model: str, gpu: str) -> PrefillTime:
    """One prefill of ``n`` tokens on an idle simulated engine (``UsageError`` for an
    unknown model or GPU, ``ValueError`` for a length the model cannot take); includes
    the engine's per-request API cost."""
    from inferlab.load.virtual import serve_timelines
    from inferlab.sim.engine.engine import Engine, EngineConfig

    def time_s(n: int) -> float:
        cfg = EngineConfig(model=model, gpu=gpu, max_model_len=max(4096, n + 16), enable_prefix_caching=False)
        tl = serve_timelines(Engine(cfg), [(0.0, "r", list(range(1000, 1000 + n)), 1)])["r"]
        assert tl.first_token_s is not None
        return tl.first_token_s  # from arrival: includes the per-request API cost

    return time_s
