"""What a pool learns from each replica between requests: its health and load (its health
path, and vLLM's or SGLang's /metrics), and, for ``prefix_precise``, the blocks its prefix
cache holds (our engine's ``/kv_events``, local_engine.kv_events)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import aiohttp
import orjson

from gateway.replicas.config import PoolConfig
from gateway.replicas.health import Outlier
from gateway.replicas.load import from_health, from_metrics
from gateway.replicas.routing import Replica
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["Member", "read_events", "read_health"]

ERRORS = (OSError, aiohttp.ClientError, TimeoutError)


@dataclass(eq=False)
class Member:
    """One replica: its routing state, its HTTP upstream and its outlier record."""

    url: str
    state: Replica
    upstream: OpenAIUpstream
    outlier: Outlier
    epoch: str = ""  # its KV events read so far (prefix_precise)
    next_event: int = -1
    #: The requests it serves at once, when its /healthz says (our engine's "capacity").
    capacity: int | None = None

    @property
    def root(self) -> str:
        return self.url.removesuffix("/").removesuffix("/v1")


async def read_health(session: aiohttp.ClientSession, member: Member,
                      pool: PoolConfig) -> bool:
    """Whether the replica's health path answers 200 (vLLM's /health answers an empty
    one). Our engine's JSON also gives its load and KV size, which update ``member.state``
    (its ``reported`` load; the approximate index's bound); else its /metrics gauges the
    load."""
    try:
        async with session.get(member.root + pool.health_path) as resp:
            status, raw = resp.status, await resp.read()
    except ERRORS:
        return False
    if status != 200:
        return False
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    reported = from_health(body)
    if reported is None:  # vLLM, SGLang: their Prometheus gauges
        with contextlib.suppress(*ERRORS):
            async with session.get(member.root + "/metrics") as resp:
                if resp.status == 200:
                    reported = from_metrics((await resp.read()).decode(errors="replace"))
    if reported is not None:
        member.state.reported = reported
    capacity = body.get("capacity") if isinstance(body, dict) else None
    member.capacity = capacity if isinstance(capacity, int) and capacity >= 1 else None
    load = body.get("load") if isinstance(body, dict) else None
    if isinstance(load, dict):
        blocks, size = load.get("kv_blocks"), load.get("block_size")
        if isinstance(blocks, int) and isinstance(size, int):
            member.state.sent.capacity = int(blocks * size * pool.bytes_per_token
                                             ) // pool.block_bytes
    return True


async def read_events(session: aiohttp.ClientSession, member: Member) -> int | None:
    """Mirror the replica's prefix cache into ``member.state.held`` from its KV events (a
    snapshot when this gateway fell behind or the engine restarted); returns the engine's
    block size (tokens), None when it did not answer (its health path judges it; the
    index waits for the next read)."""
    url = f"{member.root}/kv_events?since={member.next_event}&epoch={member.epoch}"
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            body = orjson.loads(await resp.read())
        held = member.state.held
        if "snapshot" in body:
            held.clear()
            held.add(body["snapshot"])
        else:
            for op, h in body["events"]:
                if op:
                    held.add((h,))
                else:
                    held.remove((h,))
        member.epoch, member.next_event = body["epoch"], body["next"]
        return int(body["block_size"])
    except (*ERRORS, ValueError, KeyError, TypeError):
        return None
