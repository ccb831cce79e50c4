"""The server protocol sends each response head with its first body bytes, in order, and
its lean cycle writes what uvicorn's would."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.serving import HeadCoalescingTransport, LeanCycle
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

    def get_extra_info(self, name: str, default: object = None) -> str:
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


def _cycle(cls: type[RequestResponseCycle], transport: RecordingTransport, method: str = "POST",
           keep_alive: bool = True) -> tuple[RequestResponseCycle, list[str]]:
    events: list[str] = []
    cycle = cls(
        scope={"type": "http", "method": method},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"), access_logger=logging.getLogger("test.access"),
        access_log=False, default_headers=[], message_event=asyncio.Event(),
        expect_100_continue=False, keep_alive=keep_alive,
        on_response=lambda: events.append("complete"))
    cycle.more_body = False  # the request was read whole (an answer before its end closes:
    return cycle, events  # tests/gateway/security/test_server_limits.py)


ANSWERS: list[tuple[str, bool, list[dict[str, Any]]]] = [
    ("POST", True, [  # a JSON answer, header names in any case
        {"type": "http.response.start", "status": 200, "headers": [
            (b"Content-Type", b"application/json"), (b"x-request-id", b"abc"),
            (b"content-length", b"2")]},
        {"type": "http.response.body", "body": b"ok"}]),
    ("POST", True, [  # a stream: chunked, an empty write midway, the end alone
        {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no")]},
        {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
        {"type": "http.response.body", "body": b"", "more_body": True},
        {"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False}]),
    ("POST", True, [  # the last bytes and the end in one message; connection: close
        {"type": "http.response.start", "status": 429,
         "headers": [(b"connection", b"Keep-Alive, Close"), (b"retry-after", b"1")]},
        {"type": "http.response.body", "body": b"x", "more_body": True},
        {"type": "http.response.body", "body": b"y"}]),
    ("POST", False, [  # no keep-alive; an explicit transfer-encoding
        {"type": "http.response.start", "status": 200,
         "headers": [(b"Transfer-Encoding", b"chunked")]},
        {"type": "http.response.body", "body": b"z"}]),
    ("POST", True, [{"type": "http.response.start", "status": 204, "headers": []},
                    {"type": "http.response.body", "body": b""}]),
    ("HEAD", True, [{"type": "http.response.start", "status": 200,
                     "headers": [(b"content-length", b"5")]},
                    {"type": "http.response.body", "body": b""}]),
]


@pytest.mark.parametrize(("method", "keep_alive", "messages"), ANSWERS)
async def test_the_lean_cycle_writes_what_uvicorns_writes(method, keep_alive, messages):
    seen = []
    for cls in (RequestResponseCycle, LeanCycle):
        raw = RecordingTransport()
        cycle, events = _cycle(cls, raw, method, keep_alive)
        for message in messages:
            await cycle.send(message)
        seen.append((raw.writes, raw.closed, events, cycle.response_complete,
                     cycle.keep_alive, cycle.message_event.is_set()))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("headers", [
    [(b"ok", b"1"), (b"bad name", b"1"), (b"x", b"bad\nvalue")],
    [(b"ok", b"1"), (b"x", b"bad\nvalue"), (b"bad name", b"1")],
    [(b"x", b"header\r\ninjected: 1")],
    [(b"x\x01", b"1")],
    [(b"content-length", b"2"), (b"content-length", b"two"), (b"x", b"\x7f")],
    [(b"content-length", b"two"), (b"x", b"\x7f")],
    [(b"content-length", b"two")],
])
async def test_the_lean_cycle_rejects_a_bad_header_as_uvicorn_does(headers):
    errors = []
    for cls in (RequestResponseCycle, LeanCycle):
        cycle, _ = _cycle(cls, RecordingTransport())
        with pytest.raises((RuntimeError, ValueError)) as exc:
            await cycle.send({"type": "http.response.start", "status": 200,
                              "headers": headers})
        errors.append(repr(exc.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("messages", [
    [{"type": "http.response.body", "body": b"early"}],
    [{"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]},
     {"type": "http.response.body", "body": b"too long"}],
    [{"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]},
     {"type": "http.response.body", "body": b"short"}],
    [{"type": "http.response.start", "status": 200, "headers": []},
     {"type": "http.response.body", "body": b""},
     {"type": "http.response.body", "body": b"after the end"}],
])
async def test_the_lean_cycle_refuses_what_uvicorn_refuses(messages):
    errors = []
    for cls in (RequestResponseCycle, LeanCycle):
        cycle, _ = _cycle(cls, RecordingTransport())
        with pytest.raises(RuntimeError) as exc:
            for message in messages:
                await cycle.send(message)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]


def test_the_server_answers_through_the_lean_cycle():
    senders = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        senders.append(type(getattr(send, "__self__", None)))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with ServerThread(app) as srv, httpx.Client(base_url=srv.url) as client:
        assert [client.get("/").text for _ in range(2)] == ["ok", "ok"]
    assert senders == [LeanCycle, LeanCycle]
