"""Processes the benchmarks start: the fake upstream, a gateway in front of it, and the floor
(a bare aiohttp reverse proxy, ``floor_proxy.py``) to hold the gateway against.

Each runs in its own interpreter (as in production), on a free loopback port.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.testing.server import free_port

__all__ = ["NATIVE_RESPONSES", "chat_chunks", "free_port", "start_fake", "start_fake_anthropic",
           "start_floor", "start_gateway", "stop", "wait_ready"]

ROOT = Path(__file__).resolve().parents[1]

#: A gateway config's ``native`` upstream, the fake OpenAI upstream at ``{openai}`` serving
#: /v1/responses itself, and its model ``bench-native`` (``.format(openai=PORT)``).
NATIVE_RESPONSES = """[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{openai}/v1"
native_responses = true
[models."bench-native"]
targets = [{{ upstream = "native", model = "fake-model" }}]
"""


def start_fake(port: int, capacity: int = 0,
               simulate_cache: bool = False) -> subprocess.Popen[bytes]:
    """The fake OpenAI upstream (no request recording); ``capacity`` > 0 bounds its slots;
    ``simulate_cache``: usage from a simulated prompt cache (gateway.testing.cache_sim)."""
    code = ("import uvicorn; from gateway.testing.fake_upstream import FakeUpstream; "
            f"uvicorn.run(FakeUpstream(record_requests=False, capacity={capacity}, "
            f"simulate_cache={simulate_cache}), "
            f"host='127.0.0.1', port={port}, loop='uvloop', http='httptools', "
            "access_log=False, log_level='error', server_header=False, backlog=4096)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def start_fake_anthropic(port: int, simulate_cache: bool = False) -> subprocess.Popen[bytes]:
    """The fake Anthropic Messages upstream (no request recording, any key);
    ``simulate_cache``: usage from a simulated prompt cache (gateway.testing.cache_sim)."""
    code = ("import uvicorn; from gateway.testing.fake_anthropic import FakeAnthropic; "
            f"uvicorn.run(FakeAnthropic(record_requests=False, simulate_cache={simulate_cache}), "
            f"host='127.0.0.1', port={port}, loop='uvloop', http='httptools', "
            "access_log=False, log_level='error', server_header=False, backlog=4096)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def start_floor(port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    """``floor_proxy.py`` on ``port`` forwarding ``/v1/*`` to the upstream on ``upstream_port``."""
    upstream = f"http://127.0.0.1:{upstream_port}"
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / "floor_proxy.py"),
                             "--port", str(port), "--upstream", upstream], cwd=ROOT)


def start_floor_shed(port: int) -> subprocess.Popen[bytes]:
    """``floor_shed.py`` on ``port``: sheds every request at once (bench/flood.py's floor)."""
    return subprocess.Popen([sys.executable, str(ROOT / "bench" / "floor_shed.py"),
                             "--port", str(port)], cwd=ROOT)


def start_gateway(port: int, fake_port: int, workdir: Path, policy: str = "",
                  upstream_extra: str = "", config_extra: str = "",
                  log: Path | None = None) -> subprocess.Popen[bytes]:
    """``gateway serve`` with model ``bench-model`` on the fake upstream (request log on, to
    ``log``, else /dev/null), the given policy text and extra config sections. Its files are
    ``workdir``'s gateway.toml and policy.toml (``log`` set: named after the log instead)."""
    stem = f"{log.stem}." if log is not None else ""
    policy_path = workdir / f"{stem}policy.toml"
    config_path = workdir / f"{stem}gateway.toml"
    policy_path.write_text(policy)
    config_path.write_text(f"""
[server]
port = {port}
policy = "{policy_path.name}"
[upstreams.fake]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{fake_port}/v1"
{upstream_extra}
[models."bench-model"]
targets = [{{ upstream = "fake", model = "fake-model" }}]
{config_extra}
""")
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path)]
    if log is None:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(command, cwd=ROOT, stdout=out)


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM every process, then wait; one still running after ``timeout`` s is killed."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def wait_ready(url: str, timeout: float = 30.0, post: Any = None,
                     headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` (GET, or POST of the JSON ``post``) until it answers 200; RuntimeError
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                method = "GET" if post is None else "POST"
                async with s.request(method, url, json=post, headers=headers) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


async def chat_chunks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed Chat Completions answer, as they
    arrive (``[DONE]`` and comments skipped)."""
    async for line in response.content:
        if line.startswith(b"data: {"):
            yield orjson.loads(line[6:])
