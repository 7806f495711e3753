"""Which upstream a request goes to, among those with room, and which are healthy.

Plain bookkeeping, no I/O and no clock of its own, so that the gateway (over HTTP) and
``sim run --replicas N --router POLICY`` (over simulated engines in virtual time) run the
same code. A router is called with the upstreams that have room, the request's prompt
prefix and its prompt tokens (as counted for admission), and reads the load it is given
(tokens and requests outstanding per upstream, lists its owner keeps up to date):

- ``round-robin``: each upstream in turn;
- ``least-outstanding``: the fewest tokens outstanding, then the fewest requests, then
  the most free KV cache the engine reported, then the one picked least recently;
- ``prefix-affinity``: requests whose prompts begin alike go to the same upstream (the
  highest rendezvous hash of the prefix), where the engine likely holds that prefix in
  its cache; unless that upstream is overloaded (``OVERLOAD_SLACK_TOKENS`` more
  outstanding than the least loaded one), then least-outstanding;
- ``split-by-length``: prompts of ``long_prompt_tokens`` or more go to the long pool (the
  upstreams named for them), the others to the rest, least-outstanding inside each, so
  short requests never queue behind a long prefill. A request waits for room in its own
  pool (``eligible``): one pool's being busy never sends its requests to the other,
  which would bring the blocking back. Only where none of its pool is left to it (every
  one ejected by ``Health``, or already tried and failed) does it go to the other pool:
  served late beside long prompts, rather than refused.

What is outstanding is counted locally, plus, where the engines report their own load
(``EngineLoad``: running and waiting requests read from their ``/metrics``), the
requests an engine holds that this owner did not send: ``foreign = running + waiting −
own in flight``, floored at 0, each counted as large as the owner's own requests in
flight are on average. Local counts are exact and current, a report is seconds old: so
the owner's own work always comes from its counts, and only the work it cannot see from
the report (``max(local, reported)`` would keep counting its own requests that have
ended since the report, and miss the ones sent since). A report older than
``max_age_s`` is dropped.

``Health`` ejects an upstream after consecutive failures, for a backoff that doubles
with each ejection in a row (1 s, 2 s, 4 s … 30 s), and lets it back on its first
success.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inferlab._clock import NS_PER_S, Clock

#: Consecutive failures that eject an upstream.
EJECT_AFTER = 3
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0

#: How much a prefix's home upstream may hold beyond the least loaded one before a
#: request for it goes elsewhere (tokens outstanding).
OVERLOAD_SLACK_TOKENS = 16384
#: How much of a prompt makes its prefix: characters of text, or token ids.
PREFIX_LENGTH = 256

SPLIT = "split-by-length"
ROUTERS = ("round-robin", "least-outstanding", "prefix-affinity", SPLIT)


class Router(Protocol):
    def __call__(self, room: Sequence[int], prefix: bytes, prompt_tokens: int) -> int:
        """The upstream (one of ``room``, never empty) for a request whose prompt
        begins with ``prefix`` and is ``prompt_tokens`` long."""
        ...


@dataclass(frozen=True)
class LongPool:
    """``split-by-length``'s settings: a prompt of ``prompt_tokens`` or more is long, and
    goes to ``upstreams`` (indices; at least one, and not all of them)."""

    prompt_tokens: int
    upstreams: frozenset[int]


class RoundRobin:
    def __init__(self, count: int) -> None:
        self._next = 0
        self._count = count

    def __call__(self, room: Sequence[int], prefix: bytes, prompt_tokens: int) -> int:
        for k in range(self._count):
            i = (self._next + k) % self._count
            if i in room:
                self._next = i + 1
                return i
        return room[0]


@dataclass(frozen=True)
class Reported:
    """An engine's own report of its load, read at ``at_ns``: requests running and
    waiting, KV-cache usage (0–1; None: not reported), and ``foreign``: the requests
    among them the reader did not send (running + waiting − its own in flight there,
    floored at 0)."""

    at_ns: int
    running: int
    waiting: int
    kv_usage: float | None
    foreign: int


class EngineLoad:
    """The latest report of each upstream's engine (module docstring); one older than
    ``max_age_s`` by ``clock`` is dropped."""

    def __init__(self, count: int, clock: Clock, max_age_s: float) -> None:
        self.clock = clock
        self.max_age_ns = int(max_age_s * NS_PER_S)
        self._latest: list[Reported | None] = [None] * count

    def report(self, upstream: int, running: float, waiting: float, kv_usage: float | None, own: int) -> Reported:
        """Record what ``upstream``'s engine reported, with ``own``: the requests the
        reader had in flight there as it read (the most of those counted before and
        after the read: an own request is never taken for a foreign one)."""
        running_n, waiting_n = max(round(running), 0), max(round(waiting), 0)
        r = Reported(self.clock.now_ns(), running_n, waiting_n, kv_usage, max(running_n + waiting_n - own, 0))
        self._latest[upstream] = r
        return r

    def reading(self, upstream: int) -> Reported | None:
        """``upstream``'s latest report, or None: none yet, or too old."""
        r = self._latest[upstream]
        if r is None or self.clock.now_ns() - r.at_ns > self.max_age_ns:
            return None
        return r


