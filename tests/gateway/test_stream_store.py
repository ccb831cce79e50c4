"""The kept streams' bounds: bytes per gateway key (one key's streams never evict
another's), a TTL after each stream's end; ids stamped on events, not on comments."""

from __future__ import annotations

import asyncio

import pytest

from gateway.stream_store import StreamsConfig, StreamStore

EVENT = b"data: " + b"x" * 94 + b"\n\n"  # 102 bytes; stamped: 110 or so


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def grow(store: StreamStore, tenant: str, events: int) -> str:
    stream = store.open(tenant, "openai")
    _, new = stream.stamp(EVENT * events)
    stream.add(new)
    store.grew(stream)
    return stream.id


async def test_a_key_over_its_share_evicts_its_own_oldest_streams_never_anothers() -> None:
    store = StreamStore(StreamsConfig(max_bytes=4096), share=0.5)
    bobs = grow(store, "bob", 5)
    alices = [grow(store, "alice", 5) for _ in range(6)]  # ~3.3 KiB: over her 2 KiB
    assert store.find("bob", bobs) is not None
    assert store.find("alice", alices[0]) is None and store.find("alice", alices[-1])
    assert store.evicted >= 3


async def test_a_stream_is_found_only_under_its_own_key() -> None:
    store = StreamStore(StreamsConfig())
    sid = grow(store, "alice", 1)
    assert store.find("bob", sid) is None and store.find(None, sid) is None
    assert store.find("alice", sid) is not None


async def test_an_ended_stream_expires_after_the_ttl_a_live_one_does_not() -> None:
    clock = Clock()
    store = StreamStore(StreamsConfig(ttl_s=60), clock=clock)
    ended = store.open("k", "openai")
    ended.end()
    store.ended(ended)
    live = grow(store, "k", 1)
    clock.now = 59
    assert store.find("k", ended.id) is ended
    clock.now = 61
    assert store.find("k", ended.id) is None and ended.evicted
    assert store.find("k", live) is not None


async def test_a_stream_over_a_keys_share_stops_being_kept_and_its_readers_are_told() -> None:
    store = StreamStore(StreamsConfig(max_bytes=1024))
    stream = store.open("k", "openai")
    body, new = stream.stamp(EVENT * 20)
    stream.add(new)
    store.grew(stream)
    assert stream.evicted and stream.events == [] and store.find("k", stream.id) is None
    assert body.count(b"\nid: ") == 20  # its live client still gets every id


def test_ids_end_each_event_comments_get_none() -> None:
    store = StreamStore(StreamsConfig())

    async def stamp() -> bytes:
        stream = store.open(None, "anthropic")
        first, _ = stream.stamp(b"event: a\ndata: {}\n\n: keepalive\n\n")
        second, _ = stream.stamp(b"data: {}\nid: upstream-7\n\n")
        return first + second

    assert asyncio.run(stamp()) == (b"event: a\ndata: {}\nid: 0\n\n: keepalive\n\n"
                                    b"data: {}\nid: upstream-7\nid: 1\n\n")


@pytest.mark.parametrize("readers", [0, 1])
async def test_abandoned_waits_the_grace_only_while_no_one_reads(readers: int) -> None:
    store = StreamStore(StreamsConfig())
    stream = store.open("k", "openai")
    stream.detach()  # its first client left
    for _ in range(readers):
        stream.attach()
    waiting = asyncio.ensure_future(stream.abandoned(0.05))
    await asyncio.sleep(0.15)
    assert waiting.done() is (readers == 0)
    if readers:
        stream.detach()  # the resumed reader left too: the grace starts again
        await asyncio.wait_for(waiting, 1)


async def test_streams_growing_side_by_side_go_oldest_first() -> None:
    store = StreamStore(StreamsConfig(max_bytes=2048))
    old, new = store.open("k", "openai"), store.open("k", "openai")
    for _ in range(10):  # the older one written last each round
        for stream in (new, old):
            _, events = stream.stamp(EVENT)
            stream.add(events)
            store.grew(stream)
    assert old.evicted and not new.evicted
