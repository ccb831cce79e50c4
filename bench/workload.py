"""End to end on a realistic workload: direct calls, the gateway (default policy, every stage
on) and LiteLLM, side by side in one run, against a provider simulator.

    python bench/workload.py [--n 600] [--seed 47] [--paths direct,default,every,litellm]
                             [--ablate [STAGE,...]] [--ablate-default [STAGE,...]]
                             [--repeat N] [--baseline-rev REV] [--json FILE]
                             [--faults issue48] (and path ``continue``: CONTINUE_POLICY)
                             [--policy NAME=TOML]... (path NAME: the default policy + TOML)

- The provider: ``bench/provider_sim.py`` (OpenAI chat and Anthropic Messages, its latency
  model, prompt caching, token-per-minute limit and faults: every parameter printed), a
  fresh process per path (cold caches, empty limits, its own record of what it received).
- The workload: ``bench/workload_mix.py`` (seeded: τ-bench agent turns in both APIs, chat
  with Zipf-popular repeats and paraphrases, NQ retrieval with 20 documents; Poisson
  arrivals near the simulated token limit), its warm-up sent and reported apart.
- The client: ``bench/workload_client.py`` (open loop; TTFT to the first content, E2E to the
  last byte; outcomes by kind).
- Paths: ``direct`` (the client at the simulator), ``default`` (``gateway serve``, the
  response cache on as ``gateway.example.toml`` ships it, the default policy), ``every``
  (every stage on: compression, routing by difficulty with the models opted in), ``litellm``
  (``bench/litellm_proxy.py``: its proxy as its docs recommend). ``--ablate``: the every-stage
  policy again with one stage off at a time; ``--ablate-default``: the default policy so,
  each stage it runs (DEFAULT_ON).

Per path: client TTFT p50/p95/p99 and E2E p50/p99 (measured requests), outcomes by kind,
billed cost (the simulator's, measured window), cache hits by layer (the gateway's log; a
proxy's answers the simulator never saw otherwise), served-wrong hits (a hit whose answer
came from another question: the simulator's answers are deterministic per prompt, so an
answer is traced to the request that first got it), requests whose meaning changed (each
body the simulator received, through the equivalence contract, tests/gateway/equivalence),
proxy CPU seconds (user + system, the proxy's processes, measured window). Ratios are
against ``direct`` in the same run. JSON (``--json``) plus one summary line per path.
``--repeat N``: N rounds (round i: mix seed + i, provider seed i), each printed, then the
percentiles pooled over all rounds' requests and each gateway path's change against LiteLLM
round by round (one round's p50 moves ~5-10% run to run on 2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench.* and tests.* from the checkout
    sys.path.insert(0, str(ROOT))

from bench.litellm_proxy import tree_cpu_seconds
from bench.processes import free_port, wait_ready
from bench.provider_sim_params import FAULTS, SimParams
from bench.workload_client import replay
from bench.workload_report import (
    gaps,
    lossy_quality,
    meaning_changed,
    pool_rounds,
    print_pooled,
    print_report,
    provider_time,
    served_wrong,
    summarize,
)

KEY_ENV = "WORKLOAD_UPSTREAM_KEY"
UPSTREAM_KEY = "sk-workload-upstream"
CLIENT_KEY = "sk-workload-client"
#: public model -> (upstream, upstream model): what the mix names and the routers' tiers.
MODELS = {"gpt-4o": ("openai", "gpt-4o"), "gpt-4o-mini": ("openai", "gpt-4o-mini"),
          "claude-sonnet-4-5": ("anthropic", "claude-sonnet-4-5"),
          "claude-haiku-4-5": ("anthropic", "claude-haiku-4-5")}

DEFAULT_POLICY = 'version = "workload-default"\n'
#: ``continue``: the default policy, the OpenAI models' upstream continuation-capable (as a
#: vLLM's, continue_final_message: the simulator continues a text as such a server does).
CONTINUE_POLICY = DEFAULT_POLICY + '[stream_watch]\ncontinue_upstreams = ["openai"]\n'
#: Every stage on: the semantic cache, compression (its gate deciding when it pays), routing
#: by difficulty with the mix's models opted in (a weak tier of the same API), the rest as by
#: default. ROUTERS: router family -> (its weak model, its strong one, opted in).
ROUTERS = {"gpt": ("gpt-4o-mini", "gpt-4o"), "claude": ("claude-haiku-4-5", "claude-sonnet-4-5")}
EVERY_POLICY = """version = "workload-every-stage"

