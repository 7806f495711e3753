"""State shared by several gateway instances through Redis: the per-key RPM/TPM windows
and the response cache (``[redis]`` in the config; needs the ``redis`` extra).

Limits: each key's sliding minute is a sorted set of charges (scored by Redis's own
clock, so instances need not agree on time), a hash of each charge's tokens and a
running total. Check and charge are one Lua script, atomic across every instance: no
two instances can take the same room, and a burst over the limit is refused before it is
sent. A charge leaves the window after a minute whatever happens to the instance that
made it, so one that dies mid-stream holds nothing for longer (its charge keeps the
estimate instead of being corrected to usage).

Cache: each entry is one Redis string with the entry's TTL; Redis's own ``maxmemory``
policy bounds the total. Identical misses coalesce within an instance, not across.

Admission (``SharedAdmission``): each upstream's tokens and requests in flight, as two
hashes of one field per instance (what that instance holds there), keyed by the
upstream's URL, so every instance with the same upstream counts against one budget.
Taking room is one Lua script that sums the other instances' fields and charges this
one's only if the request fits (the rule of ``Admission.fits``): no two instances can
take the same room. Giving back is an increment, so the instance's calls need no order.
An instance is alive while its lease key is (renewed every third of ``lease_s``); a
script that finds a field whose instance has no lease deletes it, so an instance that
dies mid-stream holds its room at most ``lease_s`` longer. Each give back publishes on
a channel; an instance with requests waiting reads the others' counts when told (and
every ``POLL_S`` while any wait), and lets in what now fits. If a call's outcome is
unknown (Redis failed, or the request was cancelled during it), this instance's fields
are written again from its own count, with no call of its in flight.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from inferlab._errors import UsageError
from inferlab.gateway.admission import Admission, Ticket
from inferlab.gateway.cache import Answer, Entry
from inferlab.gateway.config import KeyConfig
from inferlab.gateway.ratelimit import Limited

log = logging.getLogger("inferlab.gateway")
_T = TypeVar("_T")

#: Keys are ``{prefix}{kind}:{name}``; ``prefix`` defaults to ``inferlab:``.
_RESERVE = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local rpm, tpm, tokens = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
for _, id in ipairs(old) do
  local v = redis.call('HGET', KEYS[2], id)
  if v then redis.call('DECRBY', KEYS[3], v) end
  redis.call('HDEL', KEYS[2], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
if rpm >= 0 and count + 1 > rpm then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, 'rpm', tonumber(first[2]) + window - now, count, used}
end
if tpm >= 0 and used + tokens > tpm then
  if tokens > tpm then return {0, 'too_large', -1, count, used} end
  local held = used
  local charges = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #charges, 2 do
    held = held - tonumber(redis.call('HGET', KEYS[2], charges[i]) or '0')
    if held + tokens <= tpm then return {0, 'tpm', tonumber(charges[i + 1]) + window - now, count, used} end
  end
  return {0, 'tpm', window, count, used}
end
redis.call('ZADD', KEYS[1], now, ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], tokens)
redis.call('INCRBY', KEYS[3], tokens)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], window * 2) end
return {1, 'ok', 0, count + 1, used + tokens}
"""

_CORRECT = """
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[3], tonumber(ARGV[2]) - tonumber(v))
return 1
"""

WINDOW_MS = 60_000


