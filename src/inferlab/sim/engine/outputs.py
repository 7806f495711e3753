"""How long the simulated model's answers are when nothing forces a length."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

#: vLLM's ``CompletionRequest.max_tokens`` default: a completions request without one is
#: answered in at most 16 tokens (the chat API's default is the context that is left)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def natural_output_len(prompt_ids: Sequence[int], median_tokens: int) -> int:
    """Where the simulated model stops by itself when nothing forces a length: a
    lognormal draw (σ 0.6) around ``median_tokens``, fixed by the prompt's last 64 tokens
    (the same prompt always gets the same answer length, as with greedy decoding)."""
    tail = ",".join(map(str, prompt_ids[-64:])).encode()
    rng = random.Random(int.from_bytes(hashlib.blake2b(tail, digest_size=8).digest(), "little"))
    return max(1, round(rng.lognormvariate(math.log(median_tokens), 0.6)))
