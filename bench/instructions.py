"""Instructions per request: what the gateway process itself executes to serve one request,
beside the floor (``floor_proxy.py``), counted by callgrind (``bench/overhead.py
--instructions``).

A count of instructions, unlike a time, does not move with the machine's load or clock, so
two revisions can be held against each other on a shared VM. Hardware counters (``perf
stat``) are unavailable on such VMs; valgrind's callgrind counts every instruction the
process executes (Ir: all its threads, the interpreter, C extensions, libc). Run to run, a
case's figure moves by up to about 0.5% (unary) and 2.5% (streams): the garbage collector,
the event loop and the timers (``idle_share``) follow the clock a little.

Each measured process (each floor, the gateway, ``--baseline-rev``'s gateway) runs alone
under ``valgrind --tool=callgrind --instr-atstart=no`` with ``PYTHONHASHSEED=0`` and the
garbage collector as in production; the fake upstreams and this client run natively. Per
process: start, warm up (``warmup`` requests per case, uninstrumented), wait until the
process is idle (the gateway loads its embedding model in the background when a router is
configured), switch instrumentation on, then per case zero the counters, send ``requests``
requests one at a time, dump and read the total. Every request asks a question of its own
(``... (#000123)``, the same numbering for every process), so the gateway's exact cache
misses and stores, as most production traffic does, rather than answering hits. Streamed
chunks come ``ITL_MS`` apart.

The gateway runs the default stages (``rate_limit``, ``cache``, ``route``, ``compress``
(off by default), ``prompt_cache``, ``admission``): the exact cache on (no semantic layer),
a router configured but the request naming a plain model (the route stage passes it
through), a rate limit set high enough never to bite; its request log goes to /dev/null.
Chat completions go to the fake OpenAI upstream, ``/v1/messages`` to the fake Anthropic one
(native, nothing translated). With ``responses`` or ``native`` in ``--apis`` (as by default),
:data:`RESPONSES_CASES` too: ``/v1/responses`` translated to the fake's chat endpoint (no
floor: it is held against chat's count, ``gateway_over_chat``) and to a ``native_responses``
upstream (the fake's own Responses API, over a floor like chat's, and against chat's count).

``idle_per_s`` is what each process executes a second with no request (timers, such as the
request log's flush): it is counted in a case's total for as long as the case runs under
valgrind, where a request takes ~50x its native time; ``idle_share`` is that part of each
figure (idle_per_s x seconds a request / Ir a request), time rather than work.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from callgrind import Counted, ready, self_costs, totals
from processes import (
    NATIVE_RESPONSES,
    free_port,
    start_fake,
    start_fake_anthropic,
    stop,
    wait_ready,
)

from gateway.testing.otlp_receiver import OtlpReceiver

__all__ = ["CASES", "ENV", "ITL_MS", "RESPONSES_CASES", "acceptance", "main", "measure_all",
           "resolve", "summary_line"]

ROOT = Path(__file__).resolve().parents[1]
#: (name, api, stream), measured in this order.
CASES = (("chat_unary", "openai", False), ("chat_stream", "openai", True),
         ("messages_unary", "anthropic", False), ("messages_stream", "anthropic", True))
#: Added when ``--apis`` names ``responses`` or ``native`` (issue 30): /v1/responses
#: translated to the fake's chat endpoint, and to a ``native_responses`` upstream (the fake's
#: own /v1/responses, with a floor in front of it like chat's); each also held against chat's
#: count for the same mode (``gateway_over_chat``). Not in the baseline's run.
RESPONSES_CASES = (("responses_unary", "responses", False),
                   ("responses_stream", "responses", True),
                   ("native_unary", "native", False), ("native_stream", "native", True))
PACKAGES = ("gateway", "llm_wire", "local_engine")
IDLE_S = 3
#: The fakes' gap between streamed chunks (ms) by default: each chunk then reaches the process
#: as a read of its own, as in a real stream (a token every 10-50 ms). Back to back, under
#: valgrind's ~50x slowdown, they merge into a varying number of reads: fewer instructions,
#: and 2-4% apart from run to run.
ITL_MS = 5.0
ENV = {"PYTHONHASHSEED": "0", "BENCH_ANTHROPIC_KEY": "bench"}

POLICY = """version = "bench-instructions"
[cache]
semantic = false
[routing.tiers]
small = ["bench-model"]
large = ["bench-claude"]
[routing.routers.auto]
weak = "small"
strong = "large"
[rate_limits.default]
requests_per_minute = 100000000
tokens_per_minute = 100000000000
"""
#: ``policy_reload`` off: the policy file's watcher wakes on a timer (about 1.5M Ir a second
#: idle), and under valgrind a request lasts ~50x longer, so its share would be time, not work.
CONFIG = """[server]
port = {port}
policy = "policy.toml"
policy_reload = false
[cache]
enabled = true
semantic = false
[upstreams.fake]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{openai}/v1"
[models."bench-model"]
targets = [{{ upstream = "fake", model = "fake-model" }}]
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "http://127.0.0.1:{anthropic}"
api_key_env = "BENCH_ANTHROPIC_KEY"
[models."bench-claude"]
targets = [{{ upstream = "claude", model = "claude-bench" }}]
""" + NATIVE_RESPONSES


def body(bodies: dict[str, Any], api: str, stream: bool, n: int) -> bytes:
    """overhead.py's body for ``api`` with its question numbered ``n`` (an exact-cache miss)."""
    doc = orjson.loads(orjson.dumps(bodies[api]))
    if "messages" in doc:
        doc["messages"][-1]["content"] += f" (#{n:06d})"
    else:  # a Responses request
        doc["input"] += f" (#{n:06d})"
    return orjson.dumps({**doc, "stream": stream})


