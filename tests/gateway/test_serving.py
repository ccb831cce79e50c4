"""The server protocol sends each response head with its first body bytes, in order."""

from __future__ import annotations

import asyncio
import socket

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.serving import HeadCoalescingTransport
from gateway.testing.server import ServerThread


class RecordingTransport:
    """What a socket would be sent, one entry per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


async def test_head_and_body_go_out_in_one_write():
    raw = RecordingTransport()
    t = HeadCoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(HEAD)
    assert raw.writes == []
    t.write(b"ok")
    assert raw.writes == [HEAD + b"ok"]
    t.write(b"more")
    assert raw.writes == [HEAD + b"ok", b"more"]


async def test_a_head_with_no_body_yet_goes_out_at_the_end_of_the_loop_iteration():
    raw = RecordingTransport()
    t = HeadCoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(HEAD)
    await asyncio.sleep(0)
    assert raw.writes == [HEAD]
    t.write(b"ok")
    assert raw.writes == [HEAD, b"ok"]


async def test_close_sends_what_is_held_first_and_the_rest_is_the_transports():
    raw = RecordingTransport()
    t = HeadCoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(HEAD)
    t.close()
    assert raw.writes == [HEAD] and raw.closed
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert raw.writes == [HEAD]
    assert t.get_extra_info("peername") == "info:peername"


def test_responses_arrive_whole_over_a_real_socket_and_keep_alive():
    async def small(request):
        return JSONResponse({"ok": True})

    async def slow_stream(request):
        async def body():  # the head is sent before the first chunk exists
            await asyncio.sleep(0.05)
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/small", small), Route("/stream", slow_stream)])
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url) as client:
        for _ in range(3):  # one keep-alive connection, several responses
            assert client.get("/small").json() == {"ok": True}
        with client.stream("GET", "/stream") as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert b"".join(r.iter_bytes()) == b"data: 1\n\ndata: 2\n\n"
        # a raw HEAD request: a head and no body
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"HEAD /small HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        assert data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n")
