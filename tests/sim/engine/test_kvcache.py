import random
from collections import OrderedDict

import pytest

from inferlab.sim.engine.block_manager import BlockManager, GeneratedTokens
from inferlab.sim.engine.kvcache import FreeQueue, KVCacheManager, hash_blocks

BS = 16


class Req:
    """The minimal request the block manager works on."""

    def __init__(self, tokens: list[int], salt: int = 0) -> None:
        self.tokens = tokens
        self.block_ids: list[int] = []
        self.block_hashes = hash_blocks(tokens, BS)
        self.num_cached_blocks = 0
        self.hash_salt = salt
        self.generated: GeneratedTokens | None = None  # (the engine sets it when it knows the answer)
        self.num_computed_tokens = len(tokens)  # (as the scheduler has it when it frees)
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


# the policy tests run on both block managers: the engine's and the plain reference
Manager = type[KVCacheManager] | type[BlockManager]


@pytest.fixture(params=[KVCacheManager, BlockManager], ids=["fast", "reference"])
def manager(request: pytest.FixtureRequest) -> Manager:
    cls: Manager = request.param
    return cls


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_hashes_are_chained_over_full_blocks_only() -> None:
    a = hash_blocks(toks(40), BS)
    assert len(a) == 2  # the 8-token tail has no hash
    assert hash_blocks(toks(32), BS) == a
    b = hash_blocks([999, *toks(39, 1)], BS)  # first block differs...
    assert b[0] != a[0] and b[1] != a[1]  # ...so every later block differs too


def test_hashes_are_those_of_the_block_tuples() -> None:
    ids = toks(50, 7)
    expected, prev = [], 0
    for start in range(0, 48, BS):
        prev = hash((prev, tuple(ids[start : start + BS])))
        expected.append(prev)
    assert hash_blocks(ids, BS) == expected
    assert hash_blocks(ids[:15], BS) == []


def test_free_queue_keeps_the_order_of_an_ordered_dict() -> None:
    # the order blocks are reused in decides which cached prefixes are evicted: it must
    # be exactly least recently freed first, with claimed blocks taken out of the middle
    # (FreeQueue.remove) and blocks freed together queued in their order
    rng = random.Random(3)
    for _ in range(100):
        n = rng.randint(1, 40)
        queue, model = FreeQueue(n), OrderedDict.fromkeys(range(n))
        used: list[int] = []
        for _ in range(rng.randint(1, 2000)):  # (long enough to compact the list)
            op = rng.random()
            if op < 0.3 and model:
                k = rng.randint(1, len(model))
                taken = queue.take(k)
                assert taken == [model.popitem(last=False)[0] for _ in range(k)]
                used += taken
            elif op < 0.4:
                one = queue.take_one()
                assert one == (model.popitem(last=False)[0] if model else None)
                if one is not None:
                    used.append(one)
            elif op < 0.7 and model:
                b = rng.choice(list(model))
                queue.remove(b)
                del model[b]
                used.append(b)
            elif used:
                freed = [used.pop(rng.randrange(len(used))) for _ in range(rng.randint(1, len(used)))]
                queue.extend(freed)
                model.update(dict.fromkeys(freed))
            assert len(queue) == len(model) and list(queue) == list(model)


def test_allocate_free_and_usage(manager: Manager) -> None:
    kv = manager(10, BS)
    r = Req(toks(33))
    assert kv.allocate(r, 33)
    assert len(r.block_ids) == 3
    assert kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)
    kv.free(r)
    assert kv.num_free_blocks == 10 and r.block_ids == []
    kv.check_invariants()


def test_allocation_that_does_not_fit_changes_nothing(manager: Manager) -> None:
    kv = manager(4, BS)
    r = Req(toks(100))
    assert not kv.allocate(r, 100)
    assert r.block_ids == [] and kv.num_free_blocks == 4
    assert kv.prefix_queries_tokens == 0


def test_double_free_raises(manager: Manager) -> None:
    kv = manager(4, BS)
    r = Req(toks(20))
    kv.allocate(r, 20)
    ids = list(r.block_ids)
    kv.free(r)
    r.block_ids = ids
    with pytest.raises(RuntimeError, match="twice"):
        kv.free(r)


def test_freed_prefix_hits_and_last_token_is_never_cached(manager: Manager) -> None:
    kv = manager(20, BS)
    a = Req(toks(100))
    kv.allocate(a, 100)
    kv.free(a)
    b = Req(toks(100))
    hits = kv.lookup(b)
    assert len(hits) == 6  # 6 full blocks; the 7th is partial
    assert kv.allocate(b, 100, hits)
    assert b.block_ids[:6] == hits
    assert kv.prefix_hits_tokens == 96 and kv.prefix_queries_tokens == 200
    # exactly two full blocks: the last token must be recomputed, so only one block hits
    c, d = Req(toks(32, 5000)), Req(toks(32, 5000))
    kv.allocate(c, 32)
    assert len(kv.lookup(d)) == 1


