"""The engine's paged KV-cache block manager: ``block_manager.BlockManager``'s policy
(vLLM V1 semantics, see there), with fast paths.

Same blocks, same hits, same free-queue order as the reference, operation by operation
(``tests/sim/engine/test_kvcache.py`` checks it); what differs is only how:

- the free queue is a list taken from the front in slices (``FreeQueue``); a cached block
  claimed from its middle leaves a stale entry, skipped later;
- evicting a reused block's prefix clears the block's hash only: the hash index keeps a
  stale entry, ignored on lookup (``_holder``) and pruned in bulk;
- prefix hashes are registered and unshared blocks freed in bulk, in C;
- a decode's next block (``append_block``) skips ``allocate``'s bookkeeping.

Invariants: every block is either free (count 0, in the free queue) or in use (count >
0); freeing a block that is not in use raises ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

from inferlab.sim.engine.block_manager import KVRequest, extend_generated_hashes, hash_blocks

__all__ = ["FreeQueue", "KVCacheManager", "hash_blocks"]  # (hash_blocks: the engine's import)


class FreeQueue:
    """Free block ids, least recently freed first, as an ``OrderedDict`` of them would
    keep them, but taken from the front in bulk (a list slice).

    A block claimed again from the middle (a cached prefix that hits) leaves lazily: its
    entry stays and is skipped when it reaches the front. A block's skipped entries are
    always older than its live one (it is claimed only while free, so all its entries
    are stale then; freeing it again appends the new live one), so a count of them per
    block is all the bookkeeping needed.

    Blocks put at the front (``prepend``) wait in a stack of their own, ahead of the list."""

    def __init__(self, num_blocks: int) -> None:
        self._ids = list(range(num_blocks))
        self._head = 0  # the queue is self._ids[self._head:], less the stale entries
        self._stale = [0] * num_blocks  # per block: its entries to skip
        self._num_stale = 0
        self._front: dict[int, None] = {}  # prepended blocks, the next to take last

    def __len__(self) -> int:
        return len(self._ids) - self._head - self._num_stale + len(self._front)

    def __iter__(self) -> Iterator[int]:
        """The free blocks, front first."""
        yield from reversed(self._front)
        stale = list(self._stale)
        for b in islice(self._ids, self._head, None):
            if stale[b]:
                stale[b] -= 1
            else:
                yield b

    def extend(self, blocks: list[int]) -> None:
        """``blocks`` (none in the queue) join at the back, in their order."""
        self._ids += blocks

    def prepend(self, blocks: list[int]) -> None:
        """``blocks`` (none in the queue) join at the front, in their order."""
        self._front.update(dict.fromkeys(reversed(blocks)))

    def remove(self, block: int) -> None:
        """Take ``block`` (in the queue) out, wherever it is."""
        if block in self._front:
            del self._front[block]
            return
        self._stale[block] += 1
        self._num_stale += 1

    def take(self, n: int) -> list[int]:
        """The ``n`` blocks at the front, out of the queue (``n <= len(self)``)."""
        if self._front:
            front = self._front
            first = [front.popitem()[0] for _ in range(min(n, len(front)))]
            return first + self.take(n - len(first)) if n > len(first) else first
        start = self._head
        taken = self._ids[start : start + n]
        if self._num_stale and any(map(self._stale.__getitem__, taken)):
            taken = self._take_skipping_stale(n)
        else:
            self._head = start + n
        if self._head > 1024 and 2 * self._head > len(self._ids):  # amortised O(1) per entry
            del self._ids[: self._head]
            self._head = 0
        return taken

    def take_one(self) -> int | None:
        """The block at the front, out of the queue; None when the queue is empty.
        (``take(1)`` without the list: a decode takes ~16 single blocks per request.)"""
        if self._front:
            return self._front.popitem()[0]
        ids, stale, i = self._ids, self._stale, self._head
        while i < len(ids):
            b = ids[i]
            i += 1
            if stale[b]:
                stale[b] -= 1
                self._num_stale -= 1
                continue
            self._head = i
            if i > 1024 and 2 * i > len(ids):  # amortised O(1) per entry, as in ``take``
                del ids[:i]
                self._head = 0
            return b
        self._head = i
        return None

    def _take_skipping_stale(self, n: int) -> list[int]:
        ids, stale, i = self._ids, self._stale, self._head
        taken: list[int] = []
        while len(taken) < n:
            b = ids[i]
            i += 1
            if stale[b]:
                stale[b] -= 1
                self._num_stale -= 1
            else:
                taken.append(b)
        self._head = i
        return taken


class KVCacheManager:
    """Allocates blocks to requests; finds, shares and evicts cached prefix blocks: the
    methods of ``BlockManager``, with the same contracts."""

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
        self._ref_counts = [0] * num_blocks
        # block id -> the prefix hash it holds (None or absent: none). Taking a block
        # for new content only clears this: ``_cached``'s entry for its old hash is left
        # behind, stale, and ignored (``_holder``) until pruned in bulk. (Eviction is
        # one store instead of three dict operations, for every block of every prompt.)
        self._block_hash: dict[int, int | None] = {}
        self._cached: dict[int, int] = {}  # hash -> block id holding that prefix, or stale
        self._free = FreeQueue(num_blocks)
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.preempted_queries_tokens = 0
        self.preempted_hits_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks not referenced by any request (some may still hold a cached prefix)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by requests, 0..1 (vLLM's ``kv_cache_usage``)."""
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, req: KVRequest) -> list[int]:
        """Blocks of the longest cached prefix of ``req``'s full blocks; changes nothing.

        The last token is never covered (the model must compute at least one token to
        produce logits), so at most ``(num_tokens - 1) // block_size`` blocks come back.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for h in req.block_hashes[: (req.num_tokens - 1) // self.block_size]:
            block = self._holder(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _holder(self, h: int) -> int | None:
        """The block holding the prefix hashed ``h``, if any."""
        block = self._cached.get(h)
        if block is None or self._block_hash.get(block) != h:
            return None  # (never cached, or its block was taken since: evicted)
        return block

    def num_free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (cached ones, from ``lookup``) sit in the free queue."""
        ref = self._ref_counts
        return sum(1 for b in blocks if ref[b] == 0)

    def can_allocate(self, req: KVRequest, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Whether ``allocate(req, num_tokens, cached)`` would succeed now."""
        num_new = -(-num_tokens // self.block_size) - len(req.block_ids) - len(cached)
        if num_new <= 0 and not cached:
            return True
        return num_new <= len(self._free) - self.num_free_among(cached)  # (cached but free)

    def allocate(self, req: KVRequest, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Give ``req`` blocks for its first ``num_tokens`` tokens, claiming ``cached``
        (from ``lookup``) first when it has no blocks yet.

        Returns False and changes nothing when there are not enough free blocks. A
        request's first allocation counts a prefix-cache query of ``req.num_tokens``
        tokens with ``len(cached) * block_size`` hits (after a preemption: in the
        ``preempted_`` counters).
        """
        block_ids = req.block_ids
        bs = self.block_size
        num_new = -(-num_tokens // bs) - len(block_ids) - len(cached)
        if num_new <= 0 and not cached:
            if req.num_cached_blocks < min(num_tokens // bs, len(req.block_hashes)) and self.enable_prefix_caching:
                self._cache_full_blocks(req, num_tokens)
            return True
        ref = self._ref_counts
        reclaimable = sum(1 for b in cached if ref[b] == 0)  # cached but sitting in free queue
        if num_new > len(self._free) - reclaimable:
            return False
        if not block_ids and self.enable_prefix_caching:
            if req.num_preemptions:
                self.preempted_queries_tokens += req.num_tokens
                self.preempted_hits_tokens += len(cached) * bs
            else:
                self.prefix_queries_tokens += req.num_tokens
                self.prefix_hits_tokens += len(cached) * bs
        for b in cached:
            if ref[b] == 0:
                self._free.remove(b)
            ref[b] += 1
            block_ids.append(b)
        if cached:
            req.num_cached_blocks = len(cached)
        if num_new > 0:
            block_ids += self._take_free_blocks(num_new)
        if self.enable_prefix_caching and req.num_cached_blocks < len(req.block_hashes):
            self._cache_full_blocks(req, num_tokens)
        return True

    def append_block(self, req: KVRequest) -> bool:
        """One more block at the end of ``req``'s: ``allocate`` for a decode whose next
        token starts a new block (its prompt blocks already registered), without the
        general bookkeeping. False, changing nothing, when no block is free."""
        b = self._free.take_one()
        if b is None:
            return False
        self._block_hash[b] = None  # (``_take_free_blocks`` for one block)
        self._ref_counts[b] = 1
        req.block_ids.append(b)
        return True

    def _take_free_blocks(self, n: int) -> list[int]:
        """The ``n`` least recently freed blocks, now held once each; their cached
        prefixes are evicted. The caller has checked that ``n`` are free."""
        taken = self._free.take(n)
        block_hash, ref = self._block_hash, self._ref_counts
        for b in taken:
            block_hash[b] = None  # evicts its prefix (see ``__init__``)
            ref[b] = 1
        return taken

    def _cache_full_blocks(self, req: KVRequest, num_tokens: int) -> None:
        """Register the hashes of ``req``'s blocks that ``num_tokens`` tokens fill, as far
        as their hashes are known (the prompt's; generated blocks: ``cache_generated``)."""
        hashes, start = req.block_hashes, req.num_cached_blocks
        end = min(num_tokens // self.block_size, len(hashes))
        cached, block_hash = self._cached, self._block_hash
        new_hashes, blocks = hashes[start:end], req.block_ids[start:end]
        if cached.keys().isdisjoint(new_hashes):  # the common case, in C: none seen before
            # (one request's hashes are distinct: equal hashes mean equal prefixes)
            cached.update(zip(new_hashes, blocks, strict=True))
            block_hash.update(zip(blocks, new_hashes, strict=True))
        else:
            for h, block in zip(new_hashes, blocks, strict=True):
                if self._holder(h) is None:  # a duplicate computed concurrently stays unregistered
                    cached[h] = block
                    block_hash[block] = h
        req.num_cached_blocks = max(start, end)
        if len(cached) > 4 * self.num_blocks:  # stale entries pruned (amortised O(1): >= 3x as many added between)
            self._cached = {h: b for b, h in block_hash.items() if h is not None}

    def cache_generated(self, req: KVRequest, num_computed_tokens: int) -> None:
        """Register ``req``'s full blocks of generated tokens (before it is preempted or
        freed): hashed by content where ``req.generated`` says what they are (a later
        prompt holding the answer hits them), else with the request's salt (only it,
        recomputing, can). vLLM registers every full block as it fills; a prompt can
        hold an answer only once it was delivered, so registering them now gives the
        same hits (but for a request recomputing after a preemption, which finds an
        identical request's answer only once that one has ended)."""
        if not self.enable_prefix_caching:
            return
        extend_generated_hashes(req, num_computed_tokens, self.block_size)
        self._cache_full_blocks(req, num_computed_tokens)

    def free(self, req: KVRequest) -> None:
        """Release ``req``'s blocks, tail first so a prefix's head outlives its tail.

        Freed blocks keep their hash. With ``evict_unhashed_first`` those not full of
        computed tokens go to the front of the free queue. Raises ``RuntimeError`` on a
        double free.
        """
        if self.evict_unhashed_first:
            full = req.num_computed_tokens // self.block_size
            if full < len(req.block_ids):
                self._free_split(req, full)
                return
        ref, freed = self._ref_counts, []
        blocks = req.block_ids[::-1]
        if list(map(ref.__getitem__, blocks)).count(1) == len(blocks):
            # the common case, no block shared with another request: all of them are
            # freed (the per-block loop below, with its checks done in C)
            for b in blocks:
                ref[b] = 0
            self._free.extend(blocks)
            req.block_ids = []
            req.num_cached_blocks = 0
            return
        try:
            for b in blocks:
                if ref[b] <= 0:
                    raise RuntimeError(f"block {b} freed twice")
                ref[b] -= 1
                if ref[b] == 0:
                    freed.append(b)
        finally:
            self._free.extend(freed)
        req.block_ids = []
        req.num_cached_blocks = 0

    def _free_split(self, req: KVRequest, full: int) -> None:
        """``free`` with blocks from index ``full`` on (not full) to the front."""
        ref, back, front = self._ref_counts, list[int](), list[int]()
        blocks = req.block_ids
        try:
            for i in range(len(blocks) - 1, -1, -1):
                b = blocks[i]
                if ref[b] <= 0:
                    raise RuntimeError(f"block {b} freed twice")
                ref[b] -= 1
                if ref[b] == 0:
                    (front if i >= full else back).append(b)
        finally:
            self._free.prepend(front)
            self._free.extend(back)
        req.block_ids = []
        req.num_cached_blocks = 0

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless free/used accounting and the hash index agree."""
        used = sum(1 for r in self._ref_counts if r > 0)
        assert used + len(self._free) == self.num_blocks, (used, len(self._free))
        assert all(r >= 0 for r in self._ref_counts)
        free = list(self._free)
        assert len(free) == len(set(free)) == len(self._free), "a block is in the free queue twice"
        assert all(self._ref_counts[b] == 0 for b in free)
        for b, h in self._block_hash.items():
            assert h is None or self._cached[h] == b, (h, b)