class Client:
    """Sends numbered requests one at a time; the numbering runs on across calls."""

    def __init__(self, session: aiohttp.ClientSession, bodies: dict[str, Any],
                 paths: dict[str, str], headers: dict[str, dict[str, str]]) -> None:
        self.session, self.bodies, self.paths, self.headers = session, bodies, paths, headers
        self.sent = 0

    async def send(self, port: int, api: str, stream: bool, count: int) -> None:
        url = f"http://127.0.0.1:{port}{self.paths[api]}"
        headers = {"content-type": "application/json", **self.headers[api]}
        for _ in range(count):
            data = body(self.bodies, api, stream, self.sent)
            self.sent += 1
            async with self.session.post(url, data=data, headers=headers) as r:
                answer = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {answer[:300]!r}")


class Run:
    """One run's settings, its client and what it found, target after target."""

    def __init__(self, client: Client, work: Path, requests: int, warmup: int,
                 top: int, cases: Sequence[tuple[str, str, bool]] = CASES) -> None:
        self.client, self.work = client, work
        self.requests, self.warmup, self.top = requests, warmup, top
        self.per_case: dict[str, dict[str, int]] = {name: {} for name, _, _ in cases}
        self.idle: dict[str, int] = {}
        self.share: dict[str, dict[str, float]] = {}
        self.hot: dict[str, Any] = {}

    async def target(self, name: str, column: str, command: list[str], source: Path,
                     port: int, cases: Sequence[tuple[str, str, bool]], probe: str,
                     post: Any = None) -> None:
        """Start ``command`` under callgrind (in and on ``source``), wait until ``probe``
        (a path on ``port``) answers, count ``cases`` into ``column``, stop it."""
        counted = Counted(name, command, self.work, source, ENV)
        headers = self.client.headers[cases[0][1]] if post is not None else None
        try:
            await ready(counted, f"http://127.0.0.1:{port}{probe}", post, headers)
            await self.measure(counted, port, cases, column)
        finally:
            stop([counted.proc])

    async def measure(self, counted: Counted, port: int,
                      cases: Sequence[tuple[str, str, bool]], column: str) -> None:
        """Warm up uninstrumented, settle, then per case: zero, send, dump; then idle."""
        self.client.sent = 0  # every process gets the same numbered questions
        for _, api, stream in cases:
            await self.client.send(port, api, stream, self.warmup)
        await counted.settle()
        counted.instrument(True)
        seconds: dict[str, float] = {}
        for case, api, stream in cases:
            counted.zero()
            started = time.monotonic()
            await self.client.send(port, api, stream, self.requests)
            dump = counted.dump()
            seconds[case] = time.monotonic() - started
            self.per_case[case][column] = round(totals(dump) / self.requests)
            if self.top:
                self.hot[f"{column}/{case}"] = self_costs(dump, self.requests, self.top)
        counted.zero()
        started = time.monotonic()
        await asyncio.sleep(IDLE_S)
        dump = counted.dump()
        idle = self.idle[counted.name] = round(totals(dump) / (time.monotonic() - started))
        if self.top:
            self.hot[f"{counted.name}/idle_per_s"] = self_costs(dump, IDLE_S, self.top)
        counted.instrument(False)
        # The part of each count that is idle work (timers) over the requests' time.
        self.share[counted.name] = {
            case: round(idle * s / (self.per_case[case][column] * self.requests), 4)
            for case, s in seconds.items()}