def test_live_blocks_are_shared_with_reference_counts(manager: Manager) -> None:
    kv = manager(20, BS)
    a, b = Req([*toks(64), 1]), Req([*toks(64), 2])
    kv.allocate(a, 65)
    used = 20 - kv.num_free_blocks
    hits = kv.lookup(b)
    assert len(hits) == 4
    kv.allocate(b, 65, hits)
    assert 20 - kv.num_free_blocks == used + 1  # only b's own last block is new
    kv.free(a)
    assert kv.lookup(Req([*toks(64), 3])) == hits  # still referenced by b
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == 20


def test_reuse_is_least_recently_freed_first_and_evicts_the_tail_first(manager: Manager) -> None:
    kv = manager(8, BS)
    a = Req([*toks(64), 7])  # 5 blocks, 4 of them full and hashed
    kv.allocate(a, 65)
    kv.free(a)  # free queue: 5,6,7 (never used), then a's blocks tail first
    b = Req(toks(80, 10_000))
    assert kv.allocate(b, 80)  # takes 5,6,7, a's partial tail block and a's 4th block
    again = Req([*toks(64), 7])
    assert len(kv.lookup(again)) == 3  # a's 4th block was evicted, its head survives
    kv.free(b)
    kv.check_invariants()


def test_generated_blocks_are_salted_per_request(manager: Manager) -> None:
    kv = manager(20, BS)
    a, b = Req(toks(8), salt=1), Req(toks(8), salt=2)
    for r in (a, b):
        r.tokens += toks(24, 100)  # "generated" tokens the engine has no ids for
        r.block_hashes = hash_blocks(toks(8), BS)  # no prompt block is full
        kv.allocate(r, 32)
    assert kv.lookup(a) == []  # nobody else can hit them: registered only on preemption
    for r in (a, b):
        kv.cache_generated(r, 32)  # the scheduler preempts them
    assert len(a.block_hashes) == 2 and a.block_hashes != b.block_hashes
    kv.free(a)
    assert len(kv.lookup(a)) == 1  # a can reuse its own generated block after preemption


def test_generated_blocks_known_by_content_are_hit_by_the_next_turn(manager: Manager) -> None:
    # a conversation: turn 1's prompt (40 tokens) and its 60-token answer, whose ids the
    # engine knows; turn 2's prompt is both and 30 tokens more
    answer = toks(60, 500)
    kv = manager(20, BS)
    first = Req(toks(40))
    first.generated = GeneratedTokens(40, tuple(toks(40)[32:]), answer.__getitem__)
    first.tokens += answer
    kv.allocate(first, 99)  # every token's KV but the last one's (never computed)
    kv.cache_generated(first, 99)
    # the hashes are those of the whole sequence's blocks, as vLLM computes them
    assert first.block_hashes == hash_blocks(toks(40) + answer, BS)[:6]
    kv.free(first)
    second = Req(toks(40) + answer + toks(30, 900))
    assert len(kv.lookup(second)) == 6  # 96 of its 130 tokens: all the full blocks turn 1 computed
    other = Req(toks(40) + toks(60, 700) + toks(30, 900))  # another answer: only the prompt hits
    assert len(kv.lookup(other)) == 2


def test_random_workload_never_leaks_or_double_frees(manager: Manager) -> None:
    rng = random.Random(1234)
    kv = manager(64, BS)
    prefixes = [toks(rng.randint(0, 80), 1000 * i) for i in range(4)]
    live: list[tuple[Req, int]] = []
    salt = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.4:
            salt += 1
            r = Req(rng.choice(prefixes) + toks(rng.randint(1, 60), 100_000 + salt * 100), salt)
            hits = kv.lookup(r)
            n = len(hits) * BS + rng.randint(1, r.num_tokens - len(hits) * BS)
            if kv.allocate(r, n, hits):
                live.append((r, n))
        elif op < 0.75 and live:
            i = rng.randrange(len(live))
            r, n = live[i]
            grown = min(r.num_tokens, n + rng.randint(1, 20))
            if kv.allocate(r, grown):
                live[i] = (r, grown)
        elif live:
            r, _ = live.pop(rng.randrange(len(live)))
            kv.free(r)
        kv.check_invariants()
        in_use = {b for r, _ in live for b in r.block_ids}
        assert len(in_use) + kv.num_free_blocks == kv.num_blocks
    assert kv.prefix_hits_tokens > 0
    for r, _ in live:
        kv.free(r)
    kv.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks and kv.usage == 0.0


