"""Part 7 of ``bench/engine.py`` (``--e2e``): speculative decoding end to end, through
``gateway serve``.

One gateway (``gateway serve``, its own process) with two local upstreams, each the
co-located engine as the gateway starts it (``python -m local_engine``, nice 10, the engine's
defaults but for the ones set here): ``spec-on`` with ``speculative = --e2e-spec`` and
``spec-off`` with ``speculative = { method = "off" }``. The response cache is off (policy
pipeline ``["route", "admission"]``), the start-up calibration too (``max_step_slowdown =
0``) and with it capacity-aware admission, so that all 32 of the batch-32 workload are let
in at once, on and off alike; embeddings too (not used). Requests are OpenAI chat
completions, streamed (``stream: true``, usage included), greedy (temperature 0),
``max_tokens`` 96.

Workloads (``bench/spec_workloads.py``, test split): input-grounded (repeat, quote, extract
from a given passage; edit given code) and MT-Bench turn 1 at batch 1, the two upstreams
alternating request by request (which one goes first alternating too), and MT-Bench at
batch 32 (32 requests at once), alternating round by round (4 rounds: on this shared 2-core
box a single round of either can take 25% longer for no reason of its own; the round times
are reported). One warm-up pass (other prompts, the dev split, so that no measured prompt
is in the prefix cache) goes first.

Batch 1: tokens/s = completion tokens / whole request time (from sending the request to
the end of its stream), summed over the prompts; batch 32: completion tokens / wall time of
the rounds, and each round's on/off ratio with their median (robust to one round that
other load slowed). Greedy answers (the streamed text) must be identical on and off; at
batch 32 the off answers of two rounds are compared too, as a control (see ``batch_n``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import spec_workloads as wl
from processes import chat_chunks

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["e2e", "e2e_summary"]

# capacity_aware off: without the start-up calibration admission would give each engine
# max_num_seqs seats and no queue, and the last requests of one round, still releasing their
# seats, would shed the first of the next
POLICY = 'version = "spec-e2e"\n[pipeline]\nstages = ["route", "admission"]\n' \
         '[cache]\nenabled = false\n[admission]\ncapacity_aware = false\n'


def _toml(value: dict[str, Any]) -> str:
    """A flat dict as a TOML inline table."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"


def write_config(folder: Path, port: int, spec: dict[str, Any], engine: str) -> Path:
    """gateway.toml and policy.toml in ``folder``; models ``spec-on`` and ``spec-off``."""
    (folder / "policy.toml").write_text(POLICY)
    text = f'[server]\nport = {port}\npolicy = "policy.toml"\npolicy_reload = false\n' \
           '[logging]\nrequests = false\n[cache]\nenabled = false\n'
    for name, sp in (("on", spec), ("off", {"method": "off"})):
        text += (f"[upstreams.spec_{name}]\ntype = \"local\"\nread_timeout_ms = 600000\n"
                 f"[upstreams.spec_{name}.engine]\nembeddings = false\n"
                 f"max_step_slowdown = 0\nspeculative = {_toml(sp)}\n"
                 + engine.replace(";", "\n") + "\n"
                 f"[models.\"spec-{name}\"]\n"
                 f"targets = [{{ upstream = \"spec_{name}\", model = \"smollm2\" }}]\n")
    path = folder / "gateway.toml"
    path.write_text(text)
    return path


