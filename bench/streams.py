"""Resilient streams (issue 48), side by side in one run: the gateway with its stream
features off and on, in front of fake upstreams that break streams the ways real ones do.

    python bench/streams.py [--n 300] [--concurrency 16] [--seed 48] [--budget-ratio R]
                            [--json FILE] [--logs DIR]

Three upstream kinds, each a model with two targets (two upstreams on the same fake, so a
failover target exists everywhere): ``openai`` (hosted OpenAI chat: no continuation),
``anthropic`` (Messages, ``claude-sonnet-4-5``: continues from an assistant prefill) and
``continuable`` (an OpenAI-compatible server taking ``continue_final_message``, as vLLM and
SGLang, named in ``continue_upstreams``). Each stream is 24 content events, one every 10 ms,
after a 50 ms first byte.

Faults, drawn per request from a seeded RNG (the same draws for both configurations), each
applied to the request's first upstream attempt only (a fault is a bad moment of one
upstream call, not of the request: a retry or continuation is served cleanly): a first token
20x late (5%), a stall of "60 s" with pings through it (2%), the connection cut after a
random event (2%; after the role chunk / ``message_start`` when the draw is 0), an in-band
error event after a random event (1%: ``data: {"error": ...}`` / ``event: error``). Every
time is scaled by 1/20 to keep the run short, ratios kept: a 50 ms TTFT stands for 1 s, the
late first token is 1 s (20 s), the stall 3 s (60 s), the upstreams' read timeout 6 s (the
hosted default, 120 s).

Configurations (one ``gateway serve`` each, both running through the run):
- ``off``: no first-token deadline (fixed 0, learned factor 0), ``stream_idle_timeout_ms =
  0`` (the read timeout is the only bound on a stall, as before), ``max_continuations = 0``.
- ``on``: the default policy, plus ``continue_upstreams`` naming the continuable fake's two
  upstreams and the times scaled: the learned deadline's floor 250 ms (5 s), a fixed
  deadline of 500 ms (10 s) while the learned one has too few samples, and an idle timeout
  of 1 s (20 s: the default 60 s scaled would equal the 60 s stall, a race).

Per configuration and kind: streams whole and well formed (one role chunk or
``message_start``, one finish, the protocol's clean end, the text equal to an uninterrupted
run's, read from the fake directly), ended with an explicit error (an error event without a
clean end, or an HTTP error), silent truncations (anything else: must be 0), the
mid-stream faults (stall, cut or error event after content) whose stream still reached the
client whole (text equal to the uninterrupted run's), TTFT p99 (to the first content
event, over the streams that had one) and end-to-end p99 (to the last byte, every stream),
extra upstream requests (upstream calls less streams), the explicit errors' codes by
fault, a probe of a cut and of an in-band error event right before the first token (one
request each, outside the mix: a draw of 1 in 24 of those faults), and the gateway log's counts (``continued``, ``first_token_timeouts``,
``stalled``). Targets: 100% whole where a continuation or failover target exists (a late
first token fails over on every kind; a fault after content is continued on
``anthropic`` and ``continuable``), 100% explicit errors elsewhere (``openai`` after
content), 0 silent truncations. Every rescue spends a retry-budget token
(``[retry_budget] ratio``, 0.1 by default): a kind whose faults need more than 10% extra
requests can end a few streams with an explicit error once it is spent
(``--budget-ratio`` to see the difference).

The fakes run in this process (uvicorn threads behind :class:`Faults`, which applies each
fault once and counts upstream calls); each gateway runs as ``gateway serve`` in its own
interpreter, as in production, so the client's and the fakes' work is not on its event loop.

Prints a JSON document and one line starting ``streams:``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import ROOT, free_port, stop, wait_ready
from streams_faults import (
    FAULTS,
    ITL_MS,
    LATE_MS,
    READ_TIMEOUT_MS,
    SCALE,
    STALL_MS,
    TOKENS,
    TTFT_MS,
    Faults,
    draw,
    mid_stream,
)
from streams_verdict import error_of, parse_sse, text_of, verdict

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread

KINDS = ("openai", "anthropic", "continuable")
KEY_ENV = "BENCH_STREAMS_ANTHROPIC_KEY"


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)



def config(port: int, openai: int, anthropic: int, policy: Path) -> str:
    targets = {"openai": ("oai", openai, "openai", "fake-model"),
               "continuable": ("vllm", openai, "openai", "fake-model"),
               "anthropic": ("claude", anthropic, "anthropic", "claude-sonnet-4-5")}
    out = [f'[server]\nport = {port}\npolicy = "{policy.name}"\n']
    for kind, (name, fake, api, model) in targets.items():
        for side in ("a", "b"):
            base = f"http://127.0.0.1:{fake}/{name}-{side}" + ("/v1" if api == "openai" else "")
            key = f'api_key_env = "{KEY_ENV}"\n' if api == "anthropic" else ""
            out.append(f'[upstreams."{name}-{side}"]\ntype = "{api}"\nbase_url = "{base}"\n'
                       f'forward_headers = ["x-fake-*"]\nread_timeout_ms = {READ_TIMEOUT_MS}\n'
                       + key)
        out.append(f'[models."bench-{kind}"]\ntargets = [{{ upstream = "{name}-a", model = '
                   f'"{model}" }}, {{ upstream = "{name}-b", model = "{model}" }}]\n')
    return "\n".join(out)


def policies(budget_ratio: float | None = None) -> dict[str, str]:
    """Each configuration's policy: the defaults (every key not written) and its
    ``[stream_watch]`` keys (module doc); ``budget_ratio``: both with this
    ``[retry_budget] ratio`` (default 0.1)."""
    off = ("first_token_ms = 0\nfirst_token_factor = 0.0\nstream_idle_timeout_ms = 0\n"
           "max_continuations = 0\n")
    on = (f"first_token_ms = {10_000 // SCALE}\nfirst_token_floor_ms = {5000 // SCALE}\n"
          f"stream_idle_timeout_ms = {20_000 // SCALE}\n"
          'continue_upstreams = ["vllm-a", "vllm-b"]\n')
    budget = "" if budget_ratio is None else f"[retry_budget]\nratio = {budget_ratio}\n"
    return {"off": budget + "[stream_watch]\n" + off, "on": budget + "[stream_watch]\n" + on}


def body(kind: str) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": "Tell me something."}]
    if kind == "anthropic":
        return "/v1/messages", {"model": "bench-anthropic", "max_tokens": 256, "stream": True,
                                "messages": messages}
    return "/v1/chat/completions", {"model": f"bench-{kind}", "stream": True,
                                    "messages": messages}


async def one(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
              headers: dict[str, str], api: str) -> dict[str, Any]:
    start = time.monotonic()
    ttft, chunks, status = None, [], 0
    try:
        async with session.post(url, json=payload, headers=headers) as r:
            status = r.status
            async for chunk in r.content.iter_any():
                chunks.append(chunk)
                if ttft is None and status == 200 and text_of(api, _complete(chunks)):
                    ttft = (time.monotonic() - start) * 1000
    except (aiohttp.ClientError, TimeoutError):
        pass  # what arrived is judged below (a cut the client sees)
    return {"events": parse_sse(b"".join(chunks)), "status": status, "ttft": ttft,
            "e2e": (time.monotonic() - start) * 1000}


def _complete(chunks: list[bytes]) -> list[tuple[str | None, str]]:
    """The whole events in what arrived so far (an event cut in two is not parsed)."""
    text = b"".join(chunks).replace(b"\r\n", b"\n")
    return parse_sse(text[:text.rfind(b"\n\n") + 2])


async def run(session: aiohttp.ClientSession, gateway: str, kind: str, n: int,
              concurrency: int, seed: int, reference: str, tag: str) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{kind}")
    draws = [draw(rng) for _ in range(n)]
    path, payload = body(kind)
    api = "messages" if kind == "anthropic" else "chat"
    gate = asyncio.Semaphore(concurrency)
    base = {"x-fake-ttft-ms": str(TTFT_MS), "x-fake-itl-ms": str(ITL_MS),
            "x-fake-tokens": str(TOKENS), "authorization": "Bearer k",
            "x-api-key": "k", "anthropic-version": "2023-06-01"}

    async def go(i: int) -> dict[str, Any]:
        fault, steer = draws[i]
        async with gate:
            got = await one(session, gateway + path, payload,
                            {**base, **steer, "x-fake-bench-id": f"{tag}:{i}"}, api)
        got["verdict"] = verdict(api, got["status"], got["events"], reference)
        got["fault"], got["mid"] = fault, mid_stream(steer)
        return got

    results = await asyncio.gather(*(go(i) for i in range(n)))
    verdicts = Counter(r["verdict"] for r in results)
    mids = [r for r in results if r["mid"]]
    by_fault = {f: dict(Counter(r["verdict"] for r in results if r["fault"] == f))
                for f, _ in FAULTS}
    return {"streams": n, "whole": verdicts["whole"], "explicit_errors": verdicts["error"],
            "silent_truncations": verdicts["silent"],
            "whole_share": round(verdicts["whole"] / n, 4),
            "faults": dict(Counter(r["fault"] for r in results if r["fault"])),
            "by_fault": by_fault,
            "error_codes": {f: dict(Counter(error_of(r["status"], r["events"]) for r in results
                                             if r["fault"] == f and r["verdict"] == "error"))
                            for f, _ in FAULTS},
            "mid_stream_faults": len(mids),
            "mid_stream_whole_equal_text": sum(r["verdict"] == "whole" for r in mids),
            "ttft_p99_ms": p99([r["ttft"] for r in results if r["ttft"] is not None]),
            "e2e_p99_ms": p99([r["e2e"] for r in results])}


async def edges(session: aiohttp.ClientSession, url: str, kind: str, reference: str,
                tag: str) -> dict[str, str]:
    """A cut and an in-band error event right before the first token (event 0: a draw of
    1 in 24 of those faults, so rare in a run): the verdict and, if an error, its code.
    Run before the mix, while the retry budget is full (a rescue spends a token)."""
    path, payload = body(kind)
    api = "messages" if kind == "anthropic" else "chat"
    out = {}
    for fault, header in (("cut", "die-after"), ("error", "error-midway")):
        got = await one(session, url + path, payload, {
            "x-fake-ttft-ms": str(TTFT_MS), "x-fake-itl-ms": str(ITL_MS),
            "x-fake-tokens": str(TOKENS), "x-api-key": "k", "anthropic-version": "2023-06-01",
            f"x-fake-bench-{header}": "0", "x-fake-bench-id": f"{tag}:{fault}"}, api)
        seen = verdict(api, got["status"], got["events"], reference)
        out[fault] = seen if seen != "error" else f"error {error_of(got['status'], got['events'])}"
    return out


def log_counts(log: Path) -> dict[str, dict[str, int]]:
    """Per model: the gateway log's ``continued``, ``first_token_timeouts``, ``stalled``."""
    out: dict[str, Counter[str]] = {}
    for line in log.read_bytes().splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or "model_requested" not in rec:
            continue
        c = out.setdefault(str(rec["model_requested"]), Counter())
        c["continued"] += int(rec.get("continued") or 0)
        c["first_token_timeouts"] += int(rec.get("first_token_timeouts") or 0)
        c["stalled"] += 1 if rec.get("stalled") else 0
    return {model: dict(c) for model, c in out.items()}


