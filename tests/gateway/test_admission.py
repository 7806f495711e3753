"""Admission as plain bookkeeping: who gets room in which order, and that every way out
gives the room back."""

from __future__ import annotations

import asyncio

import pytest

from inferlab._clock import NS_PER_S, VirtualClock
from inferlab.gateway.admission import SHARED_GROW_STEP, Admission, Rejected, Ticket
from inferlab.gateway.config import AdmissionMode


def first(room: list[int]) -> int:
    return room[0]


def admission(mode: AdmissionMode = "tokens", tokens: int = 100, requests: int = 2, *, clock: VirtualClock | None = None,
              queue_max: int = 10, timeout_s: float = 5.0, starvation_s: float = 10.0, upstreams: int = 1) -> Admission:
    return Admission(mode, [tokens] * upstreams, [requests] * upstreams, queue_max=queue_max, queue_timeout_s=timeout_s,
                     starvation_s=starvation_s, clock=clock or VirtualClock())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def waiting(a: Admission, tokens: list[int], order: list[int]) -> list[asyncio.Task[None]]:
    async def one(t: int) -> None:
        await a.acquire(t, [0], first)
        order.append(t)

    tasks = []
    for t in tokens:
        tasks.append(asyncio.create_task(one(t)))
        await settle()
    return tasks


async def test_by_tokens_the_smallest_waiters_go_first_when_room_frees() -> None:
    a = admission()
    big = await a.acquire(100, [0], first)
    order: list[int] = []
    tasks = await waiting(a, [60, 30, 20], order)
    assert order == [] and a.queue_length == 3
    a.release(big)
    await settle()
    assert order == [20, 30]  # 60 more would be 110 > 100: it waits
    assert a.tokens_in_flight == [50]
    for t in tasks:
        t.cancel()


async def test_by_requests_the_queue_is_served_in_arrival_order() -> None:
    a = admission("requests", requests=1)
    held = await a.acquire(100, [0], first)
    order: list[int] = []
    tasks = await waiting(a, [60, 30, 20], order)
    a.release(held)
    await settle()
    assert order == [60]
    for t in tasks:
        t.cancel()


async def test_a_waiter_past_starvation_goes_first_and_room_is_held_for_it() -> None:
    clock = VirtualClock()
    a = admission(clock=clock, starvation_s=1.0)
    held = [await a.acquire(50, [0], first), await a.acquire(50, [0], first)]
    order: list[int] = []
    tasks = await waiting(a, [90], order)
    clock.advance_to_ns(2 * NS_PER_S)  # 90 has now waited 2 s
    tasks += await waiting(a, [10, 10], order)
    a.release(held[0])  # 50 free: the two 10s would fit, but 90 is starving
    await settle()
    assert order == []
    a.release(held[1])
    await settle()
    assert order == [90, 10]
    for t in tasks:
        t.cancel()


async def test_a_starved_waiter_holds_room_on_its_own_upstreams_only() -> None:
    clock = VirtualClock()
    a = admission(clock=clock, starvation_s=1.0, upstreams=2)
    held = [await a.acquire(80, [0], first), await a.acquire(80, [1], first)]
    order: list[str] = []

    async def one(name: str, tokens: int, upstreams: list[int]) -> None:
        await a.acquire(tokens, upstreams, first)
        order.append(name)

    starving = asyncio.create_task(one("90 on 0", 90, [0]))
    await settle()
    clock.advance_to_ns(2 * NS_PER_S)  # it has now waited 2 s: room on 0 is held for it
    others = [asyncio.create_task(one("10 on 0", 10, [0])), asyncio.create_task(one("10 on 1", 10, [1]))]
    await settle()
    a.release(held[1])  # room on 1: the 10 for 1 goes in; the 10 for 0 still waits behind the 90
    await settle()
    assert order == ["10 on 1"]
    a.release(held[0])
    await settle()
    assert order == ["10 on 1", "90 on 0", "10 on 0"]
    await asyncio.gather(starving, *others)


async def test_a_request_over_the_whole_budget_goes_alone() -> None:
    a = admission(tokens=100)
    small = await a.acquire(10, [0], first)
    order: list[int] = []
    tasks = await waiting(a, [500], order)
    assert order == []
    a.release(small)
    await settle()
    assert order == [500] and a.tokens_in_flight == [500]
    for t in tasks:
        t.cancel()


async def test_the_least_loaded_upstream_with_room_is_chosen() -> None:
    a = admission(tokens=100, upstreams=3)
    a.tokens_in_flight[:] = [40, 10, 95]
    seen: list[list[int]] = []

    def least(room: list[int]) -> int:
        seen.append(list(room))
        return min(room, key=lambda i: a.tokens_in_flight[i])

    t = await a.acquire(20, [0, 1, 2], least)
    assert seen == [[0, 1]] and t.upstream == 1


