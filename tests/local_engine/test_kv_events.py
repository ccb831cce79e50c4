"""The engine publishes its prefix cache's block hashes: what a router needs to mirror it."""

from __future__ import annotations

from local_engine.block_manager import BlockManager, block_hashes
from local_engine.sequence import SamplingParams, Sequence


def _cache(bm: BlockManager, prompt: list[int]) -> Sequence:
    seq = Sequence(prompt, SamplingParams())
    bm.allocate(seq)
    seq.num_computed = len(prompt)
    bm.commit(seq)
    bm.release(seq)
    return seq


def test_stored_hashes_are_the_ones_a_router_computes_from_the_tokens() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(100, 110))
    _cache(bm, prompt)
    answer = bm.events.since(bm.events.epoch, 0, lambda: bm.by_hash)
    assert answer["events"] == [[1, h] for h in block_hashes(prompt, 4)]
    assert len(answer["events"]) == 2  # whole blocks only
    assert bm.events.since(bm.events.epoch, answer["next"], lambda: bm.by_hash)["events"] == []


def test_evictions_are_published_and_a_stale_reader_gets_a_snapshot() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    first, second = list(range(16)), list(range(50, 66))
    _cache(bm, first)
    _cache(bm, second)  # needs every block: the first prompt's are evicted
    events = bm.events.since(bm.events.epoch, 0, lambda: bm.by_hash)["events"]
    removed = [h for op, h in events if op == 0]
    assert sorted(removed) == sorted(block_hashes(first, 4))
    snapshot = bm.events.since("another-process", 0, lambda: bm.by_hash)
    assert set(snapshot["snapshot"]) == set(block_hashes(second, 4))
    assert snapshot["next"] == len(events)
