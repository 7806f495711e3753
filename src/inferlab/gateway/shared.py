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

Admission (``SharedAdmission``): each upstream's tokens and requests in flight, as
hashes of one field per instance (what that instance holds there), keyed by the
upstream's URL, so every instance with the same upstream counts against one budget.
An instance's calls (take room, give it back, renew) go in batches, one Lua script a
batch and one batch at a time, and each batch writes the instance's fields whole from
its own count (nothing it sends races its own fields; one lost or late is right again
after the next). A take sums the other instances' fields and charges this one's only if
the request fits (the rule of ``Admission.fits``), so no two instances can take the
same room; and not while another instance's request has waited past starvation and
longer than this one (each batch says in Redis since when this instance's oldest
request waits), so room is held for it as within one instance. An instance is alive
while its lease key is (renewed every third of ``lease_s``); a script that finds a
field whose instance has no lease deletes it, so an instance that dies mid-stream holds
its room at most ``lease_s`` longer. A batch that gives room back publishes on a
channel; an instance with requests waiting reads the others' counts when told (and
every ``POLL_S`` while any wait), and lets in what now fits. An epoch key tells a Redis
that lost its data (restarted empty): the first script to find it gone, for an instance
that had seen it, holds all room for ``lease_s / 2``, while every live instance writes
its fields again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from inferlab._errors import UsageError
from inferlab.gateway.admission import Admission, Ticket
from inferlab.gateway.cache import Answer, Entry
from inferlab.gateway.config import KeyConfig
from inferlab.gateway.ratelimit import Limited

log = logging.getLogger("inferlab.gateway")


class Outage:
    """Says that Redis fails once, not once a call (a Redis down under hundreds of
    requests a second wrote as many lines a second), and once more when it answers
    again. One per gateway, shared by everything that calls Redis."""

    def __init__(self) -> None:
        self.failing = False

    def failed(self, e: BaseException) -> None:
        if not self.failing:
            log.warning("redis: %s: %s (said once until it answers again; the requests refused meanwhile count in "
                        "inferlab_gateway_rejections_total{reason=\"redis_unavailable\"})", type(e).__name__, e)
        self.failing = True

    def answered(self) -> None:
        if self.failing:
            log.warning("redis: answers again")
        self.failing = False


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
-- the x-ratelimit-reset-* (ms): until the last charge has left the window, and until
-- every charged token has (RateLimiter.headers)
local function resets()
  local charges = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  if #charges == 0 then return 0, 0 end
  local held = tonumber(redis.call('GET', KEYS[3]) or '0')
  local tok = 0
  for i = 1, #charges, 2 do
    if held <= 0 then break end
    held = held - tonumber(redis.call('HGET', KEYS[2], charges[i]) or '0')
    if held <= 0 then tok = math.max(tonumber(charges[i + 1]) + window - now, 0) end
  end
  return math.max(tonumber(charges[#charges]) + window - now, 0), tok
end
local count = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
if rpm >= 0 and count + 1 > rpm then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, 'rpm', tonumber(first[2]) + window - now, count, used, resets()}
end
if tpm >= 0 and used + tokens > tpm then
  if tokens > tpm then return {0, 'too_large', -1, count, used, resets()} end
  local held = used
  local charges = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #charges, 2 do
    held = held - tonumber(redis.call('HGET', KEYS[2], charges[i]) or '0')
    if held + tokens <= tpm then return {0, 'tpm', tonumber(charges[i + 1]) + window - now, count, used, resets()} end
  end
  return {0, 'tpm', window, count, used, resets()}
end
redis.call('ZADD', KEYS[1], now, ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], tokens)
redis.call('INCRBY', KEYS[3], tokens)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], window * 2) end
return {1, 'ok', 0, count + 1, used + tokens, resets()}
"""

_CORRECT = """
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[3], tonumber(ARGV[2]) - tonumber(v))
return 1
"""

_REFUND = """
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DECRBY', KEYS[3], tonumber(v))
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
        self._refund = client.register_script(_REFUND)

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
        ok, why, wait_ms, count, used, reset_requests, reset_tokens = await self._reserve(
            keys=self._keys(key),
            args=[WINDOW_MS, -1 if key.rpm is None else key.rpm, -1 if key.tpm is None else key.tpm, tokens, charge],
        )
        why = why.decode() if isinstance(why, bytes) else str(why)
        headers = _headers(key, int(count), int(used), int(reset_requests), int(reset_tokens))
        if int(ok):
            return charge, headers
        if why == "too_large":
            raise Limited(f"request too large for key {key.name!r}: about {tokens} tokens, the limit is {key.tpm} "
                          "tokens per minute", None, headers)
        what = f"{key.rpm} requests" if why == "rpm" else f"{key.tpm} tokens"
        raise Limited(f"rate limit reached for key {key.name!r}: {what} per minute", max(int(wait_ms), 0) / 1000, headers)

    async def correct(self, key: KeyConfig, charge: str, input_tokens: int, output_tokens: int) -> None:
        await self._correct(keys=self._keys(key), args=[charge, self.counted(key, input_tokens, output_tokens)])

    async def refund(self, key: KeyConfig, charge: str) -> None:
        """Take the charge out of ``key``'s window, the request and its tokens
        (``RateLimiter.refund``)."""
        await self._refund(keys=self._keys(key), args=[charge])


