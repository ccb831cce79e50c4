"""``POST /v1/messages/count_tokens``: Anthropic's token counting, through the gateway.

Any model a ``/v1/messages`` request may name counts: a configured one (exact, or by
pattern: the model table's lookup) or a router alias (the models of its tiers, strong tier
first). When its targets include an Anthropic upstream, the request goes to the first one
that is enabled (its ``model`` rewritten, the rest byte for byte) and its answer comes back
as it is. For any other model (an OpenAI-compatible one, the local engine), the gateway
counts itself, with the o200k_base BPE (bpe-openai, loaded once on a worker thread) over
the system prompt, the messages' text and the tool definitions, and says so in
``x-gateway-token-count: estimate``: close for clients that budget their context (Claude
Code does), not the model's own tokenizer. Errors are in Anthropic's format.

Each call counts against its key's requests per minute, as a model request does
(:func:`gateway.stages.rate_limit.charge_request`; over it, a 429 ``rate_limit_error``
with ``Retry-After``), before its body is read.

Bounded whatever the body: the count runs on a worker thread (the BPE, in Rust, lets go of
the GIL: the event loop keeps serving), over pieces of at most :data:`PIECE_CHARS`
characters (bpe-openai refuses a text of a million characters or more, or of more than
200,000 tokens, in one call). The body is at most ``server.max_body_bytes`` (10 MiB by
default), which the BPE counts in about 0.2 s on one core: measured, a 7 MB message took
0.14 s on the worker thread, the loop never waiting more than 8 ms meanwhile.
Reference: https://docs.anthropic.com/en/api/messages-count-tokens
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from typing import Any

import orjson
import structlog

from gateway.config import Target
from gateway.endpoint import request_id_of
from gateway.errors import GatewayError, ModelNotFound, NoUpstreamAvailable
from gateway.formats import anthropic
from gateway.formats.checks import invalid_type, load_request, missing
from gateway.http import (
    forward_request_headers,
    forward_response_headers,
    read_body,
    restrict_betas,
    send_bytes,
)
from gateway.requestlog import RequestRecord
from gateway.stages.rate_limit import charge_request
from gateway.state import Gateway
from gateway.types import Receive, Scope, Send
from gateway.upstreams.base import UpstreamRequest
from llm_wire.asgi import ClientDisconnected, run_until_disconnect

__all__ = ["PIECE_CHARS", "CountTokensEndpoint", "estimate_tokens"]

_JSON = (b"content-type", b"application/json")
#: Characters counted in one call of the BPE: at most 4 tokens a character (a UTF-8 byte is
#: at least a token's worth), so never past bpe-openai's 200,000 tokens or 1,000,000
#: characters a call. A cut inside a word may count it as two pieces: +1 token a piece.
PIECE_CHARS = 40_000

log = structlog.get_logger("gateway.count_tokens")


class CountTokensEndpoint:
    route = "/v1/messages/count_tokens"

    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        headers = scope["headers"]
        rec = RequestRecord(request_id_of(headers, gw.request_ids), self.route)
        rec.api = "anthropic"
        extra = [(b"x-request-id", rec.request_id.encode())]
        try:
            rec.key_id = gw.auth.check(headers)
            if gw.auth.betas and rec.key_id in gw.auth.betas:  # the key's betas only
                headers = restrict_betas(headers, gw.auth.betas[rec.key_id])
            limited, refusal = await charge_request(gw.rate_limiter, gw.policy, rec.key_id,
                                                    rec, anthropic=True)
            extra += limited
            if refusal is not None:
                raise refusal
            raw = await read_body(receive, gw.config.server.max_body_bytes)
            body = _parse(raw)
            rec.model_requested = body["model"]
            status, out_headers, payload = await run_until_disconnect(
                receive, self._count(raw, body, headers, rec))
            rec.status = status
            await send_bytes(send, status, payload, out_headers + extra)
        except ClientDisconnected:
            rec.cancelled, rec.status = True, 499
        except GatewayError as exc:
            await self._error(send, rec, exc, extra)
        except Exception:
            log.exception("unhandled_error", request_id=rec.request_id, route=self.route)
            await self._error(send, rec, GatewayError("internal gateway error"), extra)
        finally:
            rec.finish()
            gw.metrics.observe(rec)
            gw.logger.emit(rec)

    @staticmethod
    async def _error(send: Send, rec: RequestRecord, exc: GatewayError,
                     extra: list[tuple[bytes, bytes]]) -> None:
        rec.status, rec.error_type, rec.error_code = (anthropic.error_status(exc),
                                                      anthropic.error_type(exc), exc.code)
        headers = [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
        await send_bytes(send, rec.status, anthropic.error_body(exc),
                         [_JSON, *extra, *headers])

    async def _count(self, raw: bytes, body: dict[str, Any], headers: list[tuple[bytes, bytes]],
                     rec: RequestRecord) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        gw = self.gw
        targets = self._targets(body["model"])
        for target in targets:
            upstream = gw.upstreams[target.upstream]
            if upstream.api != "anthropic" or not upstream.enabled:
                continue
            payload = raw if target.model == body["model"] else \
                orjson.dumps({**body, "model": target.model})
            rec.upstream, rec.model_served = upstream.name, target.model
            request = UpstreamRequest("POST", "/v1/messages/count_tokens", payload,
                                      forward_request_headers(headers), False, rec.request_id)
            response = await upstream.send(request)
            return response.status, forward_response_headers(response.headers), response.body
        if not any(gw.upstreams[t.upstream].enabled for t in targets):
            raise NoUpstreamAvailable("no upstream is available for this model")
        count = await asyncio.to_thread(estimate_tokens, body)
        return 200, [_JSON, (b"x-gateway-token-count", b"estimate")], \
            orjson.dumps({"input_tokens": count})


    def _targets(self, model: str) -> tuple[Target, ...]:
        """The targets that count ``model``: its own (the model table's: exact, alias or
        pattern), or a router alias's tiers' models' (strong tier first), as the endpoint
        finds them; ModelNotFound (404) for any other name."""
        gw = self.gw
        try:
            return gw.models.resolve(model).targets
        except ModelNotFound:
            runtime = gw.runtime
            if model not in runtime.pipeline.aliases:
                raise
            routing = runtime.policy.routing
            router = routing.routers[model]
            return tuple(target for tier in (router.strong, router.weak)
                         for name in routing.tiers[tier]
                         for target in gw.models.resolve(name).targets)


def _parse(raw: bytes) -> dict[str, Any]:
    body = load_request(raw)
    model = body.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    return body


@functools.cache
def _encoding() -> Any:
    with warnings.catch_warnings():  # it reads its data with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        return bpe_openai.get_encoding("o200k_base")


def estimate_tokens(body: dict[str, Any]) -> int:
    """Tokens of a Messages request's text (system, messages, tool definitions) by
    o200k_base, plus a few per message for the turn framing. Blocks without text (images,
    documents) count nothing: this is an estimate. Any shape is counted (a field that is not
    what the API takes counts as its JSON, or nothing), never an error: the gateway only
    estimates. Each text is counted in pieces of :data:`PIECE_CHARS` characters."""
    texts: list[str] = []

    def add(content: Any) -> None:
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for block in content:
                if not isinstance(block, dict):
                    continue
                for key in ("text", "thinking"):
                    if isinstance(block.get(key), str):
                        texts.append(block[key])
                if "input" in block:
                    texts.append(orjson.dumps(block["input"]).decode())
                if "content" in block:
                    add(block["content"])

    add(body.get("system"))
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    for message in messages:
        if isinstance(message, dict):
            add(message.get("content"))
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else [tools] if tools else []:
        texts.append(orjson.dumps(tool).decode())
    encoding = _encoding()
    return sum(len(encoding.encode(t[i:i + PIECE_CHARS], disallowed_special=()))
               for t in texts for i in range(0, len(t), PIECE_CHARS)) + 3 * len(messages)
