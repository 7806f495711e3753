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


# --- SGLang's admission (``reserve_outputs``) -------------------------------------------


def sglang(cls: type[Scheduler], num_tokens: int) -> Scheduler:
    """SGLang's way: prefill and decode steps apart, outputs reserved at admission; a
    KV cache of ``num_tokens`` one-token blocks (no prefix caching)."""
    config = SchedulerConfig(8192, 4096, 20_000, mixed_batches=False, reserve_outputs=True)
    return cls(config, KVCacheManager(num_tokens, 1, False))


def plain(rid: str, n_in: int, n_out: int, ready_s: float = 0.0) -> Request:
    return Request(rid, n_in, n_out, [], 0, ready_s)


def test_sglang_admission_reserves_a_new_requests_whole_output(cls: type[Scheduler]) -> None:
    s = sglang(cls, 100)
    s.add(plain("a", 10, 50))
    s.add(plain("b", 10, 50))
    batch, _, _ = step(s)
    # a: 10 + 50 of 100 tokens; b would need 60 of the 40 left
    assert [r.request_id for r in batch.admitted] == ["a"]
    # vLLM's admission looks at the prompt alone: both
    vllm = cls(SchedulerConfig(8192, 4096, 20_000, mixed_batches=False), KVCacheManager(100, 1, False))
    vllm.add(plain("a", 10, 50))
    vllm.add(plain("b", 10, 50))
    assert [r.request_id for r in step(vllm)[0].admitted] == ["a", "b"]


def test_sglang_admission_waits_for_a_running_request_to_leave(cls: type[Scheduler]) -> None:
    """Once a request does not fit, none is admitted until one finishes, even when the
    falling estimate would make room (SGLang's ``batch_is_full``)."""
    s = sglang(cls, 3000)
    s.add(plain("a", 10, 2000))
    s.add(plain("b", 10, 1000))
    ratios = []
    for k in range(1, 2002):
        batch, _, finished = step(s, now_s=k)
        ratios.append(s.new_token_ratio)
        if k == 1:
            assert [r.request_id for r in batch.admitted] == ["a"]  # b: 1,010 of 990 left
        elif k <= 2000:
            # from step 601 on the estimate is at its floor: 3,000 - 610 free less 0.098
            # of a's 1,400 left holds b's 1,010, and b still waits
            assert batch.admitted == [] and batch.decode_tokens == 1, k
        else:
            assert [r.request_id for r in batch.admitted] == ["b"]
        if k == 2000:
            assert [r.request_id for r in finished] == ["a"]
    # a prefill step leaves the estimate; each decode step lowers it by a 600th of the
    # way from 0.7 to 0.098, where it stays
    assert ratios[0] == 0.7 and abs(ratios[300] - (0.7 - 300 * 0.602 / 600)) < 1e-9
    assert ratios[599] > ratios[600] == ratios[1998] == pytest.approx(0.098)


def test_sglang_preemption_sets_the_estimate_from_progress(cls: type[Scheduler]) -> None:
    """b is admitted on an estimate that has fallen to 0.2 of a's tokens left; a outgrows
    it and b is preempted; the estimate becomes a's progress, (790 generated + 20) of
    1,000 (+1), on which b (301 tokens to recompute, 109 to generate) waits for a."""
    s = sglang(cls, 1100)
    s.add(plain("a", 10, 1000))
    s.add(plain("b", 10, 400, ready_s=500))
    preempted_at = a_done = b_back = None
    for k in range(1, 1200):
        batch, _, finished = step(s, now_s=k)
        if k == 500:  # 1,100 - 508 free less 0.2 of a's 501 left: room for b's 410
            assert [r.request_id for r in batch.admitted] == ["b"]
            assert s.new_token_ratio == pytest.approx(0.7 - 498 * 0.602 / 600)
        if batch.preempted:
            assert preempted_at is None and [r.request_id for r in batch.preempted] == ["b"]
            preempted_at = k
            assert s.new_token_ratio == pytest.approx(810 / 1001)
        if [r.request_id for r in finished] == ["a"]:
            a_done = k
        if k > 500 and batch.admitted:
            assert b_back is None and [r.request_id for r in batch.admitted] == ["b"]
            b_back = k
    # after step 791 a holds 508 + 291 tokens and b 301, the whole cache: a's next one
    # preempts b
    assert preempted_at == 792
    assert a_done is not None and b_back == a_done + 1
    assert not s.has_work()


def test_sglang_estimate_resets_when_the_engine_is_idle(cls: type[Scheduler]) -> None:
    s = sglang(cls, 1000)
    s.add(plain("a", 10, 20))
    for _ in range(19):
        step(s)
    assert s.has_work() and s.new_token_ratio < 0.7
    step(s)  # a's last token: nothing runs or waits, the scheduler idles
    assert not s.has_work() and s.new_token_ratio == 0.7