class LeastOutstanding:
    """Least outstanding tokens, then requests, then the engine's KV usage (reported),
    then least recently picked. With ``engines``, each upstream's outstanding work adds
    the requests its engine reported that the caller did not send (module docstring)."""

    def __init__(self, tokens: list[int], requests: list[int], engines: EngineLoad | None = None) -> None:
        self.tokens = tokens
        self.requests = requests
        self.engines = engines
        self._last_pick = [0] * len(tokens)
        self._picks = 0

    def outstanding(self, room: Sequence[int]) -> dict[int, tuple[float, int, float]]:
        """(tokens, requests, KV usage) outstanding on each of ``room``, as routing sees them."""
        if self.engines is None:
            return {i: (self.tokens[i], self.requests[i], 0.0) for i in room}
        own = sum(self.requests)
        # a foreign request counts as large as the caller's own are on average (with none
        # in flight, every local count is 0 and any size orders the same)
        size = sum(self.tokens) / own if own else 1.0
        out: dict[int, tuple[float, int, float]] = {}
        for i in room:
            r = self.engines.reading(i)
            if r is None:
                out[i] = (self.tokens[i], self.requests[i], 0.0)
            else:
                out[i] = (self.tokens[i] + r.foreign * size, self.requests[i] + r.foreign, r.kv_usage or 0.0)
        return out

    def __call__(self, room: Sequence[int], prefix: bytes = b"", prompt_tokens: int = 0) -> int:
        load = self.outstanding(room)
        best = min(room, key=lambda i: (*load[i], self._last_pick[i]))
        self._picks += 1
        self._last_pick[best] = self._picks
        return best


class PrefixAffinity:
    """Rendezvous hashing on the prompt's prefix, least-outstanding when overloaded."""

    def __init__(
        self, tokens: list[int], requests: list[int], slack_tokens: int = OVERLOAD_SLACK_TOKENS,
        engines: EngineLoad | None = None,
    ) -> None:
        self.slack_tokens = slack_tokens
        self.fallback = LeastOutstanding(tokens, requests, engines)

    def __call__(self, room: Sequence[int], prefix: bytes, prompt_tokens: int) -> int:
        home = max(room, key=lambda i: hashlib.blake2b(prefix, digest_size=8, salt=i.to_bytes(8, "little")).digest())
        tokens = {i: t for i, (t, _, _) in self.fallback.outstanding(room).items()}
        if tokens[home] > min(tokens.values()) + self.slack_tokens:
            return self.fallback(room)
        return home