[cache]
semantic = true

[compression]
enabled = true

[routing.tiers]
""" + "".join(f'{name}-small = ["{weak}"]\n{name}-large = ["{strong}"]\n'
              for name, (weak, strong) in ROUTERS.items()) + "".join(f"""
[routing.routers.auto-{name}]
weak = "{name}-small"
strong = "{name}-large"
artifact = "default"
quality = 0.95
models = ["{strong}"]
""" for name, (_, strong) in ROUTERS.items())

#: --ablate: the every-stage policy with one stage left out of the pipeline.
STAGES = ("rate_limit", "cache", "coalesce", "route", "compress", "prompt_cache", "admission")
#: --ablate-default: the stages that do work under the default policy (no rate limit is set;
#: routing and compression are off), each left out of the default pipeline in turn.
DEFAULT_ON = ("cache", "coalesce", "prompt_cache", "admission")


#: Tokens per minute of the simulated account: gpt-4o's and Sonnet's input limits at usage
#: tier 2, the simulator's defaults (bench/provider_sim_params.py cites them); the mix
#: offers 70% of it. (A higher tier's limits make a run shorter but busier than 2 cores
#: serve LiteLLM at: its proxy then queues on CPU, which says nothing of a real deployment.)
TPM = 450_000


def sim_defaults() -> dict[str, Any]:
    """The simulator's parameters for this bench: its defaults."""
    return SimParams().to_dict()


def gateway_toml(port: int, sim: str, policy: str) -> str:
    models = "".join(f'[models."{name}"]\ntargets = [{{ upstream = "{up}", model = "{m}" }}]\n'
                     for name, (up, m) in MODELS.items())
    return f"""
[server]
port = {port}
policy = "{policy}"
policy_reload = false
[logging]
requests = true
[cache]
enabled = true
backend = "memory"

[upstreams.openai]
type = "openai"
base_url = "{sim}/v1"
api_key_env = "{KEY_ENV}"
read_timeout_ms = 120000

[upstreams.anthropic]
type = "anthropic"
base_url = "{sim}"
api_key_env = "{KEY_ENV}"
read_timeout_ms = 120000

{models}"""


