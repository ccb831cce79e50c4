"""The per-upstream limiter: slots, the bounded priority queue, deadlines, the long-prompt
lane and the adaptive limit. Waiting is awaited on events, never slept through."""

from __future__ import annotations

import asyncio

import pytest

from gateway.concurrency import AdmissionPolicy, Limiter, Shed


def limiter(**kw) -> Limiter:
    return Limiter(AdmissionPolicy(**{"max_concurrency": 2, "max_queue": 4,
                                      "max_queue_wait_ms": 5_000, **kw}))


async def test_slots_up_to_the_limit_then_fifo_queue():
    lim = limiter()
    a, b = await lim.acquire(), await lim.acquire()
    assert lim.in_flight == 2
    c = asyncio.create_task(lim.acquire())
    d = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    assert lim.queue_depth == 2 and not c.done()
    a.release()
    slot_c = await c
    assert not d.done() and lim.in_flight == 2
    b.release()
    slot_d = await d
    assert slot_c.waited_ms >= 0 and slot_d.waited_ms >= 0
    slot_c.release(), slot_d.release()
    assert lim.in_flight == 0 and lim.queue_depth == 0


async def test_full_queue_sheds_at_once():
    lim = limiter(max_queue=1)
    await lim.acquire(), await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    with pytest.raises(Shed) as exc:
        await lim.acquire()
    assert exc.value.reason == "queue_full"
    waiter.cancel()


async def test_queue_deadline_sheds_with_queue_timeout():
    lim = limiter(max_queue_wait_ms=20)
    await lim.acquire(), await lim.acquire()
    with pytest.raises(Shed) as exc:
        await lim.acquire()
    assert exc.value.reason == "queue_timeout"
    assert lim.queue_depth == 0


async def test_expected_wait_over_the_deadline_sheds_without_waiting():
    lim = limiter(max_queue_wait_ms=100)
    lim.service_ms = 1_000.0  # each slot is held ~1 s: no queued request could make it
    await lim.acquire(), await lim.acquire()
    with pytest.raises(Shed) as exc:
        await lim.acquire()
    assert exc.value.reason == "queue_full"  # at once: its deadline would say queue_timeout
    assert lim.queue_depth == 0


async def test_priorities_order_the_queue_and_evict_low_first():
    lim = limiter(max_queue=2)
    first, _ = await lim.acquire(), await lim.acquire()
    low = asyncio.create_task(lim.acquire("low"))
    normal = asyncio.create_task(lim.acquire("normal"))
    await asyncio.sleep(0)
    high = asyncio.create_task(lim.acquire("high"))  # queue full: evicts the low waiter
    await asyncio.sleep(0)
    with pytest.raises(Shed) as exc:
        await low
    assert exc.value.reason == "priority_evicted"
    first.release()
    await high  # high goes before normal, though it came later
    assert not normal.done()
    normal.cancel()


async def test_cancelled_waiter_leaves_no_trace():
    lim = limiter()
    a, _ = await lim.acquire(), await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    a.release()
    assert lim.in_flight == 1 and lim.queue_depth == 0


async def test_long_prompts_hold_at_most_their_share_of_slots():
    lim = limiter(max_concurrency=4, long_lane_share=0.25, max_queue=8)
    long_one = await lim.acquire(long=True)
    long_two = asyncio.create_task(lim.acquire(long=True))
    await asyncio.sleep(0)
    assert not long_two.done()  # lane (1 slot) is full, though 3 slots are free
    shorts = [await lim.acquire() for _ in range(3)]  # short requests are not held up
    assert lim.in_flight == 4
    long_one.release()
    await long_two
    for s in shorts:
        s.release()


async def test_low_priority_holds_at_most_its_share_so_interactive_requests_find_a_slot():
    lim = limiter(max_concurrency=4, low_priority_share=0.75, max_queue=8)
    batch = [await lim.acquire("low") for _ in range(3)]
    waiting = asyncio.create_task(lim.acquire("low"))
    await asyncio.sleep(0)
    assert not waiting.done() and lim.in_flight == 3  # a slot kept free for the rest
    assert lim.try_acquire(low=True) is None
    interactive = lim.try_acquire()  # no wait behind the batch
    assert interactive is not None and lim.in_flight == 4
    interactive.release()  # the free slot is not the batch's to take
    await asyncio.sleep(0)
    assert not waiting.done() and lim.in_flight == 3
    batch[0].release()  # a batch slot ends: the next batch request takes it
    late = await waiting
    assert lim.low_in_flight == 3
    for s in (*batch[1:], late):
        s.release()
    assert lim.in_flight == lim.low_in_flight == 0


