"""Paged KV cache bookkeeping (no torch): fixed-size blocks, reference counts, and prefix
caching by hash-chained full blocks with LRU eviction of unreferenced ones.

A block's hash covers its tokens and the hash of the block before it, so equal hashes mean
equal prefixes (vLLM's automatic prefix caching; nano-vllm's BlockManager). Freed blocks that
hold a full, hashed prefix stay cached until their space is needed, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence as Tokens

from local_engine.kv_events import KvEvents
from local_engine.sequence import Sequence

__all__ = ["BlockManager", "OutOfBlocks", "block_hash", "block_hashes"]


def block_hash(parent: int, tokens: Tokens[int]) -> int:
    """The hash of a full block of ``tokens`` after the block hashed ``parent`` (0: the
    first). Deterministic across processes (ints and tuples of ints are not salted), so the
    gateway computes the same hashes from the same tokens (gateway.replicas)."""
    return hash((parent, tuple(tokens)))


def block_hashes(tokens: Tokens[int], block_size: int) -> list[int]:
    """The chained hashes of ``tokens``' full blocks, as the engine registers them."""
    out, h = [], 0
    for i in range(len(tokens) // block_size):
        h = block_hash(h, tokens[i * block_size:(i + 1) * block_size])
        out.append(h)
    return out


class OutOfBlocks(Exception):
    """Not enough free KV blocks for the request right now."""


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` token slots each. A block is free, in use
    (``ref`` > 0), or cached (unreferenced but holding a hashed full prefix block)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.cached: OrderedDict[int, int] = OrderedDict()  # unreferenced: block -> hash (LRU)
        self.by_hash: dict[int, int] = {}
        self.hits = 0  # prompt tokens served from cache
        #: Hashes stored and evicted, for routers (GET /kv_events).
        self.events = KvEvents()
        self.lookups = 0  # prompt tokens looked up

    # -- capacity -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take(self) -> int:
        if self.free:
            block = self.free.popleft()
        elif self.cached:
            block, h = self.cached.popitem(last=False)  # evict the least recently used
            del self.by_hash[h]
            self.events.removed(h)
            self.block_hash[block] = None
        else:
            raise OutOfBlocks()
        self.ref[block] = 1
        return block

    # -- lifecycle ------------------------------------------------------------------------
    def allocate(self, seq: Sequence) -> None:
        """Blocks for all of ``seq``'s tokens (its prompt, plus its output so far when it was
        preempted), reusing cached full blocks of the same prefix. Sets ``seq.num_computed``
        (at most len - 1: the last token is always computed, it yields the next one; when
        that token ends a shared block, it rewrites the same keys and values there). Raises
        OutOfBlocks, changing nothing."""
        prompt = seq.token_ids
        bs = self.block_size
        n_blocks = self.blocks_needed(len(prompt))
        hits: list[int] = []
        hashes: list[int] = []
        h = 0
        for i in range(len(prompt) // bs):
            h = block_hash(h, prompt[i * bs:(i + 1) * bs])
            block = self.by_hash.get(h)
            if block is None:
                break
            hits.append(block)
            hashes.append(h)
        fresh_needed = n_blocks - len(hits)
        reusable_from_lru = sum(1 for b in hits if self.ref[b] == 0)
        if fresh_needed > self.num_free - reusable_from_lru:
            raise OutOfBlocks()
        for block in hits:
            if self.ref[block] == 0:
                del self.cached[block]
            self.ref[block] += 1
        seq.block_table = hits + [self._take() for _ in range(fresh_needed)]
        seq.block_hashes = hashes
        cached = min(len(hits) * bs, len(prompt) - 1)
        seq.num_computed = cached
        if not seq.output_ids:  # first admission, not a recompute after preemption
            seq.num_cached = cached
            self.hits += cached
            self.lookups += len(prompt)

    def append_slots(self, seq: Sequence, num_new: int = 1) -> None:
        """Room for ``seq``'s next step: its last token plus ``num_new - 1`` draft tokens
        (positions up to ``num_tokens + num_new - 2``), new blocks where they cross a
        boundary. Raises OutOfBlocks, changing nothing."""
        needed = self.blocks_needed(seq.num_tokens + num_new - 1) - len(seq.block_table)
        if needed > self.num_free:
            raise OutOfBlocks()
        for _ in range(needed):
            seq.block_table.append(self._take())

    def commit(self, seq: Sequence) -> None:
        """Register ``seq``'s computed full blocks in the prefix cache (after a step). Only
        tokens below ``num_computed`` are hashed: with speculation, verified ones (rejected
        drafts leave keys and values beyond it, overwritten later, never shared)."""
        bs = self.block_size
        full = seq.num_computed // bs
        done = len(seq.block_hashes)
        if full <= done:
            return
        h = seq.block_hashes[-1] if done else 0
        for i in range(done, full):
            h = block_hash(h, seq.tokens(i * bs, (i + 1) * bs))
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if self.block_hash[block] is None and h not in self.by_hash:
                self.block_hash[block] = h
                self.by_hash[h] = block
                self.events.stored(h)

    def release(self, seq: Sequence) -> None:
        """Give back ``seq``'s blocks; hashed ones stay cached until their space is needed."""
        for block in reversed(seq.block_table):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                h = self.block_hash[block]
                if h is not None:
                    self.cached[block] = h
                else:
                    self.free.append(block)
        seq.block_table = []
        seq.block_hashes = []

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0