async def test_a_full_queue_and_a_long_wait_are_refused() -> None:
    a = admission(queue_max=1, timeout_s=0.05)
    await a.acquire(100, [0], first)
    waiter = asyncio.create_task(a.acquire(10, [0], first))
    await settle()
    with pytest.raises(Rejected) as full:
        await a.acquire(10, [0], first)
    assert full.value.reason == "queue_full"
    with pytest.raises(Rejected) as late:
        await waiter
    assert late.value.reason == "queue_timeout" and late.value.retry_after_s == 0.05
    assert a.queue_length == 0 and a.tokens_in_flight == [100] and a.requests_in_flight == [1]


async def test_a_waiter_cancelled_holds_nothing_even_if_granted_as_it_left() -> None:
    a = admission()
    held = await a.acquire(100, [0], first)
    waiter = asyncio.create_task(a.acquire(30, [0], first))
    await settle()
    waiter.cancel()
    await settle()
    assert a.queue_length == 0
    a.release(held)
    assert a.tokens_in_flight == [0]
    # granted and cancelled in the same turn of the loop: the grant is given back
    held = await a.acquire(100, [0], first)
    waiter = asyncio.create_task(a.acquire(30, [0], first))
    await settle()
    a.release(held)  # grants 30 to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs
    (got,) = await asyncio.gather(waiter, return_exceptions=True)
    if isinstance(got, Ticket):  # the grant won (asyncio's wait_for returns a result it has): the caller holds it
        assert a.tokens_in_flight == [30]
        a.release(got)
    else:
        assert isinstance(got, asyncio.CancelledError)
    assert a.tokens_in_flight == [0] and a.requests_in_flight == [0]


async def test_release_is_idempotent_and_resize_moves_the_hold() -> None:
    a = admission()
    t = await a.acquire(40, [0], first)
    a.resize(t, 70)
    assert a.tokens_in_flight == [70]
    a.release(t)
    a.release(t)
    assert a.tokens_in_flight == [0] and a.requests_in_flight == [0]


class OtherInstance:
    """``SharedBudgets`` for one upstream, with another gateway instance holding ``held``
    tokens there: takes check the true total, as the Redis script does."""

    def __init__(self, a: Admission, held: int) -> None:
        self.a = a
        self.held = held  # the other instance's tokens
        self.mine = 0
        self.gives: list[tuple[int, int, int]] = []
        self.woken = 0

    async def take(self, ticket: Ticket) -> bool:
        await asyncio.sleep(0)  # (a round trip)
        self.a.others_tokens[0] = self.held
        self.a.batches += 1  # (the answer of a batch)
        total = self.held + self.mine
        if total and total + ticket.tokens > self.a.max_tokens[0]:
            return False
        self.mine += ticket.tokens
        return True

    def give(self, upstream: int, tokens: int, requests: int) -> None:
        self.gives.append((upstream, tokens, requests))
        self.mine += tokens

    def wake(self) -> None:
        self.woken += 1

    def other_releases(self) -> None:  # (and a batch tells this instance)
        self.held = 0
        self.a.others_tokens[0] = 0
        self.a.batches += 1
        self.a.regrant()


async def test_a_request_another_instance_took_the_room_of_waits_again_in_its_place() -> None:
    a = admission(tokens=100)
    other = OtherInstance(a, held=80)  # this instance has not heard of it yet
    a.shared = other
    order: list[str] = []

    async def one(name: str) -> Ticket:
        t = await a.acquire(50, [0], first)
        order.append(name)
        return t

    early = asyncio.create_task(one("early"))
    await settle()
    assert not early.done() and a.queue_length == 1 and other.woken == 1
    assert a.tokens_in_flight == [0] and other.mine == 0  # the refused take left nothing held
    late = asyncio.create_task(one("late"))
    await settle()
    other.held = 50  # the other instance gives back 30 (a batch says so): room for one of the two
    a.others_tokens[0] = 50
    a.batches += 1
    a.regrant()
    await settle()
    assert order == ["early"]  # the refused request kept its place ahead of the later one
    ticket = early.result()
    assert ticket.shared and a.tokens_in_flight == [50] and other.mine == 50
    a.resize(ticket, 70)  # outgrown: charged a step ahead, not a call per token
    a.resize(ticket, 71)
    assert other.gives == [(0, 70 + SHARED_GROW_STEP - 50, 0)] and a.tokens_in_flight == [71]
    other.other_releases()
    a.release(ticket)
    await settle()
    assert order == ["early", "late"] and other.gives[1] == (0, -(70 + SHARED_GROW_STEP), -1)
    a.release(late.result())
    assert a.tokens_in_flight == [0] and other.mine == 0


async def test_a_request_refused_by_the_shared_count_keeps_its_queue_timeout() -> None:
    clock = VirtualClock()
    a = admission(tokens=100, clock=clock, timeout_s=5.0)

    class Slow(OtherInstance):
        async def take(self, ticket: Ticket) -> bool:
            clock.advance_to_ns(clock.now_ns() + 5 * NS_PER_S)  # the round trip took the whole wait
            return await super().take(ticket)

    a.shared = Slow(a, held=80)
    with pytest.raises(Rejected) as e:  # at once: the wait counts from the first offer, not the retry
        await asyncio.wait_for(a.acquire(50, [0], first), 1.0)
    assert e.value.reason == "queue_timeout" and a.queue_length == 0 and a.tokens_in_flight == [0]