class SharedLimiter:
    """Per-key RPM/TPM windows in Redis (module docstring); the same contract as
    ``RateLimiter``, with ``await``."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._reserve = client.register_script(_RESERVE)
        self._correct = client.register_script(_CORRECT)

    def _keys(self, key: KeyConfig) -> list[str]:
        base = f"{self.prefix}limit:{key.name}:"
        return [base + "charges", base + "tokens", base + "total"]

    @staticmethod
    def counted(key: KeyConfig, input_tokens: int, output_tokens: int) -> int:
        return {"input": input_tokens, "output": output_tokens}.get(key.tpm_counts, input_tokens + output_tokens)

    async def reserve(self, key: KeyConfig, input_tokens: int, output_tokens: int) -> tuple[str, dict[str, str]]:
        """Charge one request to ``key`` across every instance: (the charge's id, the
        ``x-ratelimit-*`` headers); ``Limited`` and nothing charged if over a limit."""
        tokens = self.counted(key, input_tokens, output_tokens)
        charge = uuid.uuid4().hex
        ok, why, wait_ms, count, used = await self._reserve(
            keys=self._keys(key),
            args=[WINDOW_MS, -1 if key.rpm is None else key.rpm, -1 if key.tpm is None else key.tpm, tokens, charge],
        )
        why = why.decode() if isinstance(why, bytes) else str(why)
        headers = _headers(key, int(count), int(used))
        if int(ok):
            return charge, headers
        if why == "too_large":
            raise Limited(f"request too large for key {key.name!r}: about {tokens} tokens, the limit is {key.tpm} "
                          "tokens per minute", None, headers)
        what = f"{key.rpm} requests" if why == "rpm" else f"{key.tpm} tokens"
        raise Limited(f"rate limit reached for key {key.name!r}: {what} per minute", max(int(wait_ms), 0) / 1000, headers)

    async def correct(self, key: KeyConfig, charge: str, input_tokens: int, output_tokens: int) -> None:
        await self._correct(keys=self._keys(key), args=[charge, self.counted(key, input_tokens, output_tokens)])


def _headers(key: KeyConfig, count: int, used: int) -> dict[str, str]:
    out: dict[str, str] = {}
    if key.rpm is not None:
        out |= {"x-ratelimit-limit-requests": str(key.rpm),
                "x-ratelimit-remaining-requests": str(max(key.rpm - count, 0))}
    if key.tpm is not None:
        out |= {"x-ratelimit-limit-tokens": str(key.tpm),
                "x-ratelimit-remaining-tokens": str(max(key.tpm - used, 0))}
    return out


class SharedCache:
    """Response cache entries in Redis, one string each, expiring after ``ttl_s``;
    entries over ``max_bytes`` are not stored."""

    def __init__(self, client: Any, prefix: str, ttl_s: float, max_bytes: int) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_ms = int(ttl_s * 1000)
        self.max_bytes = max_bytes

    async def get(self, key: str) -> Entry | None:
        raw = await self.client.get(self.prefix + "cache:" + key)
        if raw is None:
            return None
        try:
            return _decode(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            return None  # (written by another version: a miss)

    async def put(self, key: str, entry: Entry) -> None:
        raw = json.dumps(_encode(entry), separators=(",", ":"))
        if len(raw) <= self.max_bytes:
            await self.client.set(self.prefix + "cache:" + key, raw, px=self.ttl_ms)


def _encode(e: Entry) -> dict[str, Any]:
    a = e.answer
    return {
        "chat": e.chat,
        "answer": [a.id, a.created, a.model, a.text, a.finish_reason, a.usage, a.plain],
        "reads": None if e.reads is None else [[[d, u] for d, u in read] for read in e.reads],
        "body": None if e.body is None else base64.b64encode(e.body).decode(),
    }


def _decode(d: dict[str, Any]) -> Entry:
    i, created, model, text, finish, usage, plain = d["answer"]
    reads = None if d["reads"] is None else tuple(tuple((str(x), bool(u)) for x, u in read) for read in d["reads"])
    body = None if d["body"] is None else base64.b64decode(d["body"])
    return Entry(bool(d["chat"]), Answer(str(i), int(created), str(model), str(text), str(finish), dict(usage), bool(plain)), reads, body)


# Admission. KEYS: per upstream its tokens hash and its requests hash. ARGV[1] this
# instance's id, ARGV[2] the lease keys' prefix (+ an id).
_OTHERS = """
local function others(key, me, pre)
  local f = redis.call('HGETALL', key)
  local sum = 0
  for i = 1, #f, 2 do
    if f[i] ~= me then
      if redis.call('EXISTS', pre .. f[i]) == 1 then sum = sum + tonumber(f[i + 1])
      else redis.call('HDEL', key, f[i]) end
    end
  end
  return sum
end
"""

# ARGV[3] lease ms, [4] mode, [5] tokens needed, [6] the token budget, [7] the request
# budget, [8] [9] this instance's tokens and requests there (if its lease had lapsed)
_TAKE = _OTHERS + """
local me, pre = ARGV[1], ARGV[2]
local live = pre .. me
local lapsed = redis.call('EXISTS', live) == 0
if lapsed then
  redis.call('HSET', KEYS[1], me, ARGV[8])
  redis.call('HSET', KEYS[2], me, ARGV[9])
end
redis.call('SET', live, '1', 'PX', ARGV[3])
local ot, orq = others(KEYS[1], me, pre), others(KEYS[2], me, pre)
local mt = tonumber(redis.call('HGET', KEYS[1], me) or '0')
local mr = tonumber(redis.call('HGET', KEYS[2], me) or '0')
local need = tonumber(ARGV[5])
local ok
if ARGV[4] == 'tokens' then
  local held = ot + mt
  ok = held == 0 or held + need <= tonumber(ARGV[6])
