"""``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``,
served from the gateway's response store, per gateway key (another key's response is not
found). Errors in OpenAI's shape.

- ``GET /v1/responses/{id}``: the response object as the client got it.
- ``DELETE /v1/responses/{id}``: ``{"id", "object": "response.deleted", "deleted": true}``;
  a response a native upstream made is deleted there too (a failure there is logged).
- ``POST /v1/responses/{id}/cancel``: a 400 (no response here runs in the background), or
  404 for one not found.
- ``GET /v1/responses/{id}/input_items``: the items the response was answered from (the
  conversation before it, then its own input), a list page: ``limit`` (1-100, default 20),
  ``order`` (``desc``, the default, or ``asc``), ``after``/``before`` (an item id).

API: https://platform.openai.com/docs/api-reference/responses/get
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import Authenticator
from gateway.errors import GatewayError, InvalidRequest, NotFound, UpstreamError
from gateway.response_store.store import ResponseStore
from gateway.upstreams.base import UpstreamRequest

__all__ = ["ResponseEndpoints"]

Handler = Callable[[Request], Awaitable[Response]]

log = structlog.get_logger("gateway.responses")


class ResponseEndpoints:
    def __init__(self, store: ResponseStore, auth: Authenticator) -> None:
        self.store = store
        self.auth = auth

    async def get(self, request: Request) -> Response:
        return await self._answer(request, self._get)

    async def delete(self, request: Request) -> Response:
        return await self._answer(request, self._delete)

    async def input_items(self, request: Request) -> Response:
        return await self._answer(request, self._input_items)

    async def cancel(self, request: Request) -> Response:
        return await self._answer(request, self._cancel)

    async def _cancel(self, request: Request, key_id: str | None, rid: str) -> Any:
        await self._record(key_id, rid)
        raise InvalidRequest("only a response created with 'background': true can be "
                             "cancelled, and this gateway creates none", code="invalid_request")

    async def _answer(self, request: Request,
                      handler: Callable[[Request, str | None, str], Awaitable[Any]]) -> Response:
        try:
            key_id = self.auth.check(request.scope["headers"])
            obj = await handler(request, key_id, request.path_params["id"])
        except GatewayError as exc:
            return Response(exc.body(), exc.status, media_type="application/json")
        return Response(orjson.dumps(obj), media_type="application/json")

    async def _record(self, key_id: str | None, rid: str) -> dict[str, Any]:
        record = await self.store.record(key_id, rid)
        if record is None:
            raise NotFound(f"Response with id '{rid}' not found.")
        return record

    async def _get(self, request: Request, key_id: str | None, rid: str) -> Any:
        return (await self._record(key_id, rid))["response"]

    async def _delete(self, request: Request, key_id: str | None, rid: str) -> Any:
        record = await self._record(key_id, rid)
        upstream = self.store.upstreams.get(record.get("upstream") or "")
        if upstream is not None and upstream.enabled:  # it keeps its own copy: deleted too
            try:
                await upstream.send(UpstreamRequest("DELETE", f"/responses/{rid}", b"", []))
            except UpstreamError:
                log.warning("upstream_response_delete_failed", upstream=upstream.name)
        if not await self.store.delete(key_id, rid):
            raise NotFound(f"Response with id '{rid}' not found.")
        return {"id": rid, "object": "response.deleted", "deleted": True}

    async def _input_items(self, request: Request, key_id: str | None, rid: str) -> Any:
        items: list[dict[str, Any]] = (await self._record(key_id, rid))["items"]
        query = request.query_params
        try:
            limit = int(query.get("limit", 20))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise InvalidRequest("'limit' must be an integer from 1 to 100", param="limit",
                                 code="invalid_value")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'", param="order",
                                 code="invalid_value")
        ordered = items if order == "asc" else items[::-1]
        ids = [item.get("id") for item in ordered]
        start, end = 0, len(ordered)
        if "after" in query:
            start = _index(ids, query["after"], "after") + 1
        if "before" in query:
            end = _index(ids, query["before"], "before")
        page = ordered[start:end][:limit]
        return {"object": "list", "data": page,
                "first_id": page[0].get("id") if page else None,
                "last_id": page[-1].get("id") if page else None,
                "has_more": start + len(page) < end}


def _index(ids: list[Any], item_id: str, param: str) -> int:
    try:
        return ids.index(item_id)
    except ValueError:
        raise InvalidRequest(f"no input item with id '{item_id}' in this response",
                             param=param, code="invalid_value") from None
