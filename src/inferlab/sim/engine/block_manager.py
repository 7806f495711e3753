"""Paged KV-cache block manager with prefix caching (vLLM V1 semantics): the plain reference.

The cache is ``num_blocks`` blocks of ``block_size`` tokens; a request holds a list of
them, in token order. The policy:

- A full block is identified by a hash chained over the previous block's hash and its
  token ids (``hash_blocks``), so equal hashes mean equal prefixes. Blocks of generated
  tokens are registered when the request is preempted or ends (``cache_generated``).
  Where the engine knows what the model writes (``GeneratedTokens``: the simulated
  server's answer text) they are hashed by content, as vLLM hashes them, so a later
  prompt that holds the answer (the next turn of a conversation) hits them; otherwise
  they are hashed with the request's salt, and only that request, recomputing after a
  preemption, can hit them.
- Blocks carry reference counts: a cached prefix is shared by every request that has it.
- A block whose count drops to zero goes to the back of the free queue but keeps its
  hash: until it is reused (least recently freed first, which evicts the hash) a later
  request with the same prefix can claim it again.
- A request's blocks are freed tail first, so a prefix's head outlives its tail.
- ``evict_unhashed_first`` (vLLM from 0.24 on, with prefix caching): a freed block that
  is not full of computed tokens (a partly filled tail; vLLM gives it no hash) goes to
  the *front* of the free queue instead, to be reused before any cached block. Full
  blocks are the ones vLLM hashes, generated ones included (this manager registers
  those only on preemption: the position in the queue is the same either way).
- Prefix-cache counters (``prefix_queries_tokens``, ``prefix_hits_tokens``) count a
  request's first allocation; a preempted request's re-admission counts apart
  (``preempted_queries_tokens``, ``preempted_hits_tokens``), as vLLM's do.

``kvcache.KVCacheManager`` is the same manager with fast paths (the engine's); it is
tested against this one operation by operation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

_ROOT_HASH = 0  # the "previous hash" of a sequence's first block


def hash_blocks(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block has none)."""
    hashes: list[int] = []
    prev = _ROOT_HASH
    # one iterator zipped with itself: each full block as a tuple, built in C (a
    # trailing partial block is dropped)
    for block in zip(*[iter(token_ids)] * block_size, strict=False):
        prev = hash((prev, block))
        hashes.append(prev)
    return hashes


@dataclass(frozen=True)
class GeneratedTokens:
    """What a request's generated tokens are, for hashing their blocks by content: the
    prompt's length, the ids of its trailing partial block (``tail``: the first generated
    block begins with them) and the id of output token ``k`` (``token(k)``)."""

    prompt_len: int
    tail: tuple[int, ...]
    token: Callable[[int], int]

    def ids(self, start: int, end: int) -> list[int]:
        """The ids at positions ``start`` to ``end`` (exclusive) of prompt and output
        together (``start`` at or after the tail's first position)."""
        p = self.prompt_len
        first = p - len(self.tail)
        if start < first:
            raise ValueError(f"position {start} is before the prompt's trailing block (at {first})")
        head = list(self.tail[start - first : end - first]) if start < p else []
        return head + list(map(self.token, range(max(start, p) - p, end - p)))


def extend_generated_hashes(req: KVRequest, num_computed_tokens: int, block_size: int) -> None:
    """Append to ``req.block_hashes`` the hashes of its full blocks of generated tokens
    among its first ``num_computed_tokens``, chained on the prompt's: by content where
    ``req.generated`` says what they are, else salted with ``req.hash_salt``."""
    hashes = req.block_hashes
    gen = req.generated
    start, end = len(hashes), num_computed_tokens // block_size
    if gen is None:
        for i in range(start, end):
            hashes.append(hash((hashes[i - 1] if i else _ROOT_HASH, -1 - req.hash_salt, i)))
    elif end > start:
        # as ``hash_blocks`` chains them, from the last block hashed on
        prev = hashes[-1] if hashes else _ROOT_HASH
        for block in zip(*[iter(gen.ids(start * block_size, end * block_size))] * block_size, strict=False):
            prev = hash((prev, block))
            hashes.append(prev)


class KVRequest(Protocol):
    """What a block manager reads and updates on a request."""

    block_ids: list[int]  # the request's blocks, in token order
    block_hashes: list[int]  # chained hashes of its full blocks known so far
    num_cached_blocks: int  # leading blocks already registered in the prefix cache
    hash_salt: int  # makes hashes of blocks holding generated tokens unique to the request
    generated: GeneratedTokens | None  # what it generates, if known: its blocks hashed by content
    num_computed_tokens: int  # tokens whose KV is in its blocks (the rest: a partly filled tail)
    num_preemptions: int  # times it was preempted (a re-admission's lookups count apart)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far."""
        ...