class SplitByLength:
    """Long prompts to their own pool, the rest to the others, least-outstanding inside
    each (module docstring). Called with upstreams of both pools in ``room``, it picks in
    the request's own pool if any of it is there, else in the other."""

    def __init__(self, pool: LongPool, tokens: list[int], requests: list[int], engines: EngineLoad | None = None) -> None:
        self.pool = pool
        self.inside = LeastOutstanding(tokens, requests, engines)

    def is_long(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.pool.prompt_tokens

    def own(self, upstreams: Sequence[int], prompt_tokens: int) -> list[int]:
        """Those of ``upstreams`` in the pool of a prompt of ``prompt_tokens``."""
        long = self.is_long(prompt_tokens)
        return [i for i in upstreams if (i in self.pool.upstreams) == long]

    def __call__(self, room: Sequence[int], prefix: bytes, prompt_tokens: int) -> int:
        return self.inside(self.own(room, prompt_tokens) or room)


def make_router(
    name: str, tokens: list[int], requests: list[int], engines: EngineLoad | None = None,
    long_pool: LongPool | None = None,
) -> Router:
    """The router called ``name`` (one of ``ROUTERS``) over these load lists (one entry
    per upstream, kept up to date by the caller) and the engines' own reports, if
    given (round-robin reads neither). ``long_pool``: ``split-by-length``'s settings,
    which it needs and no other router takes. ``ValueError`` for another name, or for
    ``long_pool`` given to another router, missing, or naming no upstream, all of them
    or one out of range."""
    if (name == SPLIT) != (long_pool is not None):
        raise ValueError(f"a long-prompt pool goes with router {SPLIT!r}, and only with it (router {name!r})")
    if long_pool is not None:
        if not long_pool.upstreams or not long_pool.upstreams < set(range(len(tokens))) or long_pool.prompt_tokens < 1:
            raise ValueError(f"{SPLIT}: the long-prompt pool needs one upstream or more, of {len(tokens)}, and not all "
                             f"(pool {sorted(long_pool.upstreams)}), and a threshold of 1 token or more")
        return SplitByLength(long_pool, tokens, requests, engines)
    if name == "round-robin":
        return RoundRobin(len(tokens))
    if name == "least-outstanding":
        return LeastOutstanding(tokens, requests, engines)
    if name == "prefix-affinity":
        return PrefixAffinity(tokens, requests, engines=engines)
    raise ValueError(f"unknown router {name!r}: use one of {', '.join(ROUTERS)}")


def eligible(router: Router, upstreams: Sequence[int], prompt_tokens: int, health: Health | None = None) -> list[int]:
    """The upstreams a request of ``prompt_tokens`` may wait for room on, among
    ``upstreams`` (never empty): those ``health`` has not ejected (all of them if it
    has ejected every one: ``Health.healthy``); with ``split-by-length``, those of the
    request's own pool, unless none of its pool is among ``upstreams`` or every one of
    them is ejected, then the other pool's."""
    if not isinstance(router, SplitByLength):
        return health.healthy(upstreams) if health is not None else list(upstreams)
    own = router.own(upstreams, prompt_tokens)
    other = [i for i in upstreams if i not in own]

    def up(pool: list[int]) -> list[int]:
        return [i for i in pool if health is None or not health.ejected(i)]

    # (every upstream ejected: its own pool is tried anyway, as ``Health.healthy`` tries all)
    return up(own) or up(other) or own or other


def replicas_words(replicas: Mapping[str, Any], of: str) -> str:
    """'2 replicas of ``of`` (router split-by-length: prompts of 8,192+ tokens to 1 of
    them)', from a ``sim run``'s config.json ``replicas``."""
    words = f"{replicas['count']} replicas of {of} (router {replicas['router']}"
    if replicas.get("long_prompt_tokens") is not None:
        words += f": prompts of {replicas['long_prompt_tokens']:,}+ tokens to {replicas.get('long_replicas', 1)} of them"
    return words + ")"


def text_prefix(text: str) -> bytes:
    """The prefix key of a prompt given as text."""
    return text[:PREFIX_LENGTH].encode("utf-8", "surrogatepass")


def ids_prefix(ids: Sequence[int]) -> bytes:
    """The prefix key of a prompt given as token ids."""
    return b"".join(t.to_bytes(4, "little", signed=True) for t in ids[:PREFIX_LENGTH] if -(2**31) <= t < 2**31)


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

    def ejected(self, upstream: int) -> bool:
        return self.ejected_until_ns[upstream] > self.clock.now_ns()

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
