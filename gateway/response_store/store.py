"""The response store of ``/v1/responses``: chained requests rebuilt, answers kept.

Before the pipeline, :meth:`ResponseStore.resolve` reads a request's
``previous_response_id``: the stored record of that response (the conversation up to it:
its input items, then its output items) is put before the request's own ``input``, and
the id is dropped, so that every stage (the cache's keys, the router, prompt caching) and
every upstream sees the whole conversation, as it would have been sent without the id.
``instructions`` are the request's own: a previous response's are not carried over, as
OpenAI does. The rebuilt prefix is the same bytes at every turn (items as stored, their
ids and statuses left out), so a provider's prompt cache keeps hitting it. When the
previous response was served by an upstream that keeps responses itself (OpenAI, a
``native_responses`` upstream), that upstream is sent the client's request as it was,
``previous_response_id`` and all (:class:`~gateway.context.UpstreamState`); any other target
gets the rebuilt one. An id the store does not hold for the caller's key is refused: 400
``previous_response_not_found``, as OpenAI answers. Tenants share the upstream's key, so an
id forwarded to it would continue whichever conversation it names, another key's too: only
a gateway without keys (one tenant, who holds the whole upstream key's reach anyway)
forwards an unknown id to a model's native upstream, where the conversation may be kept.
For the same reason a ``conversation`` (an object OpenAI keeps) is refused with gateway keys.

After the pipeline, :meth:`ResponseStore.keep` stores the answer once the client has it
whole (a whole ``response``, or a stream's ``response.completed`` / ``response.incomplete``
event), unless the request says ``store: false``: never an error, a failed or cancelled
stream. Records are per gateway key (one key can never read another's) and expire after
``[responses] ttl_s``.

Record (JSON): ``response`` (the object as the client got it, ``previous_response_id``
set), ``items`` (the conversation's input items, ids given where the client gave none),
``upstream`` (the upstream that made it natively, or null).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from gateway.context import Outcome, Reply, RequestContext, UpstreamState
from gateway.errors import InvalidRequest
from gateway.formats.ids import random_hex
from gateway.formats.responses_stream import final_response
from gateway.formats.translator import load_object
from gateway.response_store.records import MemoryRecords, Records, StoreUnavailable
from gateway.upstreams.base import Upstream

__all__ = ["ResponseStore", "Turn", "context_items"]

log = structlog.get_logger("gateway.responses")

#: What a response id may look like (anything else is not found, never a key pattern).
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
           "reasoning": "rs_"}


@dataclass(slots=True)
class Turn:
    """One request's part in its conversation: ``items``, the input it was answered from
    (the conversation before it, then its own input; each item with an id); ``previous``,
    the id it continues."""

    key: str
    items: list[dict[str, Any]]
    previous: str | None
    store: bool
    response: dict[str, Any] | None = None
    #: The gateway key whose record it becomes ("" without keys).
    tenant: str = ""


def _normal(item: dict[str, Any]) -> dict[str, Any]:
    """An input item in the shape the store keeps (and OpenAI's ``input_items`` lists): a
    ``type``; a message's text content as parts; an id."""
    out = dict(item)
    kind = out.setdefault("type", "message")
    if kind == "message" and isinstance(out.get("content"), str):
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": part, "text": out["content"]}]
    if "id" not in out:
        out["id"] = _PREFIX.get(kind, "item_") + random_hex()
    return out


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's ``input`` as stored items (a string is one user message)."""
    items = body["input"]
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return [_normal(item) for item in items]


def context_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored items as the input of the next request: ids and statuses left out (they name
    items of the store, not of the upstream's), reasoning items as they are."""
    return [item if item.get("type") == "reasoning" else
            {k: v for k, v in item.items() if k not in ("id", "status")} for item in items]


class ResponseStore:
    """``records``: where they live; ``ttl_s``: how long; ``upstreams``: by name, to
    tell those that keep responses themselves."""

    def __init__(self, records: Records, ttl_s: int, upstreams: Mapping[str, Upstream]
                 ) -> None:
        self.records = records
        self.ttl_s = ttl_s
        self.upstreams = upstreams
        #: Records being written: a chained request that comes before its write lands
        #: waits for it.
        self._writing: dict[str, asyncio.Task[None]] = {}

    @staticmethod
    def key(key_id: str | None, response_id: str) -> str:
        return f"{key_id or ''}:{response_id}"

    async def record(self, key_id: str | None, response_id: str) -> dict[str, Any] | None:
        """The record of ``response_id`` as ``key_id`` may see it, or None."""
        if not _ID.fullmatch(response_id):
            return None
        key = self.key(key_id, response_id)
        writing = self._writing.get(key)
        if writing is not None:
            await asyncio.shield(writing)
        raw = await self.records.get(key)
        return orjson.loads(raw) if raw is not None else None

    async def delete(self, key_id: str | None, response_id: str) -> bool:
        if not _ID.fullmatch(response_id):
            return False
        return await self.records.delete(self.key(key_id, response_id))

    async def resolve(self, ctx: RequestContext) -> Turn:
        """Rebuild ``ctx``'s conversation when it continues one (``ctx.body`` and ``raw``
        replaced); raises InvalidRequest (400 ``previous_response_not_found``) for an id
        the store does not hold for ``ctx.key_id`` (without gateway keys, only when none of
        the model's upstreams keeps responses itself), StoreUnavailable (503) when the
        store does not answer."""
        body = ctx.body
        if ctx.key_id is not None and body.get("conversation") is not None:
            _no_conversation(body["conversation"])
        previous = body.get("previous_response_id")
        store = body.get("store") is not False
        # the input as stored items (an id each): only for a response kept or a chain
        own = input_items(body) if store or previous is not None else []
        turn = Turn(self.key(ctx.key_id, ""), own, previous, store, tenant=ctx.key_id or "")
        if previous is None:
            return turn
        record = await self.record(ctx.key_id, previous)
        if record is None:
            route = ctx.route
            if ctx.key_id is None and route is not None and any(  # one tenant: forwarded,
                    self.upstreams[t.upstream].native_responses  # the upstream may know it
                    for t in route.targets):  # (the cache stays out)
                return turn
            raise InvalidRequest(f"Previous response with id '{previous}' not found.",
                                 param="previous_response_id",
                                 code="previous_response_not_found")
        before = record["items"] + _output_items(record["response"])
        turn.items = before + own
        if record.get("upstream"):
            ctx.upstream_state = UpstreamState(record["upstream"], body)
        rebuilt = {k: v for k, v in body.items() if k != "previous_response_id"}
        rebuilt["input"] = context_items(turn.items)
        ctx.body, ctx.raw = rebuilt, orjson.dumps(rebuilt)
        return turn

    def keep(self, turn: Turn, ctx: RequestContext, reply: Reply) -> None:
        """Store the answer ``reply`` carries once it is delivered whole (unless
        ``store: false``)."""
        if not turn.store or reply.status != 200:
            return
        if reply.stream is not None:
            def tap(events: bytes) -> None:
                final = final_response(events)
                if final is not None:
                    turn.response = final
            reply.taps.append(tap)
        elif reply.sse:  # a whole stream made by the gateway (a cache hit)
            turn.response = final_response(reply.body)
        else:
            turn.response = reply.json if isinstance(reply.json, dict) else load_object(reply.body)
        native = ctx.upstream if ctx.record.cache != "hit" else None

        def closed(outcome: Outcome) -> None:
            if outcome.delivered and isinstance(turn.response, dict):
                self._write(turn, native)
        reply.on_close(closed)

    def _write(self, turn: Turn, upstream: str | None) -> None:
        response = turn.response
        assert response is not None
        rid = response.get("id")
        if not isinstance(rid, str) or not _ID.fullmatch(rid):
            return
        if upstream is not None and not self.upstreams[upstream].native_responses:
            upstream = None
        response["previous_response_id"] = turn.previous
        value = orjson.dumps({"response": response, "items": turn.items,
                              "upstream": upstream})
        key = turn.key + rid
        records = self.records
        if isinstance(records, MemoryRecords):  # written at once: no task to make
            records.put_now(key, value, self.ttl_s, turn.tenant)
            return
        task = asyncio.ensure_future(self._put(key, value, turn.tenant))
        if not task.done():
            self._writing[key] = task
            task.add_done_callback(lambda _: self._writing.pop(key, None))

    async def _put(self, key: str, value: bytes, tenant: str) -> None:
        try:
            await self.records.put(key, value, self.ttl_s, tenant)
        except StoreUnavailable:
            log.warning("response_store_write_failed", bytes=len(value))

    async def aclose(self) -> None:
        await self.records.aclose()


def _no_conversation(conversation: Any) -> None:
    """Refuse a ``conversation`` (400): kept by the upstream under the key all tenants share,
    it could be any key's, and the gateway records none."""
    cid = conversation.get("id") if isinstance(conversation, dict) else conversation
    named = f" with id '{cid}'" if isinstance(cid, str) and len(cid) <= 128 else ""
    raise InvalidRequest(f"Conversation{named} not found. With gateway keys, a conversation "
                         "kept upstream cannot be told apart by key: continue with "
                         "previous_response_id instead.", param="conversation",
                         code="conversation_not_found")


def _output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response.get("output") or [] if isinstance(item, dict)]