class BlockManager:
    """Allocates blocks to requests; finds, shares and evicts cached prefix blocks.

    Every block is either free (count 0, in ``free_queue``) or in use (count > 0)."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
        evict_unhashed_first: bool = False,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one token ({num_blocks=}, {block_size=})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # (without prefix caching no block is ever hit: the order is not observable)
        self.evict_unhashed_first = evict_unhashed_first and enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks  # the prefix a block holds
        self.cached: dict[int, int] = {}  # prefix hash -> the block holding it
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.preempted_queries_tokens = 0
        self.preempted_hits_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks not referenced by any request (some may still hold a cached prefix)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by requests, 0..1 (vLLM's ``kv_cache_usage``)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def lookup(self, req: KVRequest) -> list[int]:
        """Blocks of the longest cached prefix of ``req``'s full blocks; changes nothing.
        The last token is never covered (the model must compute at least one token to
        produce logits), so at most ``(num_tokens - 1) // block_size`` blocks come back."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for h in req.block_hashes[: (req.num_tokens - 1) // self.block_size]:
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        return hits

    def num_free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cached ones, from ``lookup``) sit in the free queue."""
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    def can_allocate(self, req: KVRequest, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Whether ``allocate(req, num_tokens, cached)`` would succeed now: the new blocks,
        plus the ``cached`` ones sitting in the free queue, are free."""
        num_new = -(-num_tokens // self.block_size) - len(req.block_ids) - len(cached)
        return num_new <= len(self.free_queue) - self.num_free_among(cached)  # (cached but free)

    def allocate(self, req: KVRequest, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Give ``req`` blocks for its first ``num_tokens`` tokens, claiming ``cached``
        (from ``lookup``) first when it has no blocks yet; register the prefix hashes of
        the blocks that are now full. Returns False and changes nothing when there are not
        enough free blocks. A request's first allocation counts a prefix-cache query of
        ``req.num_tokens`` tokens with ``len(cached) * block_size`` hits (after a
        preemption: in the ``preempted_`` counters)."""
        if not self.can_allocate(req, num_tokens, cached):
            return False
        num_new = -(-num_tokens // self.block_size) - len(req.block_ids) - len(cached)
        if not req.block_ids and self.enable_prefix_caching:
            if req.num_preemptions:
                self.preempted_queries_tokens += req.num_tokens
                self.preempted_hits_tokens += len(cached) * self.block_size
            else:
                self.prefix_queries_tokens += req.num_tokens
                self.prefix_hits_tokens += len(cached) * self.block_size
        for b in cached:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
            req.block_ids.append(b)
        if cached:
            req.num_cached_blocks = len(cached)
        for _ in range(num_new):
            req.block_ids.append(self._take_free_block())
        self._register(req, num_tokens)
        return True

    def append_block(self, req: KVRequest) -> bool:
        """One more block at the end of ``req``'s (a decode's next token starts it); False,
        changing nothing, when no block is free."""
        if not self.free_queue:
            return False
        req.block_ids.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        """The least recently freed block, now held once; its cached prefix is evicted."""
        b, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[b]
        if h is not None:
            del self.cached[h]
            self.block_hash[b] = None
        self.ref_counts[b] = 1
        return b

    def _register(self, req: KVRequest, num_tokens: int) -> None:
        """Register the hashes of ``req``'s blocks that ``num_tokens`` tokens fill, as far
        as their hashes are known. A prefix already cached in another block (computed
        twice at once) stays with that block."""
        if not self.enable_prefix_caching:
            return
        start = req.num_cached_blocks
        end = min(num_tokens // self.block_size, len(req.block_hashes))
        for i in range(start, end):
            h, b = req.block_hashes[i], req.block_ids[i]
            if h not in self.cached:
                self.cached[h] = b
                self.block_hash[b] = h
        req.num_cached_blocks = max(start, end)

    def cache_generated(self, req: KVRequest, num_computed_tokens: int) -> None:
        """Register ``req``'s full blocks of generated tokens (before it is preempted or
        freed), hashed as ``extend_generated_hashes`` says. (vLLM registers every full
        block as it fills; a prompt can hold an answer only once it was delivered, so
        registering them at the end gives the same hits, but for a request recomputing
        after a preemption, which finds an identical request's answer only once that
        one has ended.)"""
        if not self.enable_prefix_caching:
            return
        extend_generated_hashes(req, num_computed_tokens, self.block_size)
        self._register(req, num_computed_tokens)

    def free(self, req: KVRequest) -> None:
        """Release ``req``'s blocks, tail first; freed blocks keep their hash. With
        ``evict_unhashed_first``, those not full of computed tokens go to the front of the
        free queue (in that order), the others to the back. Raises ``RuntimeError`` on a
        double free."""
        full = req.num_computed_tokens // self.block_size
        front: list[int] = []
        for i in reversed(range(len(req.block_ids))):
            b = req.block_ids[i]
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed twice")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.evict_unhashed_first and i >= full:
                    front.append(b)
                else:
                    self.free_queue[b] = None
        for b in reversed(front):  # (the first freed ends up first)
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)
        req.block_ids = []
        req.num_cached_blocks = 0

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless free/used accounting and the hash index agree."""
        for b, count in enumerate(self.ref_counts):
            assert count >= 0 and (count == 0) == (b in self.free_queue), (b, count)
        assert all(self.block_hash[b] == h for h, b in self.cached.items())
        assert sum(h is not None for h in self.block_hash) == len(self.cached)
