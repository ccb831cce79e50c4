"""One contract, both backends: memory (in-process) and redis (a real redis-stack-server)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from gateway.cache.backend import Backend, Entry, MemoryBackend
from gateway.cache.redis_backend import RedisBackend
from gateway.testing.redis_server import RedisServer

DIM = 384
_ids = itertools.count()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        b: Backend = MemoryBackend()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        b = RedisBackend(server.url, prefix=f"t{next(_ids)}:", dim=DIM)
    yield b
    await b.aclose()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def entry(n: int, scope: str | None = "s1", namespace: str = "ns") -> Entry:
    return Entry(f"e{next(_ids)}", f"exact{n}", scope, namespace, f"question {n}",
                 f'{{"answer": {n}}}'.encode())


async def test_exact_round_trip(backend: Backend) -> None:
    e = entry(1)
    await backend.put(e, unit(1), 60)
    got = await backend.get_exact("exact1", "ns")
    assert got is not None and got.answer == e.answer and got.query == "question 1"
    assert got.scope == "s1"
    assert await backend.get_exact("exact1", "other-ns") is None
    assert await backend.get_exact("exact2", "ns") is None


async def test_search_is_nearest_first_and_scoped(backend: Backend) -> None:
    base = unit(10)
    near = base + 0.05 * unit(11)
    near /= np.linalg.norm(near)
    await backend.put(entry(10), base, 60)
    await backend.put(entry(11), unit(12), 60)
    await backend.put(entry(12, scope="s2"), base, 60)
    hits = await backend.search("s1", near, 2)
    assert [e.query for e, _ in hits] == ["question 10", "question 11"]
    assert hits[0][1] == pytest.approx(float(near @ base), abs=1e-4)
    assert hits[0][1] > 0.99 > hits[1][1]
    assert [e.query for e, _ in await backend.search("s2", near, 5)] == ["question 12"]
    assert await backend.search("s3", near, 5) == []


async def test_entries_without_scope_only_hit_exactly(backend: Backend) -> None:
    await backend.put(entry(20, scope=None), None, 60)
    got = await backend.get_exact("exact20", "ns")
    assert got is not None and got.scope is None


async def test_ttl_expiry(backend: Backend) -> None:
    if isinstance(backend, MemoryBackend):
        now = [1000.0]
        backend.clock = lambda: now[0]
        await backend.put(entry(30), unit(30), 5)
        assert await backend.get_exact("exact30", "ns") is not None
        now[0] += 6
    else:
        assert isinstance(backend, RedisBackend)
        await backend.put(entry(30), unit(30), 0.001)
        await _redis_wait_expired(backend)
    assert await backend.get_exact("exact30", "ns") is None
    assert await backend.search("s1", unit(30), 3) == []


async def _redis_wait_expired(backend: RedisBackend) -> None:
    # Redis checks expiry on every access, so once the server's own clock is past the 1 ms
    # TTL, reads see the keys gone.
    t0 = await backend.client.time()
    while True:
        t = await backend.client.time()
        if (t[0] - t0[0]) * 1_000_000 + (t[1] - t0[1]) > 5_000:
            return


async def test_same_exact_key_replaces(backend: Backend) -> None:
    await backend.put(entry(40), unit(40), 60)
    newer = Entry("newer", "exact40", "s1", "ns", "question 40", b"new")
    await backend.put(newer, unit(40), 60)
    got = await backend.get_exact("exact40", "ns")
    assert got is not None and got.answer == b"new"


async def test_purge_namespace(backend: Backend) -> None:
    await backend.put(entry(50, namespace="team-a"), unit(50), 60)
    await backend.put(entry(51, namespace="team-a"), unit(51), 60)
    await backend.put(entry(52, namespace="team-b"), unit(52), 60)
    assert await backend.purge("team-a") == 2
    assert await backend.get_exact("exact50", "team-a") is None
    assert await backend.get_exact("exact52", "team-b") is not None
    assert [e.namespace for e, _ in await backend.search("s1", unit(50), 5)] == ["team-b"]


async def test_memory_backend_evicts_least_recently_used() -> None:
    backend = MemoryBackend(max_entries=2)
    await backend.put(entry(60), unit(60), 60)
    await backend.put(entry(61), unit(61), 60)
    assert await backend.get_exact("exact60", "ns") is not None  # 60 is now most recent
    await backend.put(entry(62), unit(62), 60)
    assert await backend.get_exact("exact61", "ns") is None
    assert await backend.get_exact("exact60", "ns") is not None
    assert len(await backend.search("s1", unit(60), 5)) == 2
    small = MemoryBackend(max_bytes=1000)
    for i in range(10):
        await small.put(entry(70 + i), unit(70 + i), 60)
    assert small.nbytes <= 1000 and len(small.entries) < 10


async def test_purge_matches_one_namespace_exactly(backend: Backend) -> None:
    names = ["team", "team:eng", "team/x", "t*", "te?m", "[t]eam", "tea%6D"]
    for i, namespace in enumerate(names):
        await backend.put(entry(90 + i, namespace=namespace), unit(90 + i), 60)
    assert await backend.purge("team") == 1
    assert await backend.purge("t*") == 1
    assert await backend.purge("[t]eam") == 1
    assert await backend.get_exact("exact90", "team") is None
    for i, namespace in enumerate(names):
        if namespace not in ("team", "t*", "[t]eam"):
            assert await backend.get_exact(f"exact{90 + i}", namespace) is not None, namespace


async def test_a_redis_prefix_with_glob_characters_purges_its_own_keys_only(
        redis_server: RedisServer) -> None:
    mine = RedisBackend(redis_server.url, prefix="p[1]*:", dim=DIM)
    other = RedisBackend(redis_server.url, prefix="p1x:", dim=DIM)
    try:
        await mine.put(entry(100, namespace="team"), unit(100), 60)
        await other.put(entry(101, namespace="team"), unit(101), 60)
        assert await mine.purge("team") == 1
        assert await other.get_exact("exact101", "team") is not None
    finally:
        await mine.aclose()
        await other.aclose()


async def test_the_memory_backend_keeps_each_keys_share() -> None:
    backend = MemoryBackend(max_entries=4, share=0.5)
    await backend.put(entry(110, namespace="team-a"), unit(110), 60)
    for i in range(6):  # B fills the cache from two of its namespaces
        await backend.put(entry(111 + i, namespace="team-b/x" if i % 2 else "team-b"),
                          unit(111 + i), 60)
    assert await backend.get_exact("exact110", "team-a") is not None
    held = [e.namespace for e, _ in await backend.search("s1", unit(110), 10)]
    assert sorted(held) == ["team-a", "team-b", "team-b/x"]  # B: its 2 newest
    assert len(backend.entries) == 3 and backend.nbytes == sum(
        e.nbytes for e, _ in backend.entries.values())
