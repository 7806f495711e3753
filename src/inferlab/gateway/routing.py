"""Which upstream a request goes to, among those with room, and which are healthy.

Plain bookkeeping, no I/O: ``least_outstanding`` picks the upstream holding the fewest
tokens in flight (then the fewest requests, then the one picked least recently);
``Health`` ejects an upstream after consecutive failures, for a backoff that doubles
with each ejection in a row (1 s, 2 s, 4 s … 30 s), and lets it back on its first
success.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferlab._clock import NS_PER_S, Clock

#: Consecutive failures that eject an upstream.
EJECT_AFTER = 3
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0


class LeastOutstanding:
    """Least outstanding tokens, then requests, then least recently picked."""

    def __init__(self, tokens_in_flight: list[int], requests_in_flight: list[int]) -> None:
        self.tokens = tokens_in_flight
        self.requests = requests_in_flight
        self._last_pick = [0] * len(tokens_in_flight)
        self._picks = 0

    def __call__(self, room: Sequence[int]) -> int:
        best = min(room, key=lambda i: (self.tokens[i], self.requests[i], self._last_pick[i]))
        self._picks += 1
        self._last_pick[best] = self._picks
        return best


class Health:
    """Ejection of failing upstreams (module docstring)."""

    def __init__(self, count: int, clock: Clock) -> None:
        self.clock = clock
        self.failures = [0] * count
        self.ejections = [0] * count
        self.ejected_until_ns = [0] * count

    def healthy(self, candidates: Sequence[int]) -> list[int]:
        """The candidates not ejected now; all of them if every one is (a request is
        better tried than refused)."""
        now = self.clock.now_ns()
        ok = [i for i in candidates if self.ejected_until_ns[i] <= now]
        return ok or list(candidates)

    def failed(self, upstream: int) -> None:
        self.failures[upstream] += 1
        if self.failures[upstream] >= EJECT_AFTER:
            backoff_s = min(BACKOFF_FIRST_S * 2 ** self.ejections[upstream], BACKOFF_MAX_S)
            self.ejections[upstream] += 1
            self.failures[upstream] = 0
            self.ejected_until_ns[upstream] = self.clock.now_ns() + int(backoff_s * NS_PER_S)

    def succeeded(self, upstream: int) -> None:
        self.failures[upstream] = 0
        self.ejections[upstream] = 0
        self.ejected_until_ns[upstream] = 0
