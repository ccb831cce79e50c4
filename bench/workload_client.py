"""The workload bench's client: replays a mix of streamed requests against one base URL (a
proxy, or the provider simulator itself for the direct path) as an application would, and
times each one.

- Open loop: each request is sent at its arrival time (``WorkRequest.t_s``, from the run's
  start), whatever the others are doing; an agent conversation's turn also waits for its
  previous turn's answer (an agent sends the next turn only then).
- Each request carries ``x-request-id: <its id>`` (a proxy passes it on; the simulator's
  record and the gateway's log are joined on it).
- TTFT: from sending the request to the first content of the answer (an OpenAI chunk with
  ``delta.content``, an Anthropic ``content_block_delta``); E2E: to the stream's last byte.
- Outcome: ``ok`` (the stream ended whole: ``[DONE]``, ``message_stop``), ``http_<status>``,
  ``cut`` (the stream ended without its terminal event, or the connection broke),
  ``error_event`` (an SSE error event), ``timeout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

__all__ = ["Result", "replay"]

#: Longest a request may take before it counts as ``timeout`` (s).
TIMEOUT_S = 120.0


@dataclass
class Result:
    """One request as the client saw it (times in ms from sending it)."""

    id: str
    kind: str
    api: str
    warmup: bool
    outcome: str = "ok"
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    text: str = ""
    text_sha: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)


def _urls(base: dict[str, str]) -> dict[str, str]:
    return {"openai": base["openai"].rstrip("/") + "/chat/completions",
            "anthropic": base["anthropic"].rstrip("/") + "/v1/messages"}


async def _one(session: aiohttp.ClientSession, url: str, req: Any, key: str) -> Result:
    res = Result(req.id, req.kind, req.api, req.warmup)
    headers = {"x-request-id": req.id, "content-type": "application/json"}
    if req.api == "anthropic":
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
    else:
        headers["authorization"] = f"Bearer {key}"
    started = time.perf_counter()
    texts: list[str] = []
    done = False
    try:
        async with session.post(url, data=orjson.dumps(req.body), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
            res.headers = {k.lower(): v for k, v in r.headers.items()
                           if k.lower().startswith(("x-gateway", "x-litellm", "x-cache"))}
            if r.status != 200:
                await r.read()
                res.outcome = f"http_{r.status}"
                return res
            event = ""
            async for raw in r.content:
                line = raw.strip()
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                    continue
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                kind = obj.get("type", event) if isinstance(obj, dict) else event
                if kind == "error" or (req.api == "openai" and "error" in obj):
                    res.outcome = "error_event"
                    return res
                piece = _content(req.api, obj, kind)
                if piece is not None:
                    if res.ttft_ms is None:
                        res.ttft_ms = (time.perf_counter() - started) * 1000
                    texts.append(piece)
                if req.api == "anthropic" and kind == "message_stop":
                    done = True
                _usage(req.api, obj, kind, res.usage)
        if not done:
            res.outcome = "cut"
    except TimeoutError:
        res.outcome = "timeout"
    except aiohttp.ClientError:
        res.outcome = "cut"
    finally:
        res.e2e_ms = (time.perf_counter() - started) * 1000
        res.text = "".join(texts)
        res.text_sha = hashlib.sha256(res.text.encode()).hexdigest()[:16]
    return res


def _content(api: str, obj: dict[str, Any], kind: str) -> str | None:
    if api == "openai":
        for choice in obj.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                return str(piece)
        return None
    if kind == "content_block_delta":
        delta = obj.get("delta") or {}
        return str(delta.get("text") or delta.get("partial_json") or "") or None
    return None


def _usage(api: str, obj: dict[str, Any], kind: str, into: dict[str, Any]) -> None:
    if api == "openai":
        if obj.get("usage"):
            into.update(obj["usage"])
    elif kind == "message_start":
        into.update((obj.get("message") or {}).get("usage") or {})
    elif kind == "message_delta" and obj.get("usage"):
        into.update(obj["usage"])


async def replay(requests: list[Any], base: dict[str, str], key: str,
                 speed: float = 1.0) -> list[Result]:
    """Send ``requests`` (WorkRequest, in arrival order) to ``base`` (``{"openai": URL with
    /v1, "anthropic": URL without}``) on their schedule (``t_s / speed`` s from now); the
    results in the same order."""
    urls = _urls(base)
    previous: dict[str, asyncio.Task[Result]] = {}  # conversation -> its latest turn
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def scheduled(req: Any, before: asyncio.Task[Result] | None) -> Result:
            delay = req.t_s / speed - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            if before is not None:
                await asyncio.shield(before)
            return await _one(session, urls[req.api], req, key)

        tasks = []
        for req in requests:
            before = previous.get(req.conversation) if req.conversation else None
            task = asyncio.create_task(scheduled(req, before))
            if req.conversation:
                previous[req.conversation] = task
            tasks.append(task)
        return list(await asyncio.gather(*tasks))
