"""A path-recording, header-echoing fake provider for the door's security tests (raw ASGI).

It records every request as it arrived on the wire (method, raw path, query, headers) and
answers as one provider account would, whoever calls with its key: every tenant behind a
gateway shares that account, which is what the tests probe.

- ``POST .../chat/completions``: a chat completion without ``usage`` (so a rate limit's
  token reservation stands); ``POST .../messages``: an Anthropic message.
- ``/files``, ``/batches`` (under any base path): one shared store. ``POST`` creates
  (``file-N`` from a multipart or any body; ``batch_N`` from ``{"input_file_id"}``, its
  ``output_file_id`` a new file), ``GET`` lists all or reads one, ``DELETE`` deletes,
  ``GET /files/{id}/content`` its bytes; an unknown id is OpenAI's 404.
- a request with ``x-rec-error-type``: a 500 with that error ``type``; anything else: 200
  and the request echoed as JSON (``method``, ``path``, ``raw_path``, ``query``,
  ``headers``).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.types import Receive, Scope, Send

__all__ = ["Recorder", "Seen"]


@dataclass
class Seen:
    method: str
    path: str
    raw_path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    seen: list[Seen] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    contents: dict[str, bytes] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()
            self.objects.clear()
            self.contents.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = Seen(scope["method"], scope["path"], scope.get("raw_path", b"").decode("latin-1"),
                    scope.get("query_string", b"").decode("latin-1"),
                    {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
                    body)
        with self._lock:
            self.seen.append(seen)
        status, answer = self._answer(seen)
        payload = answer if isinstance(answer, bytes) else orjson.dumps(answer)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    def _answer(self, seen: Seen) -> tuple[int, Any]:
        parts = seen.path.strip("/").split("/")
        method = seen.method
        if "x-rec-error-type" in seen.headers:
            return 500, {"error": {"message": "boom", "type": seen.headers["x-rec-error-type"],
                                   "code": None}}
        if method == "POST" and seen.path.endswith("/chat/completions"):
            return 200, {"id": "chatcmpl-rec", "object": "chat.completion", "created": 0,
                         "model": "upstream-model", "choices": [{
                             "index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi"}}]}
        if method == "POST" and seen.path.endswith("/messages"):
            return 200, {"id": "msg_rec", "type": "message", "role": "assistant",
                         "model": "upstream-model", "stop_reason": "end_turn",
                         "stop_sequence": None, "content": [{"type": "text", "text": "hi"}],
                         "usage": {"input_tokens": 3, "output_tokens": 1}}
        for collection in ("files", "batches"):
            if collection in parts:
                return self._store(collection, parts[parts.index(collection) + 1:], seen)
        return 200, {"method": method, "path": seen.path, "raw_path": seen.raw_path,
                     "query": seen.query, "headers": seen.headers}

    def _store(self, collection: str, rest: list[str], seen: Seen) -> tuple[int, Any]:
        with self._lock:
            if not rest and seen.method == "POST":
                return 200, self._create(collection, seen.body)
            if not rest:
                kind = {"files": "file", "batches": "batch"}[collection]
                data = [o for o in self.objects.values() if o["object"] == kind]
                return 200, {"object": "list", "data": data, "has_more": False,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None}
            obj = self.objects.get(rest[0])
            if obj is None:
                return 404, {"error": {"message": f"No such object: {rest[0]}",
                                       "type": "invalid_request_error", "code": None}}
            if seen.method == "DELETE":
                del self.objects[rest[0]]
                return 200, {"id": rest[0], "object": obj["object"], "deleted": True}
            if rest[1:] == ["content"]:
                return 200, self.contents.get(rest[0], b"")
            return 200, obj

    def _create(self, collection: str, body: bytes) -> dict[str, Any]:
        n = next(self._ids)
        obj: dict[str, Any]
        if collection == "files":
            oid = f"file-rec{n:04d}"
            obj = {"id": oid, "object": "file", "bytes": len(body)}
            self.contents[oid] = body
        else:
            out = f"file-out{n:04d}"
            self.objects[out] = {"id": out, "object": "file", "bytes": 0}
            self.contents[out] = b"batch output"
            request = orjson.loads(body) if body else {}
            oid = f"batch_rec{n:04d}"
            obj = {"id": oid, "object": "batch",
                   "input_file_id": request.get("input_file_id"), "output_file_id": out}
        self.objects[oid] = obj
        return obj
