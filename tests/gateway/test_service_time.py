"""Waiting by bounded slowdown: a request's service time predicted from an engine's measured
rates, its wait for a seat by list scheduling, and the limiter that admits a request beyond
the engine's seats only while that wait is within ``queue_slowdown`` times its own service
time. Predictions here are in seconds, so the microseconds a test takes do not move them."""

from __future__ import annotations

import asyncio

import pytest

from gateway.concurrency import AdmissionPolicy, Limiter, Shed, Slot
from gateway.service_time import ServiceRates, Work, predicted_wait_ms, work_of

RATES = ServiceRates(prefill_ms_per_token=1.0, decode_ms_per_token=50.0, default_max_tokens=512)
LONG = Work(prompt_tokens=100, max_tokens=256)  # an MT-Bench answer: 100 + 12,800 ms
SHORT = Work(prompt_tokens=10, max_tokens=16)  # a flood's request: 10 + 800 ms


def test_service_time_is_prefill_plus_max_tokens_decode_steps():
    assert RATES.service_ms(LONG) == 12_900.0
    assert RATES.service_ms(Work(10)) == 10 + 512 * 50.0  # no max_tokens: the default
    assert work_of({"max_tokens": 256}, 400) == Work(100, 256)
    assert work_of({"max_completion_tokens": 8, "max_tokens": 99}, 40) == Work(10, 8)
    assert work_of({"max_output_tokens": 64}, 4) == Work(1, 64)  # Responses
    assert work_of({"max_tokens": True}, 4) == Work(1, None)


def test_rates_from_health_reject_what_is_not_two_positive_numbers():
    assert ServiceRates.from_health({"prefill_ms_per_token": 0.5, "decode_ms_per_token": 60},
                                    256) == ServiceRates(0.5, 60.0, 256)
    for bad in (None, {}, {"prefill_ms_per_token": 0.5, "decode_ms_per_token": 0},
                {"prefill_ms_per_token": "1", "decode_ms_per_token": 60}):
        assert ServiceRates.from_health(bad, 256) is None


def test_the_wait_is_when_a_seat_frees_after_the_queue_ahead_took_theirs():
    assert predicted_wait_ms([], [], 2) == 0.0  # idle seats
    assert predicted_wait_ms([300.0, 100.0], [], 2) == 100.0
    assert predicted_wait_ms([300.0, 100.0], [500.0], 2) == 300.0  # the first free seat taken
    assert predicted_wait_ms([300.0, 100.0], [500.0, 50.0], 2) == 350.0
    assert predicted_wait_ms([300.0, 100.0, 200.0], [], 2) == 200.0  # a seat over the limit
    assert predicted_wait_ms([-5.0], [], 1) == 0.0  # over its prediction: due now


def engine(seats: int, slowdown: float = 1.5) -> Limiter:
    """A limiter as the gateway builds it for the local engine that reported ``RATES``."""
    limiter = Limiter(AdmissionPolicy(queue_slowdown=slowdown).for_capacity(seats, RATES))
    limiter.rates = RATES
    return limiter


async def fill(limiter: Limiter, work: Work, n: int) -> list[Slot]:
    return [await limiter.acquire(work=work) for _ in range(n)]


async def test_long_answers_a_few_past_the_seats_wait_their_turn():
    """Eight MT-Bench conversations on five seats: the three beyond them wait about one
    service time (within 1.5x their own), and are served as seats free."""
    limiter = engine(5)
    running = await fill(limiter, LONG, 5)
    waiting = [asyncio.create_task(limiter.acquire(work=LONG)) for _ in range(3)]
    await asyncio.sleep(0)
    assert limiter.queue_depth == 3 and not any(w.done() for w in waiting)
    for slot in running[:3]:
        slot.release()
    served = await asyncio.gather(*waiting)
    assert limiter.in_flight == 5 and limiter.queue_depth == 0
    assert all(slot.predicted_ms == 12_900.0 for slot in served)
    for slot in running[3:] + served:
        slot.release()
    assert limiter.in_flight == 0 and not limiter.running


async def test_a_flood_of_short_requests_is_shed_at_once_past_a_bounded_queue():
    """Four seats of 810 ms requests: four more wait one service time each; the ninth would
    wait two (over 1.5x its own) and is shed at once, labelled."""
    limiter = engine(4)
    running = await fill(limiter, SHORT, 4)
    waiting = [asyncio.create_task(limiter.acquire(work=SHORT)) for _ in range(4)]
    await asyncio.sleep(0)
    with pytest.raises(Shed) as shed:
        await limiter.acquire(work=SHORT)
    assert shed.value.reason == "queue_full" and limiter.queue_depth == 4
    for slot in running:
        slot.release()
    for slot in await asyncio.gather(*waiting):
        slot.release()


async def test_behind_long_answers_a_short_request_is_shed_and_a_long_one_waits():
    limiter = engine(2)
    running = await fill(limiter, LONG, 2)
    with pytest.raises(Shed):  # 12.9 s for an 810 ms answer: 16x its own service time
        await limiter.acquire(work=SHORT)
    waiter = asyncio.create_task(limiter.acquire(work=LONG))
    await asyncio.sleep(0)
    assert limiter.queue_depth == 1
    running[0].release()
    (await waiter).release()
    running[1].release()


async def test_without_rates_or_with_slowdown_0_nothing_waits():
    for limiter in (Limiter(AdmissionPolicy().for_capacity(1)), engine(1, slowdown=0)):
        slot = await limiter.acquire(work=LONG)
        with pytest.raises(Shed):
            await limiter.acquire(work=LONG)
        slot.release()


async def test_when_the_batch_already_slows_answers_past_the_bound_nothing_waits():
    """The slowdown bounds the response time, wait included. At the measured pace, one
    request past two busy seats waits about its own service time (1.5x allows it); once
    slots are seen held twice their predicted time (a saturated engine), it is shed at once:
    its answer would take 2x before any wait."""
    limiter = engine(2)
    running = await fill(limiter, LONG, 2)
    waiter = asyncio.create_task(limiter.acquire(work=LONG))
    await asyncio.sleep(0)
    assert limiter.queue_depth == 1  # at the measured pace: waits its turn
    waiter.cancel()
    for _ in range(20):  # slots seen ending after twice their predicted time
        limiter.ended(running[1], running[1].started + 2 * 12.9)
    assert limiter.scale == pytest.approx(2.0, rel=0.02)
    with pytest.raises(Shed) as shed:
        await limiter.acquire(work=LONG)
    assert shed.value.reason == "queue_full" and limiter.queue_depth == 0
    for slot in running:
        slot.release()
