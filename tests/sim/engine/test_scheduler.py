import random

import pytest

from inferlab.sim.engine.kvcache import KVCacheManager, hash_blocks
from inferlab.sim.engine.scheduler import Batch, Request, Scheduler, SchedulerConfig
from inferlab.sim.engine.steady import SteadyScheduler

BS = 16


# The policy tests run on the reference and on the engine's scheduler (with ``lazy`` off:
# its own pass over every request; steady decodes: tests/sim/engine/test_steady.py).
@pytest.fixture(params=[Scheduler, SteadyScheduler], ids=["reference", "steady"])
def cls(request: pytest.FixtureRequest) -> type[Scheduler]:
    kind: type[Scheduler] = request.param
    return kind


def make(
    cls: type[Scheduler],
    num_blocks: int = 1000,
    budget: int = 8192,
    max_seqs: int = 256,
    max_len: int = 20_000,
    chunked: bool = True,
    caching: bool = True,
    mixed: bool = True,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, caching)
    return cls(SchedulerConfig(budget, max_seqs, max_len, chunked, mixed), kv)


_salt = 0


def req(rid: str, prompt: list[int], out: int, ready_s: float = 0.0) -> Request:
    global _salt
    _salt += 1
    return Request(rid, len(prompt), out, hash_blocks(prompt, BS), _salt, ready_s)