def _headers(key: KeyConfig, count: int, used: int, reset_requests_ms: int, reset_tokens_ms: int) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers, as ``RateLimiter.headers`` writes them."""
    out: dict[str, str] = {}
    if key.rpm is not None:
        out |= {"x-ratelimit-limit-requests": str(key.rpm),
                "x-ratelimit-remaining-requests": str(max(key.rpm - count, 0)),
                "x-ratelimit-reset-requests": f"{reset_requests_ms / 1000:.3f}s"}
    if key.tpm is not None:
        out |= {"x-ratelimit-limit-tokens": str(key.tpm),
                "x-ratelimit-remaining-tokens": str(max(key.tpm - used, 0)),
                "x-ratelimit-reset-tokens": f"{reset_tokens_ms / 1000:.3f}s"}
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


# Admission: one script applies a batch of this instance's calls in order. KEYS: per
# upstream its tokens hash, its requests hash and its waiting hash (when each instance's
# oldest request waiting for that upstream began, by Redis's clock), then the epoch key
# and the resync key. ARGV: [1] this instance's id, [2] the lease keys' prefix (+ an id),
# [3] the lease (ms), [4] '1': this instance has seen the epoch key before, [5] the
# mode, [6] starvation (ms), then per upstream three values: this instance's tokens and
# requests there before the batch, and how long its oldest request waiting for it has
# waited (ms; -1: none); then the number of calls and five values each: kind (1 take,
# 2 give, 0 none), upstream (1-based), then for a take the tokens needed, how long its
# request has waited (ms), and the budget (tokens or requests, by the mode); for a give
# the tokens and the requests to add; then the channel told of room given back.
# Returns one result per call (take: 1 taken, 0 refused), then per upstream the other
# instances' tokens and requests and whether its room is held (1: for another instance's
# request that has waited longer than starvation, or while the counts are rebuilt).
_SYNC = """
local me, pre = ARGV[1], ARGV[2]
local n = (#KEYS - 2) / 3
local epoch, resync = KEYS[3 * n + 1], KEYS[3 * n + 2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
if redis.call('EXISTS', epoch) == 0 then
  redis.call('SET', epoch, '1')
  -- the counts were lost (a Redis restarted empty): hold all room until every live
  -- instance has written its own again (each renews every third of its lease)
  if ARGV[4] == '1' then redis.call('SET', resync, '1', 'PX', math.floor(lease / 2)) end
end
local rebuilding = redis.call('EXISTS', resync) == 1
redis.call('SET', pre .. me, '1', 'PX', lease)
local function others(key)
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
local function oldest(key)
  local f = redis.call('HGETALL', key)
  local first = nil
  for i = 1, #f, 2 do
    if f[i] ~= me then
      local since, written = string.match(f[i + 1], '(-?%d+),(%d+)')
      -- an entry not written again lately: its instance stopped saying (died, or lost Redis)
      if since and now - tonumber(written) <= WAITING_FRESH_MS and redis.call('EXISTS', pre .. f[i]) == 1 then
        since = tonumber(since)
        if first == nil or since < first then first = since end
      else redis.call('HDEL', key, f[i]) end
    end
  end
  return first
end
local starvation = tonumber(ARGV[6])
local mt, mr, ot, orq, starved = {}, {}, {}, {}, {}
for u = 1, n do
  local tk, rk, wk = KEYS[3 * u - 2], KEYS[3 * u - 1], KEYS[3 * u]
  mt[u], mr[u] = tonumber(ARGV[4 + 3 * u]), tonumber(ARGV[5 + 3 * u])
  local waited = tonumber(ARGV[6 + 3 * u])
  if waited >= 0 then redis.call('HSET', wk, me, (now - waited) .. ',' .. now) else redis.call('HDEL', wk, me) end
  ot[u], orq[u] = others(tk), others(rk)
  local first = oldest(wk)
  if first ~= nil and now - first >= starvation then starved[u] = first end
end
local i = 7 + 3 * n
local calls = tonumber(ARGV[i])
i = i + 1
local out = {}
local given = false
for k = 1, calls do
  local kind, u = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local a, b, c = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  i = i + 5
  local r = 1
  if kind == 1 then
    local ok
    if rebuilding or (starved[u] ~= nil and now - b > starved[u]) then
      ok = false
    elseif ARGV[5] == 'tokens' then
      local held = ot[u] + mt[u]
      ok = held == 0 or held + a <= c
    else
      ok = orq[u] + mr[u] < c
    end
    if ok then mt[u], mr[u] = mt[u] + a, mr[u] + 1 else r = 0 end
  elseif kind == 2 then
    mt[u], mr[u] = mt[u] + a, mr[u] + b
    if a < 0 or b < 0 then given = true end
  end
  out[#out + 1] = r
end
for u = 1, n do
  redis.call('HSET', KEYS[3 * u - 2], me, mt[u])
  redis.call('HSET', KEYS[3 * u - 1], me, mr[u])
  out[#out + 1] = ot[u]
  out[#out + 1] = orq[u]
  local mine = tonumber(ARGV[6 + 3 * u])
  local held = rebuilding or (starved[u] ~= nil and (mine < 0 or now - mine > starved[u]))
  out[#out + 1] = held and 1 or 0
end
if given then redis.call('PUBLISH', ARGV[i], 'given') end
return out
"""

#: How long an instance's word that a request of its waits counts without being said
#: again (an instance with requests waiting says it every ``POLL_S``).
WAITING_FRESH_MS = 1000
_SYNC = _SYNC.replace("WAITING_FRESH_MS", str(WAITING_FRESH_MS))

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

_NONE, _TAKE, _GIVE = 0, 1, 2


class SharedAdmission:
    """``admission``'s budgets counted across every instance that shares the Redis
    (module docstring): ``admission.shared`` while ``start``-ed. ``upstreams``: each
    upstream's URL, in the admission's order.

    This instance's calls go to Redis one batch at a time, in the order they were made
    (one script a batch: ``_SYNC``), and each batch writes this instance's counts whole
    from its own: nothing of its own races it, and a count Redis lost or got wrong is
    right again after the next batch. Calls made while a batch is out go in the next."""

    def __init__(self, client: Any, prefix: str, admission: Admission, upstreams: Sequence[str],
                 lease_s: float = 10.0, outage: Outage | None = None) -> None:
        self.client = client
        self.outage = outage or Outage()
        self.admission = admission
        self.id = uuid.uuid4().hex
        self.lease_ms = max(int(lease_s * 1000), 1)
        self._live = f"{prefix}admission:live:"
        self._channel = f"{prefix}admission:released"
        self._keys = [k for url in upstreams for k in (
            f"{prefix}admission:{url}:tokens", f"{prefix}admission:{url}:requests", f"{prefix}admission:{url}:waiting")]
        self._sync = client.register_script(_SYNC)
        self._leave = client.register_script(_LEAVE)
        self._batch_keys = [*self._keys, f"{prefix}admission:epoch", f"{prefix}admission:resync"]
        n = len(upstreams)
        # what this instance holds in the shared count: takes Redis granted, gives sent
        self.tokens = [0] * n
        self.requests = [0] * n
        self._calls: list[tuple[int, int, int, int, asyncio.Future[bool] | None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._seen_epoch = False  # (a batch found the epoch key: its loss means Redis lost the counts)
        self._waiting = False  # the last batch said a request of this instance waits
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._pubsub: Any = None

    def _send(self, kind: int, upstream: int, a: int, b: int, answer: bool) -> asyncio.Future[bool] | None:
        fut: asyncio.Future[bool] | None = asyncio.get_running_loop().create_future() if answer else None
        self._calls.append((kind, upstream, a, b, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return fut

    def _args(self, calls: list[tuple[int, int, int, int, asyncio.Future[bool] | None]]) -> list[Any]:
        """The batch's ARGV (``_SYNC``); counts the gives in it as sent."""
        a = self.admission
        now = a.clock.now_ns()
        args: list[Any] = [self.id, self._live, self.lease_ms, int(self._seen_epoch), a.mode,
                           int(a.starvation_ns // 1_000_000)]
        self._waiting = False
        for u in range(len(self.tokens)):
            since = a.oldest_waiting_ns(u)
            self._waiting |= since is not None
            args += [self.tokens[u], self.requests[u], -1 if since is None else (now - since) // 1_000_000]
        args.append(len(calls))
        for kind, u, x, y, _ in calls:
            if kind == _TAKE:
                args += [kind, u + 1, x, y, a.max_tokens[u] if a.mode == "tokens" else a.max_requests[u]]
            else:
                args += [kind, u + 1, x, y, 0]
            if kind == _GIVE:  # (counted as sent: the next batch writes the counts whole anyway)
                self.tokens[u] += x
                self.requests[u] += y
        args.append(self._channel)
        return args

    async def _flush(self) -> None:
        a = self.admission
        while self._calls:
            calls, self._calls = self._calls, []
            try:
                out = [int(v) for v in await self._sync(keys=self._batch_keys, args=self._args(calls))]
            except BaseException as e:
                for *_, fut in calls:
                    if fut is not None and not fut.done():
                        fut.set_exception(e if isinstance(e, Exception) else ConnectionError("the gateway is stopping"))
                if not isinstance(e, Exception):
                    raise
                self.outage.failed(e)
                continue
            self.outage.answered()
            self._seen_epoch = True
            for (kind, u, x, _, fut), ok in zip(calls, out[:len(calls)], strict=True):
                if kind == _TAKE and ok:
                    self.tokens[u] += x
                    self.requests[u] += 1
                if fut is not None and not fut.done():
                    fut.set_result(bool(ok))
            rest = out[len(calls):]
            for i in range(len(self.tokens)):
                a.others_tokens[i], a.others_requests[i], held = rest[3 * i:3 * i + 3]
                a.held[i] = bool(held)
            a.batches += 1
            a.regrant()

    async def take(self, ticket: Ticket) -> bool:
        u, need = ticket.upstream, ticket.tokens
        fut = self._send(_TAKE, u, need, ticket.queued_ns // 1_000_000, True)
        assert fut is not None
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:  # (the batch goes on: what it takes is given back)
            def back(f: asyncio.Future[bool]) -> None:
                if not f.cancelled() and f.exception() is None and f.result():
                    self.give(u, -need, -1)

            fut.add_done_callback(back)
            raise

    def give(self, upstream: int, tokens: int, requests: int) -> None:
        self._send(_GIVE, upstream, tokens, requests, False)

    def wake(self) -> None:
        self._wakeup.set()

    async def beat(self) -> None:
        """Renew the lease, say how long this instance's requests have waited, and read
        the others' counts (letting in what now fits), in the next batch; ``Exception``
        if Redis fails."""
        fut = self._send(_NONE, 0, 0, 0, True)
        assert fut is not None
        await asyncio.shield(fut)

    async def start(self) -> None:
        """Join: write this instance's (empty) counts and lease; then keep the lease and
        watch for room given back, until ``stop``."""
        await self.beat()
        self._pubsub = self.client.pubsub()
        await self._pubsub.subscribe(self._channel)
        self._tasks = [asyncio.create_task(self._keep()), asyncio.create_task(self._listen()),
                       asyncio.create_task(self._watch())]
        self.admission.shared = self

    async def stop(self) -> None:
        """Leave: stop the tasks, send what is left, take this instance's fields out."""
        self.admission.shared = None
        # The loops also end by the flag: on Python 3.11 a cancellation that races a
        # timeout (wait_for, get_message's) can be lost, and the loop would go on.
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
        if self._flusher is not None and not self._flusher.done():
            await asyncio.wait([self._flusher], timeout=STOP_WAIT_S)
            self._flusher.cancel()
        with contextlib.suppress(Exception):  # (what is not left here lapses with the lease)
            await asyncio.wait_for(self._leave(keys=self._keys, args=[self.id, self._live, self._channel]), STOP_WAIT_S)
        with contextlib.suppress(Exception):
            if self._pubsub is not None:
                await asyncio.wait_for(self._pubsub.aclose(), STOP_WAIT_S)

    async def _keep(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.lease_ms / 3000)
            with contextlib.suppress(Exception):  # (logged by the batch; the lease lapses if Redis stays away)
                await self.beat()

    async def _listen(self) -> None:
        failures = 0  # in a row
        while not self._stopping:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
            except Exception as e:  # (redis' own errors): listen again (polls go on meanwhile)
                failures += 1
                # A connection from before Redis restarted fails once though Redis is
                # back, and the next read (at once) connects anew: only a second failure
                # in a row is an outage, said through the gateway's one ``Outage`` (one
                # line whoever sees it first), once a run of them; then a read a second.
                if failures == 2:
                    self.outage.failed(e)
                if failures > 1:
                    await asyncio.sleep(1.0)
                continue
            failures = 0
            if message is not None:
                self._wakeup.set()

    async def _watch(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), POLL_S)
            self._wakeup.clear()
            # while requests wait, and once more after (to say none waits any more)
            if self.admission.queue_length or self._waiting:
                with contextlib.suppress(Exception):  # (logged by the batch): again at the next poll
                    await self.beat()


#: The longest a call to Redis (or connecting to it) may take before it fails: a Redis
#: that stopped answering (paused, or cut off) is then a 503 like one that refuses, not
#: a wait for ever (redis-py before 6 sets no timeout of its own).
TIMEOUT_S = 5.0


def connect(url: str) -> Any:
    """An asyncio Redis client for ``url``, its calls bounded by ``TIMEOUT_S`` (unless
    the URL sets its own); ``UsageError`` without the ``redis`` extra or for a URL
    redis-py does not take."""
    try:
        import redis.asyncio
    except ImportError:
        raise UsageError("[redis] needs the redis client: pip install 'inferlab[redis]'") from None
    try:
        return redis.asyncio.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    except ValueError as e:
        raise UsageError(f"[redis] url: {e}") from None
