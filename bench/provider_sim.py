"""A provider simulator for the workload bench (issue 47): OpenAI Chat Completions and
Anthropic Messages, streamed and not, with a stated latency model, each provider's prompt
caching, rate limits, faults and billing. Its own process, so a proxy's CPU is measured apart.

    python -m bench.provider_sim --port N [--params JSON|FILE] [--record FILE] [--show-params]

prints one line ``READY http://127.0.0.1:N`` once listening (``--port 0``: a free port), then
serves until SIGTERM/SIGINT. Routes:

- ``POST /v1/chat/completions``: ``Authorization: Bearer KEY``; ``stream`` with
  ``stream_options.include_usage`` as OpenAI sends it;
- ``POST /v1/messages``: ``x-api-key`` (or Bearer) and ``anthropic-version`` required; more
  than 4 ``cache_control`` breakpoints: 400;
- an unknown model, or one of the other API: 404 in the provider's format;
- ``GET /sim/stats``: ``{"params": SimParams.to_dict(), "requests": [...]}``, one record per
  request (:data:`STATS_FIELDS`); ``POST /sim/reset`` (optional ``{"seed": n}``)
  clears caches, limits and stats.

The model (defaults and their public sources in :mod:`bench.provider_sim_params`):

- TTFT = (base_ms + ms_per_uncached_token x uncached input + ms_per_cached_token x cached
  input) x lognormal(0, ttft_sigma), x tail_factor for a tail_share of requests (the issue's
  300 ms + 0.25 ms/token, 2% x8); then one token per event every tpot_ms (15 ms; a request's
  pace varies by lognormal(0, tpot_sigma)).
- Prompt caching: :mod:`gateway.testing.cache_sim` per organisation (= API key): OpenAI's
  routing by prefix and ``prompt_cache_key`` plus its overflow past ~15 requests a minute
  (:class:`bench.provider_sim_engine.OverflowOpenAICache`); Anthropic's breakpoints. Cached
  tokens cut TTFT and cost. Tokens are o200k_base for both APIs.
- Rate limits per (key, model), token buckets refilled continuously: OpenAI RPM and TPM, a
  request costing its prompt + max_tokens (out_max when absent) at admission; Anthropic RPM,
  ITPM (uncached input + cache writes; reads are free) and OTPM (max_tokens at admission, the
  rest given back when the answer ends). Over a limit: 429 with ``retry-after`` (s; OpenAI
  also ``retry-after-ms``). Simplification: the prompt cache is read and written before
  admission, so a refused request still warms it.
- Draws (fault, TTFT noise and tail, pace) per request, seeded by the seed, what the request
  says and how many times it came before (``Engine._draws``): every path of a run draws the
  same for the same request, whatever its proxy served itself; a retry draws anew.
- Faults, shares of admitted requests: 500; overloaded (Anthropic
  529 ``overloaded_error``, OpenAI 503); stalls (TTFT x stall_factor, or a pause of
  stall_pause_ms mid-stream); cut streams (the connection dropped after k tokens, no terminal
  event; billed for the tokens sent).
- Answers: words from a hash of (seed, model, system + messages + tools), n in
  [out_min, out_max], cut by max_tokens (finish ``length`` / stop_reason ``max_tokens``);
  always text. Billing per :class:`bench.provider_sim_params.ModelSpec` prices.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

import orjson
import uvicorn

from bench.provider_sim_engine import Engine, Plan, SimError, cost_usd, key_id
from bench.provider_sim_params import SimParams
from bench.provider_sim_wire import (
    Event,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_error,
    openai_stream,
)
from gateway.types import Receive, Scope, Send

__all__ = ["STATS_FIELDS", "ProviderSim", "SimParams", "key_id", "main"]

_API = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}
_SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie"}

#: What each ``/sim/stats`` request record holds. Tokens: prompt = input + cached + write.
STATS_FIELDS = {
    "t": "arrival, s since start or the last reset",
    "api": '"openai" | "anthropic"', "model": "as asked", "key": "key_id(API key)",
    "status": "HTTP status answered", "stream": "bool",
    "fault": 'null | "429" | "500" | "503" (OpenAI overloaded) | "529" | "stall" | "cut"',
    "prompt_tokens": "the whole prompt", "input_tokens": "uncached, billed at the input price",
    "cached_tokens": "cache reads", "cache_write_tokens": "Anthropic cache writes",
    "output_tokens": "answer tokens sent (billed, also when cut or abandoned)",
    "cost_usd": "billed for this request", "ttft_ms": "the model's TTFT (drawn)",
    "served_ttft_ms": "measured: arrival to the first answer token sent (non-streamed: the "
                      "whole answer)",
    "duration_ms": "arrival to the end", "finish": '"stop" | "length" | null (cut, abandoned)',
    "client_closed": "the client left before the end", "body_sha256": "of the raw body",
}


class CutStream(Exception):
    """Raised mid-response to make the server drop the connection (a cut stream)."""


class _QuietCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CutStream))


class ProviderSim:
    """The ASGI app. ``record``: a file each request is appended to as a JSON line
    ``{"t", "path", "headers" (lowercased, secrets removed), "body"}``."""

    def __init__(self, params: SimParams | None = None, record: IO[bytes] | None = None) -> None:
        self.params = params or SimParams()
        self.engine = Engine(self.params)
        self.record = record
        self.t0 = time.monotonic()
        self.requests: list[dict[str, Any]] = []

    def reset(self, seed: int | None = None) -> None:
        self.engine.reset(self.params.seed if seed is None else seed)
        self.requests, self.t0 = [], time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        if path == "/sim/stats" and method == "GET":
            return await _json(send, 200, {"params": self.params.to_dict(),
                                           "requests": self.requests})
        if path == "/sim/reset" and method == "POST":
            seed = orjson.loads(raw).get("seed") if raw.strip() else None
            self.reset(seed)
            return await _json(send, 200, {"ok": True, "seed": self.engine.seed})
        api = _API.get(path) if method == "POST" else None
        if api is None:
            return await _json(send, 404, {"error": {"message": f"Unknown path {path}",
                                                     "type": "invalid_request_error"}})
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch(receive, gone))
        try:
            await self._serve(api, path, headers, raw, send, gone)
        finally:
            watcher.cancel()

    async def _serve(self, api: str, path: str, headers: dict[str, str], raw: bytes, send: Send,
                     gone: asyncio.Event) -> None:
        start = time.monotonic()
        rid = f"req_sim{uuid.uuid4().hex[:20]}"
        ids = [(b"x-request-id" if api == "openai" else b"request-id", rid.encode())]
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if self.record is not None:
            self.record.write(orjson.dumps({"t": start - self.t0, "path": path, "headers": {
                k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
                "body": body}) + b"\n")
            self.record.flush()
        log = {"t": round(start - self.t0, 6), "api": api, "model": None, "key": None,
               "status": 200, "fault": None, "stream": False, "prompt_tokens": 0,
               "input_tokens": 0, "cached_tokens": 0, "cache_write_tokens": 0,
               "output_tokens": 0, "cost_usd": 0.0, "ttft_ms": None, "served_ttft_ms": None,
               "duration_ms": None,
               "finish": None, "client_closed": False,
               "body_sha256": hashlib.sha256(raw).hexdigest()}
        self.requests.append(log)
        try:
            key = _check(api, headers, body)
            log.update(key=key_id(key), model=body["model"], stream=bool(body.get("stream")))
            model = self.params.model(body["model"])
            if model is None or model.api != api:
                raise SimError(404, "not_found_error", f"model: {body['model']}" if api ==
                               "anthropic" else f"The model `{body['model']}` does not exist "
                               "or you do not have access to it.")
            try:
                plan = self.engine.plan(api, key, model, body)
            except (AttributeError, TypeError, KeyError) as exc:  # a malformed message
                raise SimError(400, "invalid_request_error", f"malformed request: {exc}") from exc
        except SimError as exc:
            log.update(status=exc.status, fault=exc.fault)
            if exc.status in (500, 503, 529):
                await asyncio.sleep(self.params.error_delay_ms / 1000)
            err = openai_error(exc) if api == "openai" else anthropic_error(exc, rid)
            await _json(send, exc.status, err, ids + exc.headers)
            log["duration_ms"] = round((time.monotonic() - start) * 1000, 3)
            return
        log.update(fault=plan.fault, prompt_tokens=plan.prompt_tokens,
                   input_tokens=plan.input_tokens, cached_tokens=plan.cached_tokens,
                   cache_write_tokens=sum(plan.cache_write.values()),
                   ttft_ms=round(plan.ttft_ms, 3))
        sent = 0
        try:
            if body.get("stream"):
                events = (openai_stream(plan, model.name, bool(
                    (body.get("stream_options") or {}).get("include_usage")))
                    if api == "openai" else anthropic_stream(plan, model.name))
                sent = await self._stream(events, plan, start, send, ids, gone, log)
            else:
                sent = await self._whole(api, plan, model.name, start, send, ids, gone, log)
        except CutStream:
            sent = plan.cut_at
            raise
        finally:
            self.engine.settle(key, plan, sent)
            log.update(output_tokens=sent, client_closed=gone.is_set(),
                       finish=None if sent < len(plan.words) else
                       ("stop" if plan.finished else "length"),
                       cost_usd=cost_usd(model, plan.input_tokens, plan.cached_tokens,
                                         plan.cache_write, sent),
                       duration_ms=round((time.monotonic() - start) * 1000, 3))

    async def _stream(self, events: list[Event], plan: Plan, start: float, send: Send,
                      ids: list[tuple[bytes, bytes]], gone: asyncio.Event,
                      log: dict[str, Any]) -> int:
        """Sends ``events`` paced by the plan; returns the answer tokens sent."""
        first = start + plan.ttft_ms / 1000
        if await _sleep_until(first, gone):
            return 0
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), *ids]})
        sent, due = 0, first
        for data, tokens in events:
            if tokens:
                if sent == plan.cut_at:
                    raise CutStream
                if sent == plan.pause_at:
                    due += plan.pause_ms / 1000
                if sent and await _sleep_until(due, gone):
                    return sent
                due += plan.tpot_ms / 1000
            if gone.is_set():
                return sent
            await send({"type": "http.response.body", "body": data, "more_body": True})
            if tokens and not sent:
                log["served_ttft_ms"] = round((time.monotonic() - start) * 1000, 3)
            sent += tokens
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return sent

    async def _whole(self, api: str, plan: Plan, model: str, start: float, send: Send,
                     ids: list[tuple[bytes, bytes]], gone: asyncio.Event,
                     log: dict[str, Any]) -> int:
        n = len(plan.words) if plan.cut_at < 0 else plan.cut_at
        done = start + (plan.ttft_ms + plan.tpot_ms * max(n - 1, 0)
                        + (plan.pause_ms if plan.pause_at >= 0 else 0)) / 1000
        if await _sleep_until(done, gone):
            return n
        if plan.cut_at >= 0:  # a response started and dropped mid-body
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"), (b"content-length", b"100000"), *ids]})
            await send({"type": "http.response.body", "body": b'{"id": "', "more_body": True})
            raise CutStream
        answer = openai_completion(plan, model) if api == "openai" else anthropic_message(
            plan, model)
        await _json(send, 200, answer, ids)
        log["served_ttft_ms"] = round((time.monotonic() - start) * 1000, 3)
        return n


def _check(api: str, headers: dict[str, str], body: Any) -> str:
    """The API key; raises SimError 401/400 as the provider would."""
    bearer = headers.get("authorization", "")
    key = bearer[7:] if bearer.lower().startswith("bearer ") else ""
    if api == "anthropic":
        key = headers.get("x-api-key") or key
        if not key:
            raise SimError(401, "authentication_error", "x-api-key header is required")
        if not headers.get("anthropic-version"):
            raise SimError(400, "invalid_request_error", "anthropic-version: header is required")
    elif not key:
        raise SimError(401, "invalid_request_error", "You didn't provide an API key.")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise SimError(400, "invalid_request_error", "model: field required")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise SimError(400, "invalid_request_error", "messages: at least one message is required")
    if api == "anthropic" and not (isinstance(body.get("max_tokens"), int)
                                   and body["max_tokens"] > 0):
        raise SimError(400, "invalid_request_error", "max_tokens: field required")
    return key


async def _watch(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _sleep_until(when: float, gone: asyncio.Event) -> bool:
    """Sleeps until ``when`` (monotonic s); True if the client left first."""
    delay = when - time.monotonic()
    if delay > 0:
        try:
            await asyncio.wait_for(gone.wait(), delay)
        except TimeoutError:
            pass
    return gone.is_set()


async def _json(send: Send, status: int, obj: Any,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(obj)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def _params(text: str | None) -> SimParams:
    if not text:
        return SimParams()
    path = Path(text)
    raw = path.read_text() if not text.lstrip().startswith("{") and path.exists() else text
    return SimParams.from_dict(orjson.loads(raw))


async def _serve(app: ProviderSim, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=1, backlog=4096)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        print(f"READY http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.provider_sim",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: a free port (default)")
    parser.add_argument("--params", help="SimParams overrides: a JSON object, or a file of one")
    parser.add_argument("--record", help="append each request as a JSON line to this file")
    parser.add_argument("--show-params", action="store_true",
                        help="print the parameters (defaults + --params) as JSON and exit")
    args = parser.parse_args(argv)
    try:
        params = _params(args.params)
    except (ValueError, TypeError, OSError) as exc:
        print(f"provider_sim: bad --params: {exc}", file=sys.stderr)
        return 2
    if args.show_params:
        print(orjson.dumps(params.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return 0
    logging.getLogger("uvicorn.error").addFilter(_QuietCuts())
    record = open(args.record, "ab") if args.record else None  # noqa: SIM115 (process-long)
    app = ProviderSim(params, record)
    app.engine.tokenizer.count("load the BPE before the first request")
    try:
        asyncio.run(_serve(app, args.port))
    finally:
        if record is not None:
            record.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