def prompt(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def step(s: Scheduler, now_s: float = 0.0) -> tuple[Batch, list[Request], list[Request]]:
    batch = s.schedule(now_s)
    emitted, finished = s.postprocess(batch)
    return batch, emitted, finished


def test_chunked_prefill_splits_a_long_prompt_over_two_steps(cls: type[Scheduler]) -> None:
    s = make(cls)
    s.add(req("a", prompt(10_000), 3))
    b1, e1, _ = step(s)
    assert b1.seqs == [(8192, 0)] and b1.emitting == 0 and e1 == []
    b2, e2, _ = step(s)
    assert b2.seqs == [(1808, 8192)] and b2.emitting == 1 and len(e2) == 1
    b3, _, _ = step(s)
    assert b3.seqs == [(1, 10_000)] and b3.decode_tokens == 1


def test_decodes_and_a_prefill_chunk_share_the_budget(cls: type[Scheduler]) -> None:
    s = make(cls, budget=100)
    s.add(req("a", prompt(10), 5))
    step(s)  # a prefilled, now decoding
    s.add(req("b", prompt(300, 1000), 5))
    batch, _, _ = step(s)
    assert batch.seqs == [(1, 10), (99, 0)]  # running first, then the waiting chunk
    assert batch.decode_tokens == 1 and batch.prefill_tokens == 99


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits(cls: type[Scheduler]) -> None:
    s = make(cls, budget=100, max_len=100, chunked=False)
    s.add(req("a", prompt(60), 2))
    s.add(req("b", prompt(60, 1000), 2))
    batch, _, _ = step(s)
    assert [r.request_id for r in batch.requests] == ["a"]
    batch, _, _ = step(s)
    assert [r.request_id for r in batch.requests] == ["a", "b"]

    chunked = make(cls, budget=100, max_len=100)
    chunked.add(req("a", prompt(60), 2))
    chunked.add(req("b", prompt(60, 1000), 2))
    batch, _, _ = step(chunked)
    assert batch.seqs == [(60, 0), (40, 0)]


def test_waiting_requests_are_admitted_in_arrival_order_up_to_max_num_seqs(cls: type[Scheduler]) -> None:
    s = make(cls, max_seqs=3)
    for i in range(5):
        s.add(req(f"r{i}", prompt(20, 100 * i), 4))
    batch, _, _ = step(s)
    assert [r.request_id for r in batch.requests] == ["r0", "r1", "r2"]
    assert [r.request_id for r in s.waiting] == ["r3", "r4"]


def test_requests_wait_until_ready(cls: type[Scheduler]) -> None:
    s = make(cls)
    s.add(req("a", prompt(20), 2, ready_s=1.0))
    assert step(s, now_s=0.5)[0].requests == []
    assert s.next_ready_s() == 1.0
    assert [r.request_id for r in step(s, now_s=1.0)[0].requests] == ["a"]


def test_preemption_takes_the_newest_and_requeues_it_at_the_front(cls: type[Scheduler]) -> None:
    s = make(cls, num_blocks=4, max_len=64)  # 64 tokens of KV in all
    s.add(req("old", prompt(16), 20))
    s.add(req("new", prompt(16, 100), 20))
    s.add(req("later", prompt(4, 200), 1))
    step(s)  # old, new and later admitted (3 blocks)
    step(s)  # later finished; old and new each grow to a second block
    assert [r.request_id for r in s.running] == ["old", "new"]
    for _ in range(15):
        batch, _, _ = step(s)  # old and new fill their second blocks (32 tokens each)
        assert batch.preempted == []
    batch, _, _ = step(s)  # old needs a third block: none free, so new is preempted
    assert [r.request_id for r in batch.preempted] == ["new"]
    assert [r.request_id for r in batch.requests] == ["old"]
    assert s.waiting[0].request_id == "new" and s.waiting[0].num_computed_tokens == 0


def test_max_model_len_is_enforced_with_a_vllm_message(cls: type[Scheduler]) -> None:
    s = make(cls, max_len=4096)
    with pytest.raises(ValueError) as e:
        s.check_fits(4900, 100)
    assert str(e.value) == (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        "tokens (4900 in the messages, 100 in the completion). Please reduce the length of "
        "the messages or completion."
    )
    s.check_fits(4000, 96)
    with pytest.raises(ValueError, match="KV cache"):
        make(cls, num_blocks=10, max_len=4096).check_fits(200, 1)


@pytest.mark.parametrize(("chunked", "mixed"), [(True, True), (False, True), (True, False), (False, False)])
def test_random_workload_respects_limits_and_finishes_everything(cls: type[Scheduler], chunked: bool, mixed: bool) -> None:
    rng = random.Random(7)
    budget, max_seqs = 512, 8
    s = make(cls, num_blocks=60, budget=budget, max_seqs=max_seqs, max_len=512, chunked=chunked, mixed=mixed)
    wanted: dict[str, int] = {}
    got: dict[str, int] = {}
    shared = prompt(40, 77_000)
    for i in range(60):
        p = (shared if i % 3 == 0 else []) + prompt(rng.randint(1, 300), 1000 * i)
        out = rng.randint(1, 512 - len(p))
        s.check_fits(len(p), out)
        s.add(req(f"r{i}", p, out))
        wanted[f"r{i}"] = out
    preemptions = 0
    for _ in range(100_000):
        if not s.has_work():
            break
        decoding = {id(r) for r in s.running if r.num_tokens - r.num_computed_tokens == 1 and r.num_output_tokens}
        batch = s.schedule(0.0)
        if not mixed and batch.prefill_tokens:  # a prefill step leaves running decodes out
            assert not any(id(r) in decoding for r in batch.requests)
        emitted, _ = s.postprocess(batch)
        preemptions += len(batch.preempted)
        assert sum(n for n, _ in batch.seqs) <= budget
        assert len(s.running) <= max_seqs
        s.kv.check_invariants()
        held = {b for r in s.running for b in r.block_ids}
        assert len(held) + s.kv.num_free_blocks == s.kv.num_blocks
        for r in emitted:
            got[r.request_id] = got.get(r.request_id, 0) + 1
    assert not s.has_work()
    assert got == wanted
    assert preemptions > 0  # 60 blocks are far too few for 8 sequences of up to 512 tokens
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_separate_batches_pause_decodes_while_a_prompt_prefills(cls: type[Scheduler]) -> None:
    """SGLang / vLLM V0 without chunking: a waiting prompt gets a step of its own, and
    the running decode skips it; mixed (V1) steps carry both."""
    for mixed, want in ((False, [(0, 300), (2, 0)]), (True, [(1, 300)])):
        s = make(cls, budget=1024, mixed=mixed)
        s.add(req("a", prompt(100), 50))
        step(s)  # a is prefilled and emits its first token
        s.add(req("b", prompt(300, 5000), 5))
        seen = []
        while len(seen) < len(want):
            batch, _, _ = step(s)
            seen.append((batch.decode_tokens, batch.prefill_tokens))
        assert seen == want, mixed


def test_a_step_with_a_preemption_admits_no_one(cls: type[Scheduler]) -> None:
    s = make(cls, num_blocks=6, budget=47, max_len=96)
    s.add(req("a", prompt(16), 50))
    s.add(req("b", prompt(90, 1000), 1))
    batch, _, _ = step(s)  # a whole (1 block), b's first 31 tokens (2 blocks, 1 full)
    assert batch.seqs == [(16, 0), (31, 0)]
    batch, _, _ = step(s)  # a takes a block; b's next 46 tokens need 3 of the 2 left
    assert [r.request_id for r in batch.preempted] == ["b"] and batch.requests == [s.running[0]]
    # b would fit again now (its full block cached, 4 blocks free), but is not admitted
    assert batch.admitted == [] and [r.request_id for r in s.waiting] == ["b"]
    batch, _, _ = step(s)
    # (a re-admission's hit, which vLLM's prefix-cache counters leave out)
    assert [r.request_id for r in batch.admitted] == ["b"] and batch.preempted_hit_tokens == 16
    assert batch.prefix_hit_tokens == 0
    assert batch.seqs == [(1, 17), (46, 16)]


def test_multi_step_groups_run_decodes_only_and_admit_nothing(cls: type[Scheduler]) -> None:
    kv = KVCacheManager(1000, BS)
    s = cls(SchedulerConfig(8192, 256, 20_000, num_scheduler_steps=3), kv)
    s.add(req("a", prompt(20), 10))
    assert step(s)[0].prefill_tokens == 20  # a prefill starts no group
    assert step(s)[0].decode_tokens == 1  # a decode-only batch starts a group of 3
    s.add(req("b", prompt(20, 500), 10))
    seen = []
    for _ in range(3):
        batch, _, _ = step(s)
        seen.append(([r.request_id for r in batch.requests], batch.continuation))
    # b, ready, waits for the group's end
    assert seen == [(["a"], True), (["a"], True), (["a", "b"], False)]