else
  ok = orq + mr < tonumber(ARGV[7])
end
if ok then
  redis.call('HINCRBY', KEYS[1], me, need)
  redis.call('HINCRBY', KEYS[2], me, 1)
end
return {ok and 1 or 0, ot, orq, lapsed and 1 or 0}
"""

# ARGV[3] lease ms, [4] [5] tokens and requests to add, [6] [7] this instance's counts
# after them (if its lease had lapsed), [8] the channel told of room given back
_GIVE = """
local me, pre = ARGV[1], ARGV[2]
local live = pre .. me
local lapsed = 0
if redis.call('EXISTS', live) == 0 then
  redis.call('HSET', KEYS[1], me, ARGV[6])
  redis.call('HSET', KEYS[2], me, ARGV[7])
  redis.call('SET', live, '1', 'PX', ARGV[3])
  lapsed = 1
else
  redis.call('HINCRBY', KEYS[1], me, ARGV[4])
  redis.call('HINCRBY', KEYS[2], me, ARGV[5])
end
if tonumber(ARGV[4]) < 0 or tonumber(ARGV[5]) < 0 then redis.call('PUBLISH', ARGV[8], KEYS[1]) end
return lapsed
"""

# Renew the lease; ARGV[4] == '1' (or a lapsed lease): write this instance's counts,
# ARGV[5..] two per upstream, in KEYS' order. Returns the others' counts, two per upstream.
_BEAT = _OTHERS + """
local me, pre = ARGV[1], ARGV[2]
local live = pre .. me
local write = ARGV[4] == '1' or redis.call('EXISTS', live) == 0
redis.call('SET', live, '1', 'PX', ARGV[3])
local out = {}
for i = 1, #KEYS do
  if write then redis.call('HSET', KEYS[i], me, ARGV[4 + i]) end
  out[i] = others(KEYS[i], me, pre)