async def test_a_queued_request_passes_a_batch_request_whose_share_is_full():
    lim = limiter(max_concurrency=2, low_priority_share=0.5, max_queue=8)
    batch, normal = await lim.acquire("low"), await lim.acquire()
    second_batch = asyncio.create_task(lim.acquire("low"))
    await asyncio.sleep(0)
    later = asyncio.create_task(lim.acquire("high"))
    await asyncio.sleep(0)
    normal.release()
    await later  # the batch request ahead of it may hold no second slot
    assert not second_batch.done()
    batch.release()
    await second_batch


async def test_aimd_grows_when_used_and_backs_off_on_errors_and_slowness():
    lim = limiter(limiter="aimd", max_concurrency=10, latency_target_ms=100)
    slots = [await lim.acquire() for _ in range(6)]
    slots[0].sample(True, 10)
    assert lim.limit == 11
    slots[1].sample(False, 10)
    assert lim.limit == pytest.approx(9.9)
    slots[2].sample(True, 500)  # too slow counts as a drop
    assert lim.limit == pytest.approx(8.91)
    for s in slots:
        s.release()


async def test_static_limit_ignores_samples():
    lim = limiter()
    slot = await lim.acquire()
    slot.sample(False, 1e6)
    assert lim.limit == 2
    slot.release()


def test_an_upstream_that_knows_its_capacity_is_admitted_to_match_it():
    policy = AdmissionPolicy(max_concurrency=256, max_queue=256)
    engine = policy.for_capacity(32)
    assert (engine.limiter, engine.max_concurrency, engine.max_limit, engine.max_queue) == \
        ("aimd", 32, 32, 0)
    assert policy.for_capacity(None) is policy
    assert AdmissionPolicy(capacity_aware=False).for_capacity(32).max_concurrency == 256


async def test_beyond_its_capacity_a_request_is_shed_at_once():
    limiter = Limiter(AdmissionPolicy().for_capacity(2))
    slots = [await limiter.acquire(), await limiter.acquire()]
    with pytest.raises(Shed) as shed:
        await limiter.acquire()
    assert shed.value.reason == "queue_full"
    for _ in range(5):  # fast answers never lift the limit past the capacity
        slots[0].sample(True, 1.0)
    assert limiter.limit == 2
    for slot in slots:
        slot.release()


async def test_within_a_priority_tenants_take_turns():
    """One key's backlog of ten does not hold the queue: the keys that come after it with
    one or two requests are served in turn with it (start-time fair queueing)."""
    lim = limiter(max_concurrency=1, max_queue=100)
    running = await lim.acquire()
    order: list[str] = []

    async def wait(tenant: str) -> None:
        slot = await lim.acquire(tenant=tenant)
        order.append(tenant)
        slot.release()
    tasks = [asyncio.create_task(wait("heavy")) for _ in range(10)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(wait(t)) for t in ("light-a", "light-a", "light-b")]
    await asyncio.sleep(0)
    assert lim.queue_depth == 13
    running.release()
    await asyncio.gather(*tasks)
    assert order == ["heavy", "light-a", "light-b", "heavy", "light-a"] + ["heavy"] * 8
    assert lim.in_flight == 0 and not lim._finish  # no backlog left: no tenant state kept


async def test_a_priority_still_comes_before_fairness():
    lim = limiter(max_concurrency=1, max_queue=100)
    running = await lim.acquire()
    order: list[str] = []

    async def wait(tenant: str, priority: str) -> None:
        slot = await lim.acquire(priority, tenant=tenant)
        order.append(f"{tenant}/{priority}")
        slot.release()
    tasks = [asyncio.create_task(wait("a", "normal")) for _ in range(2)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(wait("b", "high")))
    await asyncio.sleep(0)
    running.release()
    await asyncio.gather(*tasks)
    assert order == ["b/high", "a/normal", "a/normal"]


async def test_a_wait_longer_than_the_clients_slo_is_shed_at_once():
    lim = limiter(max_concurrency=1, max_queue=100, max_queue_wait_ms=60_000)
    lim.service_ms = 100.0  # each slot is held ~100 ms
    running = await lim.acquire()
    waiting = asyncio.create_task(lim.acquire())  # expected wait ~100 ms
    await asyncio.sleep(0)
    with pytest.raises(Shed) as exc:  # it would wait ~200 ms: over its 150 ms objective
        await lim.acquire(slo_ms=150)
    assert exc.value.reason == "slo"
    queued = asyncio.create_task(lim.acquire(slo_ms=500))  # within it: it queues
    await asyncio.sleep(0)
    assert lim.queue_depth == 2
    running.release()
    (await waiting).release()
    (await queued).release()
