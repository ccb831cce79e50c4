"""Issue 45, finding 6 and part of 10: one key's clients cannot hold the gateway's admission
slots for everyone. A client that never reads its stream is dropped after
``server.send_timeout_s`` (its upstream call cancelled, its slot freed, as on a
disconnect); with several gateway keys one key holds at most ``per_key_share`` of an
upstream's slots; ``x-gateway-priority`` raises a key's priority only where its policy
allows."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from gateway.concurrency import AdmissionPolicy
from gateway.stages.admission import ticket
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer

KEYS = "".join(f"""
[[auth.keys]]
id = "{name}"
sha256 = "{hashlib.sha256(f'sk-{name}'.encode()).hexdigest()}"
""" for name in ("team-a", "team-b"))
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def serve(make_gateway: Callable[..., GatewayServer]) -> Callable[..., GatewayServer]:
    """A gateway in a thread whose ``[server]`` also holds ``limits`` (TOML lines)."""
    def make(limits: str, policy: str = DEFAULT_POLICY, extra: str = "") -> GatewayServer:
        return make_gateway(extra, policy, server=limits)

    return make


def chat(gw: GatewayServer, key: str | None = None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer sk-{key}"
    return httpx.post(gw.v1 + "/chat/completions", json={"model": "fake-model",
                      "messages": MESSAGES}, headers=headers, timeout=10)


def until(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``check`` (state in other threads) until it is truthy."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)
    return result


def test_a_client_that_never_reads_its_stream_frees_its_slot_after_the_send_timeout(
        serve, fake: FakeUpstream):
    gw = serve("send_timeout_s = 0.3\n",
               DEFAULT_POLICY + "[admission]\nmax_concurrency = 1\nmax_queue = 0\n")
    # A stream of 32 MB (64 KB events), far more than the sockets' buffers hold (Linux
    # grows a socket's send buffer up to net.ipv4.tcp_wmem's maximum: 4 MB by default).
    body = orjson.dumps({"model": "fake-model", "messages": MESSAGES, "stream": True,
                         "response_format": {"type": "json_schema", "json_schema": {
                             "name": "big", "schema": {"type": "string",
                                                       "minLength": 32 << 20}}}})
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", gw.server.port))
    with reader:
        reader.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                       b"content-type: application/json\r\nx-fake-tokens: 512\r\n"
                       b"content-length: %d\r\n\r\n%b" % (len(body), body))
        # ... and never reads a byte of it.
        record = gw.logged(1)[0]
        assert record["status"] == 499 and record["cancelled"] is True
        fake.wait_for(lambda records: records[0].disconnected is not None)
        assert fake.records[0].chunks_sent < 512  # the upstream call was cut short
        assert chat(gw).status_code == 200  # the only slot is free again


def test_one_key_holds_at_most_its_share_of_the_slots(make_gateway, fake: FakeUpstream):
    """Two keys, two slots: team-a's second request waits for its own first to end while
    team-b is served (the default per_key_share, 0.5)."""
    gw = make_gateway(extra=KEYS, policy=DEFAULT_POLICY + "[admission]\nmax_concurrency = 2\n"
                      "max_queue_wait_ms = 1000\n")  # (under the upstream's 2 s read timeout)
    limiter = gw.gateway.dispatcher.guards["fake"].limiter
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, gw, "team-a", **{"x-fake-hold": "a"})
        fake.wait_for(lambda records: len(records) == 1)
        second: Future[httpx.Response] = pool.submit(chat, gw, "team-a",
                                                     **{"x-fake-hold": "a"})
        # it waits for a slot of its own (or, without the share, takes the second one)
        until(lambda: limiter.queue_depth or len(fake.records) == 2)
        other = chat(gw, "team-b")
        fake.release("a")
        assert other.status_code == 200
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert len(fake.records) == 3


def test_a_single_tenant_may_use_every_slot(make_gateway, fake: FakeUpstream):
    solo = f'[[auth.keys]]\nid = "solo"\nsha256 = "{hashlib.sha256(b"sk-solo").hexdigest()}"\n'
    gw = make_gateway(extra=solo, policy=DEFAULT_POLICY + "[admission]\nmax_concurrency = 2\n")
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(chat, gw, "solo", **{"x-fake-hold": "solo"}) for _ in range(2)]
        fake.wait_for(lambda records: len(records) == 2)  # both sent upstream at once
        fake.release("solo")
        assert [r.result().status_code for r in held] == [200, 200]


def test_a_key_cannot_raise_its_own_priority_to_evict_another_keys_requests(
        make_gateway, fake: FakeUpstream):
    """One slot, room for one waiter: team-b waits; team-a asking ``high`` would have it
    evicted. Its key may not raise its priority: team-a is the one shed, team-b served."""
    gw = make_gateway(extra=KEYS, policy=DEFAULT_POLICY + "[admission]\nmax_concurrency = 1\n"
                      "max_queue = 1\nmax_queue_wait_ms = 3000\n")
    limiter = gw.gateway.dispatcher.guards["fake"].limiter
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(chat, gw, "team-a", **{"x-fake-hold": "p"})
        fake.wait_for(lambda records: len(records) == 1)
        waiting = pool.submit(chat, gw, "team-b")
        until(lambda: limiter.queue_depth == 1)
        pushy = chat(gw, "team-a", **{"x-gateway-priority": "high"})
        fake.release("p")
        assert waiting.result().status_code == 200
        assert holder.result().status_code == 200
    assert pushy.status_code == 503 and pushy.headers["x-gateway-degraded"] == "queue_full"


def test_priority_may_be_lowered_by_anyone_and_raised_where_the_policy_allows():
    policy = AdmissionPolicy(key_priority={"batch": "low"},
                             key_max_priority={"vip": "high", "batch": "normal"})

    def asked(key: str | None, value: bytes) -> str:
        return ticket(policy, key, [(b"x-gateway-priority", value)], 10).priority

    assert asked("anyone", b"high") == "normal"  # not allowed: its own
    assert asked("anyone", b"low") == "low"  # lowering is always allowed
    assert asked("vip", b"high") == "high"
    assert asked("batch", b"high") == "normal"  # up to its ceiling
    assert asked("batch", b"normal") == "normal"
    assert asked(None, b"high") == "high"  # no gateway keys: one tenant, as asked
