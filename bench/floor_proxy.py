"""The floor: the least a Python reverse proxy can add, for ``bench/overhead.py`` to hold the
gateway against.

An aiohttp server on uvloop (as the gateway runs), access log off, that forwards every
``/v1/*`` request to ``--upstream`` over one shared keep-alive ``ClientSession`` (no
decompression) and streams the answer back chunk by chunk as it arrives, copying the status
and content-type and nothing else. No parsing, no policy, no logging.

    python bench/floor_proxy.py --port 8100 --upstream http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
# Headers that describe this hop, not the request; aiohttp sets its own for the next hop.
HOP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding",
                 "te", "upgrade", "proxy-connection", "accept-encoding"})


async def forward(request: web.Request) -> web.StreamResponse:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    body = await request.read()
    url = request.app[UPSTREAM] + request.rel_url.raw_path_qs
    try:
        async with request.app[SESSION].request(request.method, url, data=body,
                                                headers=headers) as up:
            ctype = up.headers.get("content-type")
            reply = web.StreamResponse(status=up.status,
                                       headers={"content-type": ctype} if ctype else None)
            await reply.prepare(request)
            async for chunk in up.content.iter_any():
                await reply.write(chunk)
            await reply.write_eof()
            return reply
    except aiohttp.ClientError as exc:
        raise web.HTTPBadGateway(text=f"upstream: {exc!r}") from exc


def build_app(upstream: str) -> web.Application:
    """The proxy app; ``upstream`` is the origin (``http://host:port``), no trailing slash."""
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # One pool for all requests: unbounded, keep-alive, bytes passed through untouched.
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as s:
            app[SESSION] = s
            yield

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="origin, e.g. http://127.0.0.1:8000")
    args = parser.parse_args()
    web.run_app(build_app(args.upstream), host="127.0.0.1", port=args.port, access_log=None,
                print=None, backlog=4096, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