def test_sglang_admission_opens_at_the_decode_step_after_a_request_leaves(cls: type[Scheduler]) -> None:
    """SGLang drops finished requests from its batch when it next decodes, and only then
    tries waiting requests again: c waits one step more than the room a left."""
    s = sglang(cls, 100)
    s.add(plain("a", 10, 5))  # 15 of 100
    s.add(plain("b", 10, 60))  # 70 of the 85 left
    s.add(plain("c", 10, 20))  # 30: not in the 15 left
    admitted = []
    for k in range(1, 8):
        batch, _, finished = step(s, now_s=k)
        admitted.append([r.request_id for r in batch.admitted])
        if finished:
            assert k == 5 and [r.request_id for r in finished] == ["a"]
    # step 6 decodes b alone (a dropped), step 7 admits c: 84 free less 0.7 of b's 54
    assert admitted == [["a", "b"], [], [], [], [], [], ["c"]]


def test_sglang_admission_estimates_from_a_requests_own_limit(cls: type[Scheduler]) -> None:
    """A request that will stop at 20 tokens but may go to 80 (its max_tokens) reserves
    80, as SGLang does (it cannot know the answer's length)."""
    for limit, admitted in ((80, ["a"]), (20, ["a", "b"])):
        s = sglang(cls, 100)
        s.add(Request("a", 10, 20, [], 0, 0.0, max_new_tokens=limit))
        s.add(plain("b", 10, 20))
        # a: 10 + 80 of 100, b's 30 does not fit in the 10 left; a: 10 + 20, it does
        assert [r.request_id for r in step(s)[0].admitted] == admitted


def test_sglang_admission_does_not_count_a_requests_own_cached_prefix_as_room(cls: type[Scheduler]) -> None:
    """SGLang pins a request's cached prefix before it checks the room: 40 free tokens
    that b would reuse are not room for b's 5 new tokens and 20 to come."""
    config = SchedulerConfig(8192, 4096, 20_000, mixed_batches=False, reserve_outputs=True)
    s = cls(config, KVCacheManager(100, 1, True))
    shared = list(range(40))

    def cached_req(rid: str, ids: list[int], out: int) -> Request:
        return Request(rid, len(ids), out, hash_blocks(ids, 1), 0, 0.0)

    s.add(cached_req("a", shared, 2))
    while s.has_work():
        step(s)  # a leaves its 40 prompt tokens cached, in the free queue
    s.add(cached_req("x", list(range(1000, 1020)), 30))
    assert [r.request_id for r in step(s)[0].admitted] == ["x"]
    s.add(cached_req("b", [*shared, 7, 8, 9, 10, 11], 20))
    # 80 free less 0.7 of x's 29 left is 60 tokens, but 40 of them are b's own prefix
    batch, _, _ = step(s)
    assert batch.admitted == [] and [r.request_id for r in s.waiting] == ["b"]


@pytest.mark.parametrize(("b_out", "admitted"), [(40, ["a"]), (39, ["a", "b"])])
def test_sglang_admission_refuses_a_request_that_would_fill_the_room_exactly(
    cls: type[Scheduler], b_out: int, admitted: list[str]
) -> None:
    # a takes 10 + 40 of 100 tokens; b's 10 + 40 is the 50 left: refused (SGLang's >=)
    s = sglang(cls, 100)
    s.add(plain("a", 10, 40))
    s.add(plain("b", 10, b_out))
    assert [r.request_id for r in step(s)[0].admitted] == admitted


# --- TensorRT-LLM's admission (``no_evict``) ---------------------------------------------


def test_no_evict_admission_reserves_every_requests_way_to_its_limit(cls: type[Scheduler]) -> None:
    """A cache of 10 blocks of 16: each request needs 16 + 48 tokens (4 blocks) to its
    limit, so two run and the third waits until one has left; none is preempted. vLLM's
    admission takes all three on their prompts and preempts when decodes outgrow it."""
    config = SchedulerConfig(8192, 4096, 20_000, no_evict=True)
    s = cls(config, KVCacheManager(10, 16, False))
    for rid in "abc":
        s.add(plain(rid, 16, 48))
    admitted, preempted, finished_at = [], 0, {}
    for k in range(1, 200):
        batch, _, finished = step(s, now_s=k)
        admitted += [(r.request_id, k) for r in batch.admitted]
        preempted += len(batch.preempted)
        finished_at.update({r.request_id: k for r in finished})
        if len(finished_at) == 3:
            break
    assert [rid for rid, _ in admitted] == ["a", "b", "c"] and preempted == 0
    assert dict(admitted)["c"] > finished_at["a"]  # (waited for a's blocks)
    vllm = cls(SchedulerConfig(8192, 4096, 20_000), KVCacheManager(10, 16, False))
    for rid in "abc":
        vllm.add(plain(rid, 16, 48))
    vllm_preempted = 0
    for k in range(1, 400):
        batch, _, _ = step(vllm, now_s=k)
        vllm_preempted += len(batch.preempted)
        if not vllm.has_work():
            break
    assert vllm_preempted > 0