async def reference(session: aiohttp.ClientSession, openai: str, anthropic: str
                    ) -> dict[str, str]:
    """Each kind's uninterrupted answer, read from the fake directly."""
    out = {}
    for kind in KINDS:
        path, payload = body(kind)
        base = anthropic if kind == "anthropic" else openai + "/v1"
        url = base + path.removeprefix("/v1") if kind != "anthropic" else base + path
        got = await one(session, url, {**payload, "model": "claude-sonnet-4-5"
                                       if kind == "anthropic" else "fake-model"},
                        {"x-fake-tokens": str(TOKENS), "x-api-key": "k",
                         "anthropic-version": "2023-06-01", "x-fake-bench-id": "ref"},
                        "messages" if kind == "anthropic" else "chat")
        out[kind] = text_of("messages" if kind == "anthropic" else "chat", got["events"])
    return out


def serve(folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``gateway serve`` of ``folder``'s gateway.toml, its request log to requests.log."""
    with (folder / "requests.log").open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                                 str(folder / "gateway.toml")], cwd=ROOT, stdout=out, env=env)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    oai, ant = Faults(FakeUpstream(record_requests=False)), \
        Faults(FakeAnthropic(record_requests=False))
    with ServerThread(oai) as fo, ServerThread(ant) as fa, \
            tempfile.TemporaryDirectory() as tmp:
        procs, urls, logs = [], {}, {}
        env = {**os.environ, KEY_ENV: "k"}
        for name, text in policies(args.budget_ratio).items():
            port, folder = free_port(), Path(tmp) / name
            folder.mkdir()
            (folder / "policy.toml").write_text(text)
            (folder / "gateway.toml").write_text(config(port, fo.port, fa.port,
                                                        folder / "policy.toml"))
            logs[name] = folder / "requests.log"
            procs.append(serve(folder, env))
            urls[name] = f"http://127.0.0.1:{port}"
        results: dict[str, Any] = {}
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for url in urls.values():
                    await wait_ready(url + "/v1/chat/completions", timeout=120, post={
                        "model": "bench-openai", "messages": [{"role": "user", "content": "up"}]})
                refs = await reference(session, fo.url, fa.url)
                probes = {(name, kind): await edges(session, url, kind, refs[kind],
                                                    f"edge-{name}-{kind}")
                          for name, url in urls.items() for kind in KINDS}
                started = time.monotonic()
                for kind in KINDS:
                    for name, url in urls.items():
                        tag = f"{name}-{kind}"
                        results.setdefault(name, {})[kind] = await run(
                            session, url, kind, args.n, args.concurrency, args.seed,
                            refs[kind], tag)
                        calls = oai.calls[tag] + ant.calls[tag]
                        results[name][kind]["extra_upstream_requests"] = calls - args.n
                        results[name][kind]["before_first_token"] = probes[name, kind]
                took = time.monotonic() - started
        finally:
            stop(procs)
        for name in urls:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(logs[name], args.logs / f"{name}.log")
            counts = log_counts(logs[name])
            for kind in KINDS:
                results[name][kind]["log"] = counts.get(f"bench-{kind}", {})
    return {"scale": f"every time 1/{SCALE} of the real one", "ttft_ms": TTFT_MS,
            "itl_ms": ITL_MS, "tokens": TOKENS, "late_first_token_ms": LATE_MS,
            "stall_ms": STALL_MS, "read_timeout_ms": READ_TIMEOUT_MS,
            "faults": dict(FAULTS), "n": args.n, "concurrency": args.concurrency,
            "seed": args.seed, "retry_budget_ratio": args.budget_ratio or 0.1,
            "seconds": round(took, 1), "results": results,
            "targets": targets(results)}


def targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, for ``on``: every kind has a failover target, so a fault before
    the first token must end whole; after it, whole where the kind continues, else an
    explicit error; 0 silent truncations in every configuration."""
    on = results["on"]
    silent = sum(r["silent_truncations"] for c in results.values() for r in c.values())
    late = [on[k]["by_fault"]["late"] for k in KINDS]
    return {"silent_truncations": silent,
            "late_first_tokens_failed_over_whole": all(set(v) <= {"whole"} for v in late),
            "continuable_whole": all(on[k]["whole"] == on[k]["streams"]
                                     for k in ("anthropic", "continuable")),
            # not in ``ok``: a probe of one request each, outside the drawn mix
            "before_first_token_failed_over_whole": all(
                set(on[k].get("before_first_token", {}).values()) <= {"whole"} for k in KINDS),
            "openai_whole_or_explicit": on["openai"]["whole"] + on["openai"]["explicit_errors"]
            == on["openai"]["streams"],
            "ok": silent == 0 and all(set(v) <= {"whole"} for v in late) and all(on[k]["whole"] == on[k]["streams"]
                                      for k in ("anthropic", "continuable"))}


def summary(out: dict[str, Any]) -> str:
    parts = []
    for kind in KINDS:
        off, on = out["results"]["off"][kind], out["results"]["on"][kind]
        parts.append(
            f"{kind} whole {off['whole_share']:.1%} off / {on['whole_share']:.1%} on, "
            f"errors {off['explicit_errors']}/{on['explicit_errors']}, silent "
            f"{off['silent_truncations']}/{on['silent_truncations']}, TTFT p99 "
            f"{off['ttft_p99_ms']}/{on['ttft_p99_ms']} ms, E2E p99 {off['e2e_p99_ms']}/"
            f"{on['e2e_p99_ms']} ms, extra calls {off['extra_upstream_requests']}/"
            f"{on['extra_upstream_requests']}")
    edge = out["results"]["on"]["openai"].get("before_first_token", {})
    parts.append("on, right before the first token (openai): " + ", ".join(
        f"{fault}: {seen}" for fault, seen in edge.items()))
    return ("streams: " + "; ".join(parts)
            + f"; targets {'met' if out['targets']['ok'] else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="streams per configuration and kind")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    parser.add_argument("--budget-ratio", type=float,
                        help="[retry_budget] ratio of both gateways (default: the policy's 0.1)")
    parser.add_argument("--logs", type=Path, help="copy the gateways' request logs here")
    args = parser.parse_args()
    out = asyncio.run(bench(args))
    text = orjson.dumps(out, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if args.json:
        args.json.write_text(text)
    print(summary(out))
    return 0 if out["targets"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
