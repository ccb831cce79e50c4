"""Resumable streams on replicas sharing a Redis: a client whose connection to one replica
dropped resumes on another, which reads the copy (live while the first still streams, and
holds the first's upstream meanwhile); another key's stream is still a 404."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.redis_server import RedisServer
from tests.conftest import GatewayServer
from tests.gateway.test_resume import CHAT, KEYS, RESUME, TEXT, chat_text, events, first_leg


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def replicas(make_gateway: Callable[..., GatewayServer], redis: RedisServer, grace: int
             ) -> tuple[GatewayServer, GatewayServer]:
    keys = KEYS.format(a=hashlib.sha256(b"key-a").hexdigest(),
                       b=hashlib.sha256(b"key-b").hexdigest())
    shared = f'{keys}\n[streams]\nstore = "redis"\nredis_url = "{redis.url}"\n'
    policy = RESUME.format(grace=grace)
    return make_gateway(shared, policy=policy), make_gateway(shared, policy=policy)


ALICE = {"authorization": "Bearer key-a"}


def copied(server: RedisServer, sid: str, timeout_s: float = 5.0) -> None:
    """Until the stream's copy exists in Redis (its writer runs after the answer's bytes)."""
    client = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + timeout_s
    while not client.exists(f"gwstream:{sid}:m"):
        assert time.monotonic() < deadline, "the stream was never copied to Redis"
        time.sleep(0.01)
    client.close()


def test_a_client_resumes_on_another_replica_which_holds_the_upstream_while_it_reads(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    first, second = replicas(make_gateway, redis_server, grace=100)
    slow = {**ALICE, "x-fake-itl-ms": "60", "x-fake-tokens": "12"}  # ~0.7 s
    sid, read = first_leg(first, 2, slow)
    got = events(read)
    rest = httpx.post(second.v1 + "/chat/completions", json=CHAT, timeout=10, headers={
        **ALICE, "x-gateway-stream-id": sid, "last-event-id": str(got[-1][0])})
    assert rest.status_code == 200
    missed = events(rest.text)
    assert [i for i, _ in got + missed] == list(range(len(got) + len(missed)))
    assert missed[-1][1] == "data: [DONE]"
    assert fake.records[-1].disconnected is None  # read on the second, past the grace
    theirs = httpx.post(second.v1 + "/chat/completions", json=CHAT, timeout=10, headers={
        "authorization": "Bearer key-b", "x-gateway-stream-id": sid})
    assert theirs.status_code == 404


def test_an_ended_stream_replays_from_redis_on_any_replica(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
        redis_server: RedisServer) -> None:
    first, second = replicas(make_gateway, redis_server, grace=5000)
    with httpx.Client(timeout=10) as c:
        r = c.post(first.v1 + "/chat/completions", json=CHAT, headers=ALICE)
        sid = r.headers["x-gateway-stream-id"]
        copied(redis_server, sid)
        replay = c.post(second.v1 + "/chat/completions", json=CHAT, headers={
            **ALICE, "x-gateway-stream-id": sid, "last-event-id": "-1"})
    assert replay.text == r.text and chat_text(replay.text) == TEXT