end
return out
"""

# Leave: this instance's fields and lease go; the others are told.
_LEAVE = """
for i = 1, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
redis.call('DEL', ARGV[2] .. ARGV[1])
redis.call('PUBLISH', ARGV[3], 'left')
return 1
"""

#: The longest each step of leaving waits for Redis (at exit).
STOP_WAIT_S = 2.0

#: How often an instance with requests waiting reads the others' counts, whatever it
#: was told (a lease that lapsed publishes nothing).
POLL_S = 0.25


class SharedAdmission:
    """``admission``'s budgets counted across every instance that shares the Redis
    (module docstring): ``admission.shared`` while ``start``-ed. ``upstreams``: each
    upstream's URL, in the admission's order."""

    def __init__(self, client: Any, prefix: str, admission: Admission, upstreams: Sequence[str],
                 lease_s: float = 10.0) -> None:
        self.client = client
        self.admission = admission
        self.id = uuid.uuid4().hex
        self.lease_ms = max(int(lease_s * 1000), 1)
        self._live = f"{prefix}admission:live:"
        self._channel = f"{prefix}admission:released"
        self._keys = [[f"{prefix}admission:{url}:tokens", f"{prefix}admission:{url}:requests"] for url in upstreams]
        self._take = client.register_script(_TAKE)
        self._give = client.register_script(_GIVE)
        self._beat = client.register_script(_BEAT)
        self._leave = client.register_script(_LEAVE)
        n = len(upstreams)
        # what this instance holds in the shared count, by the calls Redis applied
        self.tokens = [0] * n
        self.requests = [0] * n
        self._calls = 0  # calls to Redis in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # cleared while this instance's fields are written again
        self._open.set()
        self._unsure = False  # a call's outcome is unknown: write the fields again
        self._beating = asyncio.Lock()  # one beat at a time (a rewrite must not overlap a read)
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._pubsub: Any = None

    @property
    def _base(self) -> list[Any]:
        return [self.id, self._live, self.lease_ms]

    async def _call(self, call: Callable[[], Awaitable[_T]], applied: Callable[[_T], None] | None = None) -> _T:
        """One call to Redis, counted in flight; ``applied(result)`` right after it
        returns (nothing awaits between). A call that fails or is cancelled leaves
        this instance's fields unsure."""
        await self._open.wait()
        self._calls += 1
        self._idle.clear()
        try:
            out = await call()
            if applied is not None:
                applied(out)
            return out
        except BaseException:
            self._unsure = True
            raise
        finally:
            self._calls -= 1
            if not self._calls:
                self._idle.set()

    async def take(self, ticket: Ticket) -> bool:
        a, i = self.admission, ticket.upstream
        need = ticket.tokens

        def applied(out: Any) -> None:
            ok, others_tokens, others_requests, lapsed = (int(x) for x in out)
            a.others_tokens[i], a.others_requests[i] = others_tokens, others_requests
            if lapsed:  # (its other upstreams' fields may be gone too: the next beat writes them)
                self._unsure = True
            if ok:
                self.tokens[i] += need
                self.requests[i] += 1

        ok, *_ = await self._call(lambda: self._take(keys=self._keys[i], args=[
            *self._base, a.mode, need, a.max_tokens[i], a.max_requests[i], self.tokens[i], self.requests[i]]),
            applied)
        return bool(int(ok))

    def give(self, upstream: int, tokens: int, requests: int) -> None:
        async def send() -> None:
            def args() -> list[Any]:  # (read when the call goes: the counts after it)
                self.tokens[upstream] += tokens
                self.requests[upstream] += requests
                return [*self._base, tokens, requests, self.tokens[upstream], self.requests[upstream],
                        self._channel]

            try:
                if int(await self._call(lambda: self._give(keys=self._keys[upstream], args=args()))):
                    self._unsure = True  # its lease had lapsed: the next beat writes every field
            except Exception as e:  # (redis' own errors): the fields are written again at the next beat
                log.warning("redis: %s: %s", type(e).__name__, e)

        task = asyncio.create_task(send())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def wake(self) -> None:
        self._wakeup.set()

    async def beat(self) -> None:
        """Renew the lease; read the others' counts into the admission, and let in what
        fits. Where unsure, first write this instance's fields again, with no call of
        its in flight and none starting."""
        keys = [k for pair in self._keys for k in pair]
        async with self._beating:
            if self._unsure:
                self._open.clear()
                try:
                    await self._idle.wait()
                    self._unsure = False
                    await self._read(keys, True)
                except BaseException:
                    self._unsure = True
                    raise
                finally:
                    self._open.set()
            else:
                await self._call(lambda: self._read(keys, False))
        self.admission.regrant()

    async def _read(self, keys: list[str], write: bool) -> None:
        mine = [v for i in range(len(self._keys)) for v in (self.tokens[i], self.requests[i])]
        out = await self._beat(keys=keys, args=[*self._base, "1" if write else "0", *mine])
        a = self.admission
        for i in range(len(self._keys)):
            a.others_tokens[i], a.others_requests[i] = int(out[2 * i]), int(out[2 * i + 1])

    async def start(self) -> None:
        """Join: write this instance's (empty) fields and lease; then keep the lease and
        watch for room given back, until ``stop``."""
        await self.beat()
        self._pubsub = self.client.pubsub()
        await self._pubsub.subscribe(self._channel)
        self._tasks = [asyncio.create_task(self._keep()), asyncio.create_task(self._listen()),
                       asyncio.create_task(self._watch())]
        self.admission.shared = self

    async def stop(self) -> None:
        """Leave: stop the tasks, wait for the give-backs, take this instance's fields out."""
        self.admission.shared = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pending:
            await asyncio.wait(self._pending, timeout=STOP_WAIT_S)
        with contextlib.suppress(Exception):  # (what is not left here lapses with the lease)
            await asyncio.wait_for(self._leave(keys=[k for pair in self._keys for k in pair],
                                               args=[self.id, self._live, self._channel]), STOP_WAIT_S)
        with contextlib.suppress(Exception):
            if self._pubsub is not None:
                await asyncio.wait_for(self._pubsub.aclose(), STOP_WAIT_S)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.beat()
            except Exception as e:  # (redis' own errors): the lease lapses if Redis stays away
                log.warning("redis: %s: %s", type(e).__name__, e)

    async def _listen(self) -> None:
        failing = False
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
            except Exception as e:  # (redis' own errors): said once; wait, then listen again (polls go on)
                if not failing:
                    log.warning("redis: %s: %s", type(e).__name__, e)
                failing = True
                await asyncio.sleep(1.0)
                continue
            failing = False
            if message is not None:
                self._wakeup.set()

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), POLL_S)
            self._wakeup.clear()
            if self.admission.queue_length:
                try:
                    await self.beat()
                except Exception as e:  # (redis' own errors): try again at the next poll
                    log.warning("redis: %s: %s", type(e).__name__, e)


def connect(url: str) -> Any:
    """An asyncio Redis client for ``url``; ``UsageError`` without the ``redis`` extra."""
    try:
        import redis.asyncio
    except ImportError:
        raise UsageError("[redis] needs the redis client: pip install 'inferlab[redis]'") from None
    return redis.asyncio.Redis.from_url(url)
