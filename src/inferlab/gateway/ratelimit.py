"""Per-key limits: requests and tokens per sliding minute (RPM, TPM).

A request is charged *before* it is sent: one request, and its estimated tokens
(``KeyConfig.tpm_counts``: input, output or both). The charge is corrected to the
engine's usage when the request ends (``refund``: taken back whole if the gateway
answered it without an upstream), so a burst of huge prompts cannot overshoot the
limit the way charging after the response does. Check and charge happen in one call
with no ``await`` between them, so concurrent requests on one event loop cannot both
pass on the same room.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from inferlab._clock import NS_PER_S, Clock
from inferlab.gateway.config import KeyConfig

WINDOW_NS = 60 * NS_PER_S


class Limited(Exception):
    """Over a key's limit: ``retry_after_s`` is when the window will have room (None:
    never, the request alone is over the limit); ``headers`` the ``x-ratelimit-*``."""

    def __init__(self, message: str, retry_after_s: float | None, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.headers = headers


@dataclass
class Charge:
    """One request's charge in its key's window: ``tokens`` as counted there."""

    t_ns: int
    tokens: int
    window: _Window | None = field(default=None, repr=False)


class _Window:
    def __init__(self) -> None:
        self.charges: deque[Charge] = deque()
        self.tokens = 0

    def expire(self, now_ns: int) -> None:
        while self.charges and self.charges[0].t_ns <= now_ns - WINDOW_NS:
            self.tokens -= self.charges.popleft().tokens


class RateLimiter:
    """The sliding windows of every key."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def counted(self, key: KeyConfig, input_tokens: int, output_tokens: int) -> int:
        """The tokens of a request as ``key``'s TPM limit counts them."""
        return {"input": input_tokens, "output": output_tokens}.get(key.tpm_counts, input_tokens + output_tokens)

    def reserve(self, key: KeyConfig, input_tokens: int, output_tokens: int) -> Charge:
        """Charge one request of these (estimated) tokens to ``key``, or raise ``Limited``
        and charge nothing."""
        now = self.clock.now_ns()
        w = self._windows.setdefault(key.name, _Window())
        w.expire(now)
        tokens = self.counted(key, input_tokens, output_tokens)
        if key.rpm is not None and len(w.charges) + 1 > key.rpm:
            wait = (w.charges[0].t_ns + WINDOW_NS - now) / NS_PER_S
            raise Limited(f"rate limit reached for key {key.name!r}: {key.rpm} requests per minute", wait,
                          self.headers(key, now))
        if key.tpm is not None and w.tokens + tokens > key.tpm:
            if tokens > key.tpm:
                raise Limited(
                    f"request too large for key {key.name!r}: about {tokens} tokens, the limit is {key.tpm} "
                    "tokens per minute", None, self.headers(key, now))
            raise Limited(f"rate limit reached for key {key.name!r}: {key.tpm} tokens per minute",
                          self._tokens_free_in_s(w, key.tpm - tokens, now), self.headers(key, now))
        charge = Charge(now, tokens, w)
        w.charges.append(charge)
        w.tokens += tokens
        return charge

    def correct(self, key: KeyConfig, charge: Charge, input_tokens: int, output_tokens: int) -> None:
        """Set ``charge`` to the tokens the request really used (if it is still in the
        window)."""
        tokens = self.counted(key, input_tokens, output_tokens)
        w = charge.window
        if w is not None and charge.t_ns > self.clock.now_ns() - WINDOW_NS:
            w.tokens += tokens - charge.tokens
        charge.tokens = tokens

    def refund(self, charge: Charge) -> None:
        """Take ``charge`` out of its window, the request and its tokens: one the gateway
        answered itself without an upstream (its queue's 503s, or its client left while
        it waited), which used nothing."""
        w = charge.window
        if w is None:
            return
        for i, c in enumerate(w.charges):
            if c is charge:  # (by identity: two charges may be equal)
                del w.charges[i]
                w.tokens -= charge.tokens
                break
        charge.window = None

    def headers(self, key: KeyConfig, now_ns: int | None = None) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for ``key``'s limits, as of now."""
        now = self.clock.now_ns() if now_ns is None else now_ns
        w = self._windows.get(key.name) or _Window()
        w.expire(now)
        out: dict[str, str] = {}
        if key.rpm is not None:
            # (OpenAI's reset: until the limit is back to its initial state, every request in
            # the window gone, as -reset-tokens counts until every token is)
            reset = max((w.charges[-1].t_ns + WINDOW_NS - now) / NS_PER_S, 0.0) if w.charges else 0.0
            out |= {
                "x-ratelimit-limit-requests": str(key.rpm),
                "x-ratelimit-remaining-requests": str(max(key.rpm - len(w.charges), 0)),
                "x-ratelimit-reset-requests": f"{reset:.3f}s",
            }
        if key.tpm is not None:
            out |= {
                "x-ratelimit-limit-tokens": str(key.tpm),
                "x-ratelimit-remaining-tokens": str(max(key.tpm - w.tokens, 0)),
                "x-ratelimit-reset-tokens": f"{self._tokens_free_in_s(w, 0, now):.3f}s",
            }
        return out

    @staticmethod
    def _tokens_free_in_s(w: _Window, target: int, now_ns: int) -> float:
        """Seconds until at most ``target`` tokens are charged in ``w``."""
        held = w.tokens
        for c in w.charges:
            if held <= target:
                break
            held -= c.tokens
            if held <= target:
                return max((c.t_ns + WINDOW_NS - now_ns) / NS_PER_S, 0.0)
        return 0.0


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