class Sim:
    """The provider simulator in its own process, recording what it receives."""

    def __init__(self, params: dict[str, Any], record: Path) -> None:
        self.record = record
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.provider_sim", "--port", "0", "--params",
             json.dumps(params), "--record", str(record)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"provider_sim did not start: {line!r}")
        self.url = line.split(" ", 1)[1]

    async def stats(self) -> dict[str, Any]:
        import aiohttp
        async with aiohttp.ClientSession() as s, s.get(self.url + "/sim/stats") as r:
            return await r.json(loads=orjson.loads)  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def run_path(name: str, policy: str | None, mix: list[Any], sim_params: dict[str, Any],
                   work: Path, speed: float, source: Path = ROOT) -> dict[str, Any]:
    """One path: a fresh simulator, the proxy (or none), warm-up, the measured requests.
    ``source``: the gateway's packages (another revision's, extracted, for ``NAME@REV``)."""
    sim = Sim(sim_params, work / f"{name}.upstream.jsonl")
    proxy: Any = None
    pid: int | None = None
    key = CLIENT_KEY
    log = work / f"{name}.log"
    try:
        if name == "direct":
            base = {"openai": sim.url + "/v1", "anthropic": sim.url}
        elif name == "litellm":
            from bench.litellm_proxy import LiteLLMProxy, ModelRoute, ensure
            ensure()
            routes = [ModelRoute(n, up, sim.url, m, KEY_ENV) for n, (up, m) in MODELS.items()]
            proxy = LiteLLMProxy(routes, env={KEY_ENV: UPSTREAM_KEY})
            proxy.__enter__()
            pid = proxy.pid
            key = proxy.master_key
            base = {"openai": proxy.url + "/v1", "anthropic": proxy.url}
        else:
            port = free_port()
            (work / f"{name}.policy.toml").write_text(policy or DEFAULT_POLICY)
            config = work / f"{name}.gateway.toml"
            config.write_text(gateway_toml(port, sim.url, f"{name}.policy.toml"))
            with log.open("wb") as out:
                proxy = subprocess.Popen(  # noqa: ASYNC220 (started once, not awaited)
                    [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
                    cwd=source, stdout=out, env={**os.environ, KEY_ENV: UPSTREAM_KEY,
                                                 "PYTHONPATH": str(source)})
            pid = proxy.pid
            url = f"http://127.0.0.1:{port}"
            await wait_ready(url + "/readyz", timeout=120)
            await _semantic_ready(url)
            base = {"openai": url + "/v1", "anthropic": url}
        warm = [r for r in mix if r.warmup]
        measured = [r for r in mix if not r.warmup]
        t0 = time.perf_counter()
        warm_results = await replay(_rebased(warm), base, key, speed)
        warm_s = time.perf_counter() - t0
        before = await sim.stats()
        cpu0 = tree_cpu_seconds(pid) if pid else 0.0
        t1 = time.perf_counter()
        results = await replay(_rebased(measured), base, key, speed)
        wall_s = time.perf_counter() - t1
        cpu = tree_cpu_seconds(pid) - cpu0 if pid else 0.0  # the measured window only
        after = await sim.stats()
    finally:
        if name == "litellm" and proxy is not None:
            proxy.__exit__(None, None, None)
        elif proxy is not None:
            proxy.send_signal(signal.SIGTERM)
            try:
                proxy.wait(30)
            except subprocess.TimeoutExpired:
                proxy.kill()
        sim.stop()
    upstream = after["requests"][len(before["requests"]):]
    return {"name": name, "results": results, "warm_results": warm_results,
            "upstream": upstream, "params": after.get("params"), "cpu_s": cpu,
            "wall_s": wall_s, "warm_s": warm_s, "log": log if log.exists() else None,
            "record": sim.record}


def _rebased(requests: list[Any]) -> list[Any]:
    """The same requests with arrival times from the first one's."""
    from dataclasses import replace
    if not requests:
        return []
    t0 = min(r.t_s for r in requests)
    return [replace(r, t_s=r.t_s - t0) for r in requests]


async def _semantic_ready(url: str, timeout: float = 180.0) -> None:
    """Wait for the gateway's embedding model (the semantic layer) to have loaded."""
    import aiohttp
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            async with s.get(url + "/readyz") as r:
                body = await r.json(loads=orjson.loads)
                if body.get("cache") in (None, "semantic"):
                    return
            await asyncio.sleep(0.2)


def main() -> int:
    from bench.workload_mix import MixParams, build

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=600, help="measured requests")
    ap.add_argument("--warmup", type=int, default=100, help="warm-up requests before them")
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--paths", default="direct,default,every,litellm")
    ap.add_argument("--ablate", nargs="?", const=",".join(STAGES), default="",
                    help="every-stage runs, one stage off at a time (all, or these stages)")
    ap.add_argument("--ablate-default", nargs="?", const=",".join(DEFAULT_ON), default="",
                    help="default-policy runs, one default-on stage off at a time")
    ap.add_argument("--faults", choices=sorted(FAULTS), help="the simulator's faults so")
    ap.add_argument("--speed", type=float, default=1.0, help="arrival-time compression")
    ap.add_argument("--json", type=Path, help="write the full results here")
    ap.add_argument("--repeat", type=int, default=1, help="rounds, each on its own seeded "
                    "mix and provider noise; percentiles pooled over them")
    ap.add_argument("--baseline-rev", help="also the default policy on this git revision's "
                    "gateway (path default@REV)")
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=TOML",
                    help="also path NAME: the default policy with this file's TOML appended")
    args = ap.parse_args()

    policies = {"default": DEFAULT_POLICY, "every": EVERY_POLICY, "continue": CONTINUE_POLICY}
    paths = [(name, policies.get(name)) for name in args.paths.split(",")]
    for spec in args.policy:
        name, _, file = spec.partition("=")
        if not name or not file:
            ap.error(f"--policy: NAME=TOML, not {spec!r}")
        paths.append((name, DEFAULT_POLICY + Path(file).read_text()))
    for base, policy, stages in (("every", EVERY_POLICY, args.ablate),
                                 ("default", DEFAULT_POLICY, args.ablate_default)):
        for stage in filter(None, stages.split(",")):
            if stage not in STAGES:
                ap.error(f"--ablate: unknown stage {stage!r}; one of {', '.join(STAGES)}")
            kept = [s for s in STAGES if s != stage]
            paths.append((f"{base}-no-{stage}",
                          policy + f"\n[pipeline]\nstages = {json.dumps(kept)}\n"))

    work = Path(tempfile.mkdtemp(prefix="workload-"))
    sources = {name: ROOT for name, _ in paths}
    if args.baseline_rev:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                              args.baseline_rev], check=True, capture_output=True,
                             text=True).stdout.strip()
        tree = work / "baseline"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gateway", "llm_wire",
                                  "local_engine", "policies"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        paths.insert(2, (f"default@{rev}", DEFAULT_POLICY))
        sources[f"default@{rev}"] = tree
    rounds = []
    for i in range(args.repeat):
        # round i: its own arrivals, conversations and provider noise; the paths of a round
        # see the same ones (a paired comparison)
        mix_params = MixParams(n=args.n, warmup=args.warmup, seed=args.seed + i, tpm_limit=TPM)
        sim_params = {**sim_defaults(), **FAULTS.get(args.faults, {}), "seed": i}
        here = work / f"round-{i}" if args.repeat > 1 else work
        here.mkdir(exist_ok=True)
        rounds.append(run_round(paths, build(mix_params), mix_params, sim_params, here,
                                args.speed, sources))
        if args.repeat > 1:
            print(f"## round {i + 1} of {args.repeat}")
        print_report(rounds[-1][0])
    report = rounds[0][0] if args.repeat == 1 else {
        "rounds": [r for r, _ in rounds], "work": str(work),
        "pooled": pool_rounds(rounds), "gaps": {}}
    if args.repeat > 1:
        names = [n for n, _ in paths]
        for ours in [n for n in names if n not in ("direct", "litellm")]:
            if "litellm" in names:
                report["gaps"][f"{ours} vs litellm"] = gaps(
                    [r["paths"][ours] for r, _ in rounds], [r["paths"]["litellm"] for r, _ in rounds])
        print_pooled(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


def run_round(paths: list[tuple[str, str | None]], mix: list[Any], mix_params: Any,
              sim_params: dict[str, Any], work: Path, speed: float,
              sources: dict[str, Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every path once on one mix: (its report, the raw runs)."""
    runs: list[dict[str, Any]] = []
    for name, policy in paths:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        run = asyncio.run(run_path(name, policy, mix, sim_params, work, speed, sources[name]))
        with (work / f"{name}.results.jsonl").open("wb") as out:  # each request, for a look
            for r in [*run["warm_results"], *run["results"]]:
                out.write(orjson.dumps({**r.__dict__, "text": None}) + b"\n")
        runs.append(run)
    direct = next((r for r in runs if r["name"] == "direct"), None)
    by_id = {r.id: r for r in mix}
    report = {"mix": mix_params.to_dict(), "sim": sim_params, "work": str(work), "paths": {}}
    for run in runs:
        every = run["name"].startswith("every")
        summary = summarize(run, direct, by_id)
        summary["served_wrong"] = served_wrong(run, direct, by_id)
        summary["meaning_changed"] = meaning_changed(run, by_id, MODELS, compress=every)
        summary["lossy"] = lossy_quality(run, by_id)
        summary["provider"] = provider_time(run, by_id)
        report["paths"][run["name"]] = summary
    shares = {}  # each stage's share: what leaving it out of "every" or "default" gives back
    for name, s in report["paths"].items():
        base, _, stage = name.partition("-no-")
        whole = report["paths"].get(base) if stage else None
        if whole:
            shares[f"{base} without {stage}"] = {
                k: round(s[k] - whole[k], 4 if k == "cost_usd" else 1)
                for k in ("ttft_p50", "ttft_p95", "cost_usd", "cpu_s")
                if s.get(k) is not None and whole.get(k) is not None}
    report["stage_shares"] = shares
    for run in runs:  # the raw runs stay for pooling; what only a round's report needs goes
        run.pop("_recorded", None)
    return report, runs


if __name__ == "__main__":
    sys.exit(main())
