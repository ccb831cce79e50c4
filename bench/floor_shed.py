"""The floor for ``bench/flood.py``: the least a Python server pays to shed a flood.

An aiohttp server on uvloop (as the gateway runs), access log off, that reads each request's
body and answers it at once as the gateway sheds: 503, an OpenAI error body,
``x-gateway-degraded: queue_full``, ``Retry-After: 1`` and a jittered ``retry-after-ms`` in
[1000, 2000). No parsing, no policy, no cache, no engine, no logging: what is left of its
latency under the flood is the clients', the connections' and the machine's.

    python bench/floor_shed.py --port 8100
"""

from __future__ import annotations

import argparse
import random

import uvloop
from aiohttp import web

BODY = (b'{"error":{"message":"overloaded","type":"overloaded_error",'
        b'"code":"degraded_mode","param":null}}')


async def shed(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=503, body=BODY, headers={
        "content-type": "application/json", "x-gateway-degraded": "queue_full",
        "retry-after": "1", "retry-after-ms": str(random.randrange(1000, 2000))})


async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", shed)
    app.router.add_get("/readyz", ready)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None,
                loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
