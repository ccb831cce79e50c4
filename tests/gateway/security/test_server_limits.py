"""Issue 45, finding 4: what a client may hold at the door without using it. An attacker
with no key sends a huge header, leaves headers or bodies unfinished, or opens sockets and
sends nothing; each is bounded (431, 408, closed), and legitimate requests keep being
served. Over raw sockets, against the protocol ``gateway serve`` runs: in a thread with the
limits of the gateway's ``[server]`` (short ones, so each test waits well under a second),
or as ``gateway serve`` itself under a 256-descriptor limit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.testing.fake_upstream import FakeUpstream
from gateway.upstreams.ports import free_port
from tests.conftest import (
    DEFAULT_POLICY,
    FakeServer,
    GatewayServer,
    gateway_toml,
    wait_until_ready,
)

SHORT = """header_timeout_s = 0.3
body_timeout_s = 0.3
keep_alive_s = 0.3
"""
CHAT = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
def serve(make_gateway: Callable[..., GatewayServer]) -> Callable[..., GatewayServer]:
    """A gateway in a thread whose ``[server]`` also holds ``limits`` (TOML lines)."""
    def make(limits: str = SHORT, policy: str = DEFAULT_POLICY) -> GatewayServer:
        return make_gateway(policy=policy, server=limits)

    return make


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory,
           fake_server: FakeServer) -> Iterator[tuple[int, int]]:
    """``gateway serve`` with the default limits, in a process allowed 256 open files (the
    review's setup): its port and pid."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "policy.toml").write_text(DEFAULT_POLICY)
    (folder / "gateway.toml").write_text(gateway_toml(fake_server.url))
    port = free_port()
    process = subprocess.Popen(  # the soft limit lowered by the shell it starts from
        ["sh", "-c", 'ulimit -S -n 256 && exec "$0" "$@"',
         str(Path(sys.executable).parent / "gateway"), "serve", "--config",
         str(folder / "gateway.toml"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, timeout=30)
        yield port, process.pid
    finally:
        process.kill()
        process.wait()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port))


def until_closed(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took (s);
    fails if it is still open after ``timeout``."""
    started = time.monotonic()
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"still open after {timeout} s (received {data[:60]!r})")
    return data, time.monotonic() - started


def is_open(sock: socket.socket) -> bool:
    """Whether the server has not closed ``sock`` (what it sent is left to read)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""  # b"": the server closed it
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def answered(sock: socket.socket) -> bool:
    """Whether the server has sent something, or closed ``sock``."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0


def error_code(data: bytes) -> str:
    return str(orjson.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"])


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` from a thread (the server may answer and close before it is all sent)."""
    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def slowloris(sock: socket.socket) -> tuple[bytes, float]:
    """Send a head's bytes one every 50 ms, never its end, until the server answers (at
    most 3 s): what it sent until it closed, and how long that took (s)."""
    started = time.monotonic()
    try:
        while time.monotonic() - started < 3:
            sock.sendall(b"x")
            time.sleep(0.05)
            if answered(sock):
                break
    except OSError:
        pass
    data, _ = until_closed(sock)
    return data, time.monotonic() - started


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_32_mib_header_is_refused_with_431_and_the_connection_closed(served):
    port, _ = served
    with connect(port) as sock:
        sender = send_in_background(
            sock, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (32 << 20)
            + b"\r\n\r\n")
        data, _ = until_closed(sock)
        sender.join(10)
    assert status(data) == 431, data[:80]
    assert error_code(data) == "request_header_fields_too_large"
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


def test_four_unfinished_48_mib_headers_hold_no_memory(served):
    port, pid = served
    before = rss_bytes(pid)
    socks = [connect(port) for _ in range(4)]
    senders = [send_in_background(s, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: "
                                  + b"a" * (48 << 20)) for s in socks]
    for sender in senders:  # all sent (or the server hung up): whatever it holds, it holds
        sender.join(30)
    grown = rss_bytes(pid) - before
    try:
        assert grown < 32 << 20, f"the server grew {grown >> 20} MiB"
        assert [status(until_closed(s)[0]) for s in socks] == [431] * 4
    finally:
        for s in socks:
            s.close()


def test_idle_sockets_past_the_descriptor_limit_do_not_starve_requests(served):
    """280 unauthenticated sockets that send nothing, to a server allowed 256 files: the
    longest idle are closed to make room; a real request is answered at once."""
    port, _ = served
    idle = [connect(port) for _ in range(280)]
    try:
        started = time.monotonic()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=CHAT,
                       headers={"content-type": "application/json"}, timeout=3)
        assert r.status_code == 200 and time.monotonic() - started < 2
        assert not is_open(idle[0])  # the first went to make room
        assert is_open(idle[-1])
    finally:
        for s in idle:
            s.close()


def test_a_socket_that_sends_nothing_is_closed_after_the_header_timeout(serve):
    gw = serve()
    with connect(gw.server.port) as sock:
        data, took = until_closed(sock)
    assert data == b"" and 0.25 < took < 2


def test_a_header_sent_a_byte_at_a_time_gets_408_and_is_closed(serve):
    gw = serve()
    with connect(gw.server.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        data, took = slowloris(sock)
    assert status(data) == 408 and error_code(data) == "request_timeout" and took < 1


def test_a_stalled_body_upload_is_closed_and_ends_as_a_disconnect(serve):
    gw = serve()
    with connect(gw.server.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"mo")
        data, took = until_closed(sock)
    assert data == b"" and 0.25 < took < 2
    record = gw.logged(1)[0]
    assert record["status"] == 499 and record["cancelled"] is True


def test_a_slow_body_that_keeps_coming_is_not_cut(serve):
    """The body timeout is between reads (as nginx's client_body_timeout), not a total."""
    gw = serve()
    body = CHAT
    with connect(gw.server.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), len(body) // 4 + 1):  # ~0.6 s in all, 0.15 s apart
            time.sleep(0.15)
            sock.sendall(body[i:i + len(body) // 4 + 1])
        data, _ = until_closed(sock)
    assert status(data) == 200


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_s(serve):
    gw = serve()
    with connect(gw.server.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        data, took = until_closed(sock)
    assert status(data) == 200 and 0.25 < took < 2


def test_a_head_at_the_limit_passes_and_one_byte_more_gets_431(serve):
    gw = serve(SHORT + "max_header_bytes = 4096\n")

    def head(size: int) -> bytes:
        start = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" \
                b"content-type: application/json\r\ncontent-length: %d\r\nx-pad: " % len(CHAT)
        return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"

    assert len(head(4096)) == 4096
    answers = []
    for size in (4096, 4097):
        with connect(gw.server.port) as sock:  # the head and its body in one write
            sock.sendall(head(size) + CHAT)
            answers.append(until_closed(sock)[0])
    with connect(gw.server.port) as sock:  # a head over the limit, in small writes
        for i in range(0, 4097, 512):
            sock.sendall(head(4097)[i:i + 512])
        answers.append(until_closed(sock)[0])
    assert [status(a) for a in answers] == [200, 431, 431]


def test_at_the_connection_cap_the_longest_idle_connection_makes_room(serve, fake: FakeUpstream):
    gw = serve(SHORT.replace("0.3", "5") + "max_connections = 4\n")
    port = gw.server.port
    with ThreadPoolExecutor(2) as pool, httpx.Client(timeout=5) as client:
        busy = pool.submit(client.post, gw.v1 + "/chat/completions", content=CHAT, headers={
            "content-type": "application/json", "x-fake-hold": "cap"})
        fake.wait_for(lambda records: records)  # in progress: not idle
        idle = [connect(port) for _ in range(3)]
        time.sleep(0.05)
        with httpx.Client(timeout=5) as other:  # the fifth connection
            assert other.get(gw.url + "/healthz").status_code == 200
        assert [is_open(s) for s in idle] == [False, True, True]
        fake.release("cap")
        assert busy.result().status_code == 200
        for s in idle:
            s.close()


def test_when_no_connection_is_idle_a_new_one_is_refused_with_503(serve, fake: FakeUpstream):
    gw = serve(SHORT.replace("0.3", "5") + "max_connections = 2\n")
    with ThreadPoolExecutor(2) as pool:
        busy = [pool.submit(httpx.post, gw.v1 + "/chat/completions", content=CHAT, timeout=5,
                            headers={"content-type": "application/json",
                                     "x-fake-hold": "full"}) for _ in range(2)]
        fake.wait_for(lambda records: len(records) == 2)
        with connect(gw.server.port) as sock:
            data, _ = until_closed(sock)
        fake.release("full")
        assert [b.result().status_code for b in busy] == [200, 200]
    assert status(data) == 503
    assert b"x-gateway-degraded: connection_limit" in data


def test_one_client_address_past_its_cap_is_refused(serve):
    gw = serve(SHORT.replace("0.3", "5") + "max_connections_per_client = 2\n")
    first, second = connect(gw.server.port), connect(gw.server.port)
    with connect(gw.server.port) as third:
        data, _ = until_closed(third)
    assert status(data) == 503
    assert is_open(first) and is_open(second)
    first.close()
    second.close()


def test_a_pipelined_head_over_the_limit_ends_the_connection_after_the_answers_before_it(serve):
    gw = serve(SHORT + "max_header_bytes = 4096\n")
    with connect(gw.server.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"p" * 8192 + b"\r\n\r\n")
        data, _ = until_closed(sock)
    assert data.count(b"HTTP/1.1 ") == 1 and status(data) == 200


def test_an_answer_before_the_body_ends_closes_the_connection_after_the_client_reads_it(serve):
    """A 413 for a declared length past ``max_body_bytes`` goes out before the body: the
    connection is not reused (the rest of that body would be read as the next request, and a
    client that stopped its upload and sent its next request there would wait for ever), and
    it closes lingering, so the client reads the 413 rather than a reset. (Found by the fuzz:
    aiohttp reuses such a connection now and then, and its next request hung.)"""
    gw = serve()
    with connect(gw.server.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: 2000000\r\n\r\n"
                     + b"x" * 100_000)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"  # the next one
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                     % (len(CHAT), CHAT))
        data, took = until_closed(sock)
    assert status(data) == 413 and b"connection: close" in data.lower()
    assert data.count(b"HTTP/1.1 ") == 1 and took < 3  # never an answer from inside a body


def test_a_stalled_body_on_a_kept_alive_connection_is_closed_after_the_body_timeout(serve):
    """The body timeout holds for a connection's later requests too, not only its first
    (whose wait the connection's opening armed), however long keep-alive is."""
    gw = serve("header_timeout_s = 0.3\nbody_timeout_s = 0.3\nkeep_alive_s = 30\n")
    with connect(gw.server.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                     % (len(CHAT), CHAT))
        first = b""
        while b"\r\n\r\n" not in first or not first.endswith(b"}"):
            first += sock.recv(65536)
        time.sleep(0.5)  # past the first head's deadline: the connection waits on keep-alive
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"mo")
        data, took = until_closed(sock)
    assert status(first) == 200 and data == b"" and 0.25 < took < 2


def test_a_kept_alive_connections_next_head_sent_a_byte_at_a_time_gets_408(serve):
    gw = serve("header_timeout_s = 0.3\nbody_timeout_s = 0.3\nkeep_alive_s = 30\n")
    with connect(gw.server.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):
            first += sock.recv(65536)
        time.sleep(0.5)  # past the first head's deadline: the connection waits on keep-alive
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        data, took = slowloris(sock)
    assert status(first) == 200 and status(data) == 408 and took < 1


@pytest.mark.parametrize("method", [b"POST", b"HEAD"])
def test_a_client_still_uploading_when_answered_reads_the_answer_not_a_reset(serve, method):
    """A client sending a 2 MB body past ``max_body_bytes`` gets its answer (413; a HEAD's
    404, which uvicorn's own send writes) and no reset while its upload goes on: the close
    lingers until it is done."""
    gw = serve()
    with connect(gw.server.port) as sock:
        sock.sendall(b"%b /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: 2000000\r\n\r\n"
                     % method)
        sending = send_in_background(sock, b"x" * 2_000_000)
        sock.settimeout(10)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pytest.fail(f"reset after {data[:40]!r}")
        sending.join(10)
    assert status(data) == (413 if method == b"POST" else 404)
    assert b"connection: close" in data.lower()
