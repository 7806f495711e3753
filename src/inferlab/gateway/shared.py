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
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from inferlab._errors import UsageError
from inferlab.gateway.cache import Answer, Entry
from inferlab.gateway.config import KeyConfig
from inferlab.gateway.ratelimit import Limited

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


def connect(url: str) -> Any:
    """An asyncio Redis client for ``url``; ``UsageError`` without the ``redis`` extra."""
    try:
        import redis.asyncio
    except ImportError:
        raise UsageError("[redis] needs the redis client: pip install 'inferlab[redis]'") from None
    return redis.asyncio.Redis.from_url(url)
