"""Client-disconnect watchers: the work is cancelled when the client leaves, never before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llm_wire.asgi import ClientDisconnected, DisconnectWatch, DisconnectWatches


class Client:
    """An ASGI receive() after the body was read: nothing until the client leaves."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


async def watched(watches: DisconnectWatches, client: Client, work: asyncio.Future[str]) -> str:
    task = asyncio.current_task()
    assert task is not None
    with watches.watch(client.receive, task):
        return await work


async def test_a_client_that_leaves_cancels_the_work():
    watches, client = DisconnectWatches(grace_s=0.01), Client()
    work: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    request = asyncio.create_task(watched(watches, client, work))
    while not client.receives:  # the watcher starts after the grace period
        await asyncio.sleep(0.005)
    client.left.set()
    with pytest.raises(ClientDisconnected):
        await request
    assert work.cancelled()


async def test_short_requests_never_listen_and_the_sweep_stops_when_idle():
    watches, client = DisconnectWatches(grace_s=0.01), Client()
    for _ in range(100):
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        done.set_result("ok")
        assert await watched(watches, client, done) == "ok"
    assert client.receives == 0
    await asyncio.sleep(0.05)  # two sweeps: nothing in flight, no timer left
    assert watches._timer is None


async def test_work_that_finishes_as_the_client_leaves_keeps_its_result():
    watches, client = DisconnectWatches(grace_s=0.01), Client()
    work: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    request = asyncio.create_task(watched(watches, client, work))
    while not client.receives:
        await asyncio.sleep(0.005)
    work.set_result("answer")
    client.left.set()
    assert await request == "answer"


async def test_the_single_request_watch_has_the_same_contract():
    client = Client()
    work: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def run() -> str:
        with DisconnectWatch(client.receive, 0.01):
            return await work

    request = asyncio.create_task(run())
    while not client.receives:
        await asyncio.sleep(0.005)
    client.left.set()
    with pytest.raises(ClientDisconnected):
        await request