async def wait_both(base: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(base + "/readyz") as r:
                    body = orjson.loads(await r.read())
                    if {"spec_on", "spec_off"} <= set(body.get("upstreams") or []):
                        return
            except (aiohttp.ClientError, orjson.JSONDecodeError):
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the gateway's engines did not come up")


async def one(session: aiohttp.ClientSession, url: str, model: str, prompt: str,
              max_tokens: int) -> tuple[str, int, float]:
    """Stream one request: its text, completion tokens and whole time (s)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    text: list[str] = []
    tokens = 0
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{model}: {r.status} {(await r.read())[:300]!r}")
        async for event in chat_chunks(r):
            for choice in event.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return "".join(text), tokens, time.perf_counter() - t0


async def batch1(session: aiohttp.ClientSession, url: str, prompts: list[str],
                 max_tokens: int) -> dict[str, Any]:
    fig = {n: {"tokens": 0, "s": 0.0, "texts": [], "per_request": []} for n in ("on", "off")}
    order = ["off", "on"]
    for prompt in prompts:
        order.reverse()
        for name in order:
            text, tokens, s = await one(session, url, f"spec-{name}", prompt, max_tokens)
            f = fig[name]
            f["tokens"] += tokens
            f["s"] += s
            f["texts"].append(text)
            f["per_request"].append(round(tokens / s, 1))
    return _result(fig, len(prompts), 1)


async def batch_n(session: aiohttp.ClientSession, url: str, prompts: list[str],
                  max_tokens: int, rounds: int) -> dict[str, Any]:
    fig = {n: {"tokens": 0, "s": 0.0, "per_request": [], "per_round_s": [], "rounds": []}
           for n in ("on", "off")}
    order = ["off", "on"]
    for _ in range(rounds):
        order.reverse()
        for name in order:
            t0 = time.perf_counter()
            done = await asyncio.gather(*(one(session, url, f"spec-{name}", p, max_tokens)
                                          for p in prompts))
            elapsed = time.perf_counter() - t0
            f = fig[name]
            f["per_round_s"].append(round(elapsed, 2))
            f["s"] += elapsed
            f["tokens"] += sum(t for _, t, _ in done)
            f["rounds"].append([text for text, _, _ in done])
    for f in fig.values():
        f["texts"] = f["rounds"][0]
    out = _result(fig, len(prompts), len(prompts))
    # each round's on and off ran back to back: their ratio, per round, and its median, which
    # one round slowed by whatever else runs on the machine does not move
    pairs = [off / on for on, off in zip(fig["on"]["per_round_s"], fig["off"]["per_round_s"],
                                         strict=True)]
    out["round_ratios"] = [round(r, 3) for r in pairs]
    out["round_ratio_median"] = round(statistics.median(pairs), 3)
    if rounds > 1:
        # the control: the same engine, the same prompts, another round (other arrival
        # times, so other batch compositions); in bfloat16 on a CPU whose matmul kernels
        # sum a row in an order that depends on the rows beside it, answers may differ here
        # as well, which is then no fault of speculation
        runs = fig["off"]["rounds"]
        out["identical_off_vs_off"] = sum(a == b for a, b in zip(runs[0], runs[1],
                                                                 strict=True))
    return out


def _result(fig: dict[str, dict[str, Any]], prompts: int, batch: int) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": prompts, "batch": batch}
    for name, f in fig.items():
        out[name] = {"tok_s": round(f["tokens"] / f["s"], 2), "completion_tokens": f["tokens"],
                     "seconds": round(f["s"], 2)}
        if f["per_request"]:
            out[name]["per_request_tok_s"] = f["per_request"]
        if f.get("per_round_s"):
            out[name]["per_round_s"] = f["per_round_s"]
    out["ratio"] = round(out["on"]["tok_s"] / out["off"]["tok_s"], 3)
    out["identical"] = sum(a == b for a, b in zip(fig["on"]["texts"], fig["off"]["texts"],
                                                  strict=True))
    return out


async def measure(base: str, args: argparse.Namespace) -> dict[str, Any]:
    url = base + "/v1/chat/completions"
    n, m = args.e2e_prompts, args.e2e_max_tokens
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for prompt in wl.grounded(1, "dev") + wl.mt_bench(1, "dev"):  # warm-up
            for name in ("on", "off"):
                await one(session, url, f"spec-{name}", prompt, m)
        out: dict[str, Any] = {}
        for _ in range(args.e2e_repeats):
            res = {}
            if n:
                res["grounded_b1"] = await batch1(session, url, wl.grounded(n), m)
                res["mt_bench_b1"] = await batch1(session, url, wl.mt_bench(n), m)
            if args.e2e_batch:
                res[f"mt_bench_b{args.e2e_batch}"] = await batch_n(
                    session, url, wl.mt_bench(args.e2e_batch), m, args.e2e_rounds)
            for key, value in res.items():
                out.setdefault(key, []).append(value)
        return out


async def e2e(args: argparse.Namespace) -> dict[str, Any]:
    """Part 7: start the gateway, measure, stop it."""
    from processes import free_port, stop

    spec = orjson.loads(args.e2e_spec)
    with tempfile.TemporaryDirectory(prefix="spec-e2e-") as tmp:
        port = free_port()
        config = write_config(Path(tmp), port, spec, args.e2e_engine)
        proc = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is measured
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)], cwd=ROOT,
            stdout=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_both(base)
            runs = await measure(base, args)
        finally:
            stop([proc], timeout=30)
    out: dict[str, Any] = {"spec": spec, "max_tokens": args.e2e_max_tokens,
                           "repeats": args.e2e_repeats}
    for key, values in runs.items():
        out[key] = {"ratios": [v["ratio"] for v in values],
                    "identical": [f"{v['identical']}/{v['prompts']}" for v in values],
                    "runs": values}
        if "round_ratio_median" in values[0]:
            out[key]["round_ratio_medians"] = [v["round_ratio_median"] for v in values]
        if "identical_off_vs_off" in values[0]:
            out[key]["identical_off_vs_off"] = [f"{v['identical_off_vs_off']}/{v['prompts']}"
                                                for v in values]
    return out


def e2e_summary(res: dict[str, Any]) -> str:
    parts = []
    for key, value in res.items():
        if isinstance(value, dict) and "ratios" in value:
            last = value["runs"][-1]
            control = (f", off vs off {value['identical_off_vs_off']}"
                       if "identical_off_vs_off" in value else "")
            if "round_ratio_medians" in value:
                control += f"; median of per-round ratios {value['round_ratio_medians']}"
            parts.append(f"{key} on/off {value['ratios']} (last {last['on']['tok_s']} vs "
                         f"{last['off']['tok_s']} tok/s; identical {value['identical']}"
                         f"{control})")
    return "end to end through gateway serve: " + "; ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--e2e", action="store_true",
                        help="run part 7 alone (speculation on vs off through gateway serve)")
    parser.add_argument("--e2e-spec", default='{"method": "ngram", "num_tokens": 4}')
    parser.add_argument("--e2e-engine", default="max_model_len = 8192",
                        help="more [upstreams.*.engine] TOML for both engines, lines "
                        "separated by ';' (default as gateway.example.toml)")
    parser.add_argument("--e2e-prompts", type=int, default=8,
                        help="prompts of each batch-1 workload (0: none)")
    parser.add_argument("--e2e-max-tokens", type=int, default=96)
    parser.add_argument("--e2e-batch", type=int, default=32,
                        help="requests at once of the batched workload (0: none)")
    parser.add_argument("--e2e-rounds", type=int, default=4,
                        help="rounds of the batched workload (2 or more: an off-vs-off "
                        "identity control)")
    parser.add_argument("--e2e-repeats", type=int, default=1,
                        help="measure the three workloads this many times over")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    r = asyncio.run(e2e(a))
    print(orjson.dumps(r, option=orjson.OPT_INDENT_2).decode())
    print("summary: " + e2e_summary(r))