async def measure_all(bodies: dict[str, Any], paths: dict[str, str],
                      steering: dict[str, str], requests: int, warmup: int, top: int,
                      baseline_rev: str | None, keep: Path | None = None,
                      rev: str | None = None,
                      cases: Sequence[tuple[str, str, bool]] = CASES,
                      policy_extra: str = "", config_extra: str = "") -> dict[str, Any]:
    """The floors, this gateway (the working tree's, or revision ``rev``'s) and (with
    ``baseline_rev``) that revision's, one at a time, each served by fakes steered by
    ``steering`` (``x-fake-*`` headers); ``keep``: a folder for the dumps, the processes'
    output and configs (else a temporary one); ``cases``: :data:`CASES`, and
    :data:`RESPONSES_CASES` with them (the baseline runs :data:`CASES` only);
    ``policy_extra``: TOML appended to this gateway's policy (not the baseline's);
    ``config_extra`` to its config (``{collector}`` in it: the OTLP/HTTP traces URL of a
    receiver this bench runs, gateway.testing.otlp_receiver)."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found: install valgrind (apt-get install valgrind)")
    fake = {"openai": free_port(), "anthropic": free_port()}
    headers = {"openai": steering, "responses": steering, "native": steering, "anthropic": {
        **steering, "x-api-key": "bench", "anthropic-version": "2023-06-01"}}
    upstreams = [start_fake(fake["openai"]), start_fake_anthropic(fake["anthropic"])]
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp, \
            OtlpReceiver() as collector:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        gateways = [("gateway", extract(rev, work / "tree") if rev else ROOT)]
        if baseline_rev:
            gateways.append(("baseline", extract(baseline_rev, work / "baseline")))
        try:
            async with aiohttp.ClientSession() as session:
                run = Run(Client(session, bodies, paths, headers), work, requests, warmup, top,
                          cases)
                for api, upstream in fake.items():
                    await wait_ready(f"http://127.0.0.1:{upstream}{paths[api]}",
                                     post=orjson.loads(body(bodies, api, False, 0)),
                                     headers=headers[api])
                for api, upstream in fake.items():  # a floor per API, before its fake
                    port = free_port()
                    await run.target(
                        f"floor_{api}", "floor",
                        [sys.executable, str(ROOT / "bench" / "floor_proxy.py"), "--port",
                         str(port), "--upstream", f"http://127.0.0.1:{upstream}"], ROOT, port,
                        [c for c in cases if c[1] == api or (api, c[1]) == ("openai", "native")],
                        paths[api],
                        orjson.loads(body(bodies, api, False, 0)))
                for name, source in gateways:
                    port = free_port()
                    home = work / f"{name}-config"
                    home.mkdir(exist_ok=True)
                    (home / "policy.toml").write_text(
                        POLICY + (policy_extra if name == "gateway" else ""))
                    config = CONFIG.format(port=port, openai=fake["openai"],
                                           anthropic=fake["anthropic"])
                    if "forward_headers" not in (source / "gateway" / "config.py").read_text():
                        # a revision before issue 45 forwards every header and knows no key
                        config = "\n".join(line for line in config.splitlines()
                                           if not line.startswith("forward_headers"))
                    if name == "gateway":
                        config += "\n" + config_extra.replace("{collector}", collector.endpoint)
                    (home / "gateway.toml").write_text(config)
                    await run.target(name, name, [sys.executable, "-m", "gateway.cli", "serve",
                                                  "--config", str(home / "gateway.toml")],
                                     source, port, CASES if name == "baseline" else cases,
                                     "/healthz")
        finally:
            stop(upstreams)
    return {"results": compare(run.per_case), "idle_per_s": run.idle,
            "idle_share": run.share, **({"top": run.hot} if top else {})}


def resolve(rev: str) -> str:
    """``rev`` as a short commit hash."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", f"{rev}^{{commit}}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def extract(rev: str, tree: Path) -> Path:
    """The gateway's packages at git revision ``rev``, extracted into ``tree``."""
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *PACKAGES],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def compare(per_case: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Each case's counts with the gateway over the floor and over the baseline."""
    out: dict[str, Any] = {}
    for name, row in per_case.items():
        out[name] = dict(row)
        if "floor" in row:
            out[name]["gateway_over_floor"] = round(row["gateway"] / row["floor"], 3)
        chat = per_case.get("chat_" + name.partition("_")[2]) \
            if name.startswith(("responses_", "native_")) else None
        if chat:
            out[name]["chat"] = chat["gateway"]
            out[name]["gateway_over_chat"] = round(row["gateway"] / chat["gateway"], 3)
        if "baseline" in row:
            out[name]["gateway_over_baseline"] = round(row["gateway"] / row["baseline"], 3)
    return out


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 28: per case, at most half the baseline's instructions."""
    checks: dict[str, Any] = {}
    for name, row in results.items():
        if "baseline" in row:
            checks[name] = {"gateway": row["gateway"], "baseline": row["baseline"],
                            "max": row["baseline"] // 2,
                            "holds": row["gateway"] <= row["baseline"] / 2}
    if checks:
        checks["all_hold"] = all(c["holds"] for c in checks.values())
    return checks


def summary_line(results: dict[str, Any], checks: dict[str, Any],
                 baseline_rev: str | None) -> str:
    def k(n: int) -> str:
        return f"{n / 1000:.0f}k"

    parts = []
    for name, row in results.items():
        part = f"{name.replace('_', ' ')} gateway {k(row['gateway'])}"
        if "floor" in row:
            part += f" vs floor {k(row['floor'])} ({row['gateway_over_floor']}x)"
        if "chat" in row:
            part += f"{',' if 'floor' in row else ' vs'} chat {k(row['chat'])} " \
                f"({row['gateway_over_chat']}x)"
        if "baseline" in row:
            part += (f", {baseline_rev} {k(row['baseline'])} ({row['gateway_over_baseline']}x,"
                     f" <= 0.5: {'yes' if checks[name]['holds'] else 'NO'})")
        parts.append(part)
    if checks:
        parts.append(f"all hold: {'yes' if checks['all_hold'] else 'NO'}")
    return "instructions per request: " + "; ".join(parts)


def main(args: argparse.Namespace, bodies: dict[str, Any], paths: dict[str, str],
         steering: dict[str, str]) -> int:
    """``overhead.py --instructions``: measure (its ``args``), print the JSON document and
    the summary line."""
    args.rev = args.rev and resolve(args.rev)
    args.baseline_rev = args.baseline_rev and resolve(args.baseline_rev)
    found = uvloop.run(measure_all(
        bodies, paths, steering, args.instructions_requests, args.instructions_warmup,
        args.instructions_top, args.baseline_rev, args.instructions_keep, args.rev,
        CASES + tuple(c for c in RESPONSES_CASES if c[1] in args.apis),
        args.instructions_policy.read_text() if args.instructions_policy else "",
        args.instructions_config.read_text() if args.instructions_config else ""))
    checks = acceptance(found["results"])
    doc = {"bench": "overhead_instructions", "counter": "callgrind Ir",
           "python": sys.version.split()[0], "pythonhashseed": ENV["PYTHONHASHSEED"],
           "requests_per_case": args.instructions_requests,
           "warmup_per_case": args.instructions_warmup, "tokens_per_response": args.tokens,
           "upstream_ttft_ms": args.ttft_ms, "upstream_itl_ms": args.itl_ms,
           "rev": args.rev or "working tree", "baseline_rev": args.baseline_rev, **found,
           "acceptance": checks}
    print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    print(summary_line(found["results"], checks, args.baseline_rev))
    return 0
