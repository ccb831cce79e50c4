"""GCRA in process (a fake clock) and in Redis (the Lua script against a real
redis-stack-server): the same decisions, all or nothing over a request's buckets."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.ratelimit.gcra import Bucket, LocalGCRA
from gateway.ratelimit.redis_gcra import RedisGCRA
from gateway.testing.redis_server import RedisServer

_ids = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def local(clock: Clock) -> LocalGCRA:
    return LocalGCRA(clock)


def test_the_whole_limit_at_once_then_one_per_interval(local: LocalGCRA, clock: Clock) -> None:
    rpm = Bucket("k:r", 10, 1)
    verdicts = [local.decide([rpm]) for _ in range(11)]
    assert [v.allowed for v in verdicts] == [True] * 10 + [False]
    assert [v.remaining[0] for v in verdicts] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
    assert verdicts[9].reset_s == (60.0,)  # full again a minute after the tenth
    refused = verdicts[10]
    assert refused.wait_s[0] == pytest.approx(6.0) and refused.retry_after_s == refused.wait_s[0]
    clock.now += 5.9
    assert not local.decide([rpm]).allowed
    clock.now += 0.1
    again = local.decide([rpm])
    assert again.allowed and again.remaining == (0,)


def test_a_request_is_charged_to_all_its_buckets_or_to_none(local: LocalGCRA) -> None:
    requests, tokens = Bucket("k:r", 100, 1), Bucket("k:t", 1000, 600)
    assert local.decide([requests, tokens]).remaining == (99, 400)
    refused = local.decide([requests, tokens])  # 600 more tokens do not fit
    assert not refused.allowed
    assert refused.remaining == (99, 400)  # the request bucket was not charged either
    assert refused.wait_s[0] == 0 and refused.wait_s[1] == pytest.approx(12.0)  # 200 tokens
    assert local.decide([requests, Bucket("k:t", 1000, 400)]).remaining == (98, 0)


def test_settling_refunds_and_owes(local: LocalGCRA, clock: Clock) -> None:
    tokens = Bucket("k:t", 1000, 900)
    local.decide([tokens])
    local.charge([Bucket("k:t", 1000, -850)], cap=False)  # used 50 of the 900 reserved
    assert local.decide([Bucket("k:t", 1000, 900)]).remaining == (50,)
    local.charge([Bucket("k:t", 1000, 1000)], cap=False)  # used 1000 more than reserved
    owed = local.decide([Bucket("k:t", 1000, 1)])
    assert not owed.allowed and owed.wait_s[0] == pytest.approx(57.06)  # 951 tokens owed
    refund = Bucket("k:t", 1000, -10_000)
    local.charge([refund], cap=False)  # a refund never makes a bucket more than full
    assert local.decide([Bucket("k:t", 1000, 1)]).remaining == (999,)


def test_a_shadow_charge_is_capped_at_one_period(local: LocalGCRA) -> None:
    local.charge([Bucket("k:r", 10, 50)], cap=True)
    verdict = local.decide([Bucket("k:r", 10, 1)])
    assert not verdict.allowed and verdict.wait_s[0] == pytest.approx(6.0)


def test_full_buckets_are_forgotten(local: LocalGCRA, clock: Clock) -> None:
    for i in range(1000):
        local.decide([Bucket(f"k{i}:r", 10, 1)])
    clock.now += 61  # all full again
    for i in range(30):  # the table reaches its sweep threshold (1024): the stale ones go
        local.decide([Bucket(f"new{i}:r", 10, 1)])
    assert len(local.tats) == 30


# --- the same in Redis ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[RedisGCRA]:
    store = RedisGCRA(redis_server.url, prefix=f"t{next(_ids)}:")
    yield store
    await store.aclose()


async def test_the_lua_script_decides_as_the_local_store_does(redis: RedisGCRA,
                                                              local: LocalGCRA) -> None:
    # Per hour: slow enough that Redis's clock moving on meanwhile changes no count (the
    # local store's is stopped).
    def r(cost: int = 1) -> Bucket:
        return Bucket("{k}:r", 5, cost, period_s=3600)

    def t(cost: int) -> Bucket:
        return Bucket("{k}:t", 1000, cost, period_s=3600)

    steps = [[r(), t(300)]] * 4 + [[r(), t(100)], [r()], [r()]]
    for buckets in steps:
        remote, here = await redis.decide(buckets), local.decide(buckets)
        assert (remote.allowed, remote.remaining) == (here.allowed, here.remaining)
        assert remote.store == "redis"
        for a, b in zip(remote.wait_s + remote.reset_s, here.wait_s + here.reset_s,
                        strict=True):
            assert a == pytest.approx(b, abs=1.0)
    await redis.decide([t(-900)], settle=True)
    assert (await redis.decide([t(0)])).remaining == (900,)


async def test_buckets_expire_from_redis_when_full_again(redis: RedisGCRA) -> None:
    await redis.decide([Bucket("{x}:r", 60_000, 1)])  # full again after 1 ms
    key = redis.prefix + "{x}:r"
    ttl = await redis.client.pttl(key)
    assert ttl <= 2  # ms; -2: already gone
    await redis.decide([Bucket("{x}:r", 60_000, -1)], settle=True)
    assert await redis.client.exists(key) == 0
