"""EmbeddingMemo: one embedding per text and request, however many stages ask at once."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

from gateway.app import EMBEDDING_NICE, _in_background_thread
from gateway.embedding import EmbeddingMemo


class Embedder:
    """Counts calls; each waits until the test opens ``go`` (then answers or fails)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.go = asyncio.Event()
        self.fail = fail

    async def __call__(self, text: str) -> np.ndarray | None:
        self.calls += 1
        await self.go.wait()
        if self.fail:
            raise RuntimeError("embedder down")
        return np.array([len(text)], np.float32)


def test_two_stages_asking_at_once_share_one_embedding() -> None:
    async def main() -> None:
        memo, embed = EmbeddingMemo(), Embedder()
        first = asyncio.ensure_future(memo.compute("hello", embed))
        second = asyncio.ensure_future(memo.compute("hello", embed))
        await asyncio.sleep(0)
        assert embed.calls == 1 and memo.get("hello") is None
        embed.go.set()
        a, b = await asyncio.gather(first, second)
        assert a is b and memo.get("hello") is a
        assert await memo.compute("hello", embed) is a and embed.calls == 1

    asyncio.run(main())


def test_a_failed_embedding_is_none_for_all_and_tried_again_later() -> None:
    async def main() -> None:
        memo, broken = EmbeddingMemo(), Embedder(fail=True)
        first = asyncio.ensure_future(memo.compute("x", broken))
        waiter = asyncio.ensure_future(memo.compute("x", broken))
        await asyncio.sleep(0)
        broken.go.set()
        try:
            await first
        except RuntimeError:
            pass
        assert await waiter is None and broken.calls == 1
        working = Embedder()
        working.go.set()
        vector = await memo.compute("x", working)
        assert vector is not None and working.calls == 1

    asyncio.run(main())


def test_a_waiter_that_leaves_does_not_cancel_the_embedding() -> None:
    async def main() -> None:
        memo, embed = EmbeddingMemo(), Embedder()
        owner = asyncio.ensure_future(memo.compute("t", embed))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(memo.compute("t", embed))
        await asyncio.sleep(0)
        waiter.cancel()
        embed.go.set()
        assert (await owner) is not None and memo.get("t") is not None

    asyncio.run(main())


def _nice_of(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux per-thread nice")
def test_the_embedding_threads_run_below_the_event_loop() -> None:
    # The gateway's embedder is loaded and started on a thread at nice 19: the threads it
    # starts (ONNX Runtime's pool, the engine thread) inherit it; the caller keeps its own.
    def loader() -> tuple[int, int]:
        child: list[int] = []
        thread = threading.Thread(target=lambda: child.append(
            _nice_of(threading.get_native_id())))
        thread.start()
        thread.join()
        return _nice_of(threading.get_native_id()), child[0]

    mine = _nice_of(threading.get_native_id())
    low = max(mine, EMBEDDING_NICE)
    assert _in_background_thread(loader) == (low, low)
    assert _nice_of(threading.get_native_id()) == mine
    with pytest.raises(ValueError, match="no model"):
        _in_background_thread(lambda: int("no model"))