@pytest.mark.parametrize("unhashed_first", [False, True])
def test_fast_paths_match_the_reference_block_manager(unhashed_first: bool) -> None:
    # the same random operations on twin requests: every block id, hit, refusal and the
    # free queue's order must agree (bulk takes, one-block takes, frees with and without
    # shared blocks, registration in bulk and one by one, salted generated blocks; with
    # unhashed blocks put at the front, partly filled tails freed)
    for seed in range(30):
        rng = random.Random(seed)
        num_blocks = rng.randint(8, 120)
        kv = KVCacheManager(num_blocks, BS, evict_unhashed_first=unhashed_first)
        ref = BlockManager(num_blocks, BS, evict_unhashed_first=unhashed_first)
        prefixes = [toks(rng.randint(0, 100), 1000 * i) for i in range(rng.randint(1, 5))]
        live: list[tuple[Req, Req, int]] = []  # (fast, simple, tokens allocated)
        for salt in range(1, 1500):  # (long enough to prune stale hashes)
            op = rng.random()
            if op < 0.3:
                tokens = rng.choice(prefixes) + toks(rng.randint(1, 70), 100_000 + salt * 100)
                a, b = Req(tokens, salt), Req(list(tokens), salt)
                hits = kv.lookup(a)
                assert hits == ref.lookup(b)
                n = len(hits) * BS + rng.randint(1, a.num_tokens - len(hits) * BS)
                assert kv.can_allocate(a, n, hits) == ref.can_allocate(b, n, hits)
                ok = kv.allocate(a, n, hits)
                assert ok == ref.allocate(b, n, hits)
                if ok:
                    a.num_computed_tokens = b.num_computed_tokens = n
                    live.append((a, b, n))
            elif op < 0.55 and live:
                i = rng.randrange(len(live))
                a, b, n = live[i]
                if rng.random() < 0.5 and n % BS == 0:  # a decode starting a block
                    ok = kv.append_block(a)
                    assert ok == ref.append_block(b)
                    grown = n + 1
                else:
                    grown = min(a.num_tokens, n + rng.randint(1, 20))
                    ok = kv.allocate(a, grown)
                    assert ok == ref.allocate(b, grown)
                if ok:
                    a.num_computed_tokens = b.num_computed_tokens = grown
                    live[i] = (a, b, grown)
            elif op < 0.65 and live:  # preempted: generated blocks registered, then freed
                a, b, n = live.pop(rng.randrange(len(live)))
                kv.cache_generated(a, n)
                ref.cache_generated(b, n)
                kv.free(a)
                ref.free(b)
            elif live:
                a, b, _ = live.pop(rng.randrange(len(live)))
                kv.free(a)
                ref.free(b)
            for a, b, _ in live:
                assert a.block_ids == b.block_ids and a.num_cached_blocks == b.num_cached_blocks
            assert list(kv._free) == list(ref.free_queue)
            # the prefixes the cache can hit (``_cached`` may also hold stale entries)
            assert {h: b for b, h in kv._block_hash.items() if h is not None} == ref.cached
            assert all(kv._holder(h) == b for h, b in ref.cached.items())
            kv.check_invariants()


def test_unhashed_blocks_go_to_the_front_hashed_ones_to_the_back(manager: Manager) -> None:
    # vLLM's free queue: a partly filled tail (no hash) is reused first, full blocks wait
    # at the back (least recently freed first), so cached prefixes live longer
    for unhashed_first in (True, False):
        kv = manager(4, BS, evict_unhashed_first=unhashed_first)
        c, a = Req(toks(16, 5000)), Req(toks(40))  # one full block; two and a tail of 8
        assert kv.allocate(c, 16) and kv.allocate(a, 40)
        kv.free(c)
        kv.free(a)
        tail = 3  # (c took block 0, a blocks 1 to 3)
        if unhashed_first:
            assert _free_order(kv) == [tail, 0, 2, 1]
        else:
            assert _free_order(kv) == [0, tail, 2, 1]
        # the next block taken is the tail, or c's cached prefix
        assert kv.allocate(Req(toks(16, 900)), 16)
        assert len(kv.lookup(Req(toks(17, 5000)))) == (1 if unhashed_first else 0)


def test_a_block_is_hashed_once_full_of_computed_tokens(manager: Manager) -> None:
    # what decides the front: computed tokens, not the tokens the request will have
    kv = manager(4, BS, evict_unhashed_first=True)
    a = Req(toks(32))
    assert kv.allocate(a, 32)
    a.num_computed_tokens = 20  # preempted mid-prefill: block 1 is partly computed
    first, second = a.block_ids
    kv.free(a)
    assert _free_order(kv) == [second, 2, 3, first]


def test_a_re_admission_after_preemption_counts_apart(manager: Manager) -> None:
    kv = manager(8, BS)
    a = Req(toks(40))
    assert kv.allocate(a, 40)
    kv.free(a)
    again = Req(toks(40))
    again.num_preemptions = 1
    assert kv.allocate(again, 40, kv.lookup(again))
    assert (kv.prefix_queries_tokens, kv.prefix_hits_tokens) == (40, 0)
    assert (kv.preempted_queries_tokens, kv.preempted_hits_tokens) == (40, 32)


def _free_order(kv: KVCacheManager | BlockManager) -> list[int]:
    return list(kv._free) if isinstance(kv, KVCacheManager) else list(kv.free_queue)
