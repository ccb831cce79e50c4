"""Routing by difficulty: quality vs. weak-call share on the test split, latency, a live run.

    python bench/routing.py [--skip-live] [--router auto]

(a) Quality on ../shared/data/routing/labeled_prompts_test.jsonl (never used for training
    or calibration), per source (gsm8k, mmlu, all). Routing the lowest-scoring share of
    prompts to the weak model (Mixtral-8x7B) and the rest to the strong one (GPT-4), quality
    is weak_correct where routed weak, else strong_correct. Reported, for the shipped router
    and for random routing side by side: the curve, the weak-call share at 95% of
    strong-only accuracy, CPT(50%) and CPT(80%) (RouteLLM, arXiv 2406.18665: the smallest
    share of strong calls that recovers that fraction of the weak-to-strong accuracy gap),
    APGR (the average gap recovered over the curve), the oracle, and where the shipped
    operating point (policies/default.toml) lands.
(b) MT-Bench (mt_bench_judgements.jsonl: GPT-4 judge scores 1-10 of both models' answers,
    both turns): the same figures on open chat, scoring each question by its first turn.
(c) Router latency on CPU: the decision on top of a given embedding (text features and the
    ensemble), and with the embedding (all-MiniLM-L6-v2 through the engine thread, as the
    request path does when the cache has not embedded the text), p50/p99 ms; on 300 test
    prompts (mostly MMLU questions with their four choices) and on the 160 real chat
    prompts of MT-Bench and Vicuna (first turns).
(d) Live: a gateway whose small tier is the local engine (SmolLM2-135M) and whose large tier
    is a fake OpenAI upstream; the openai SDK sends model="auto"; each decision is printed
    from the response headers and the gateway's log line.

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.embedding import EmbeddingMemo
from gateway.policy import load_policy
from gateway.routing.decision import Routers
from gateway.routing.features import text_features
from gateway.tools.embeddings import embed_texts
from gateway.tools.train_router import calibration_curve, load_prompts

DATA = ROOT.parent / "shared" / "data"
POLICY = ROOT / "policies" / "default.toml"


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 4)


def figures(score: np.ndarray, weak: np.ndarray, strong: np.ndarray,
            threshold: float) -> dict[str, Any]:
    """Router vs. random routing on one set of prompts (quality may be accuracy or a mean
    judge score)."""
    _, share, rel = calibration_curve(score, weak, strong)
    acc = rel * strong.mean()  # absolute quality along the curve, share of weak calls rising
    s_acc, w_acc = float(strong.mean()), float(weak.mean())
    gap = s_acc - w_acc

    def weak_share_at(target: float) -> float:
        ok = np.nonzero(acc >= target - 1e-12)[0]
        return float(share[ok].max()) if ok.size else 0.0

    def random_share_at(target: float) -> float:
        return float(np.clip((s_acc - target) / gap, 0.0, 1.0)) if gap > 0 else 1.0

    out: dict[str, Any] = {"prompts": len(score), "strong_only": round(s_acc, 4),
                           "weak_only": round(w_acc, 4)}
    target = 0.95 * s_acc
    out["weak_share_at_95pct"] = round(weak_share_at(target), 4)
    out["random_weak_share_at_95pct"] = round(random_share_at(target), 4)
    oracle_gain = np.maximum(weak, strong).mean()
    out["oracle_quality_vs_strong"] = round(float(oracle_gain / s_acc), 4)
    for x in (0.5, 0.8):
        # CPT(x): smallest strong-call share recovering x of the gap (random: x).
        out[f"cpt_{int(x * 100)}"] = round(1.0 - weak_share_at(w_acc + x * gap), 4)
        out[f"random_cpt_{int(x * 100)}"] = x
    if gap > 0:
        recovered = (acc - w_acc) / gap  # along strong-call share 1 - share
        strong_share = 1.0 - share
        order = np.argsort(strong_share)
        apgr = np.trapezoid(recovered[order], strong_share[order])
        out["apgr"] = round(float(apgr), 4)
        out["random_apgr"] = 0.5
    to_strong = score >= threshold
    out["shipped_point"] = {
        "threshold": round(threshold, 4),
        "weak_share": round(float(1.0 - to_strong.mean()), 4),
        "quality_vs_strong": round(float(np.where(to_strong, strong, weak).mean() / s_acc), 4),
    }
    grid = np.linspace(0, 1, 11)
    out["curve"] = [{"weak_share": round(float(g), 2),
                     "quality_vs_strong": round(float(rel[round(float(g) * len(score))]), 4),
                     "random": round(float((s_acc - g * gap) / s_acc), 4)} for g in grid]
    return out


def scores(stage: Routers, artifact: str, prompts: list[str]) -> np.ndarray:
    router = stage.router(artifact)
    vectors = embed_texts(prompts)
    return np.array([router.score(v, text_features(p)) for v, p in zip(vectors, prompts,
                                                                       strict=True)])


def quality(stage: Routers, name: str) -> dict[str, Any]:
    policy = load_policy(POLICY).routing.routers[name]
    threshold = stage.threshold(policy)
    data = load_prompts(DATA / "routing" / "labeled_prompts_test.jsonl")
    score = scores(stage, policy.artifact, data.prompts)
    out: dict[str, Any] = {}
    for source in ("gsm8k", "mmlu", "all"):
        m = np.ones(len(score), bool) if source == "all" else data.source == source
        out[source] = figures(score[m], data.weak[m], data.strong[m], threshold)
    out["mt_bench"] = mt_bench(stage, policy.artifact, threshold)
    return out


def mt_bench(stage: Routers, artifact: str, threshold: float) -> dict[str, Any]:
    questions = {r["question_id"]: r["turns"][0] for r in map(orjson.loads, (
        DATA / "prompts" / "mt_bench_questions.jsonl").read_bytes().splitlines())}
    judged: dict[tuple[int, str], list[float]] = {}
    for line in (DATA / "routing" / "mt_bench_judgements.jsonl").read_bytes().splitlines():
        r = orjson.loads(line)
        strong = "gpt-4" in r["model"]
        judged.setdefault((r["question_id"], "strong" if strong else "weak"), []).append(
            float(r["score"]))
    ids = sorted(q for q in questions if (q, "strong") in judged and (q, "weak") in judged)
    weak = np.array([np.mean(judged[(q, "weak")]) for q in ids])
    strong = np.array([np.mean(judged[(q, "strong")]) for q in ids])
    score = scores(stage, artifact, [questions[q] for q in ids])
    return figures(score, weak, strong, threshold)


def latency(stage: Routers, name: str, n: int = 300) -> dict[str, Any]:
    """Per request, sequentially: the decision given the embedding, and with it computed."""
    from local_engine.async_engine import AsyncEngine
    from local_engine.embedder import Embedder

    policy = load_policy(POLICY).routing
    router = policy.routers[name]
    data = load_prompts(DATA / "routing" / "labeled_prompts_test.jsonl")
    rng = np.random.default_rng(0)
    sets = {"test_split": [data.prompts[i]
                           for i in rng.choice(len(data.prompts), n, replace=False)]}
    chat = []
    for f in ("mt_bench_questions.jsonl", "vicuna_bench_questions.jsonl"):
        chat += [orjson.loads(line)["turns"][0]
                 for line in (DATA / "prompts" / f).read_bytes().splitlines()]
    sets["chat_prompts"] = chat

    async def run() -> dict[str, Any]:
        embedder = Embedder.load()
        engine = AsyncEngine(None, embedder).start()
        out: dict[str, Any] = {"embedder": embedder.backend}
        try:
            stage.embed = engine.embed
            for label, prompts in sets.items():
                tokens = [embedder.count_tokens([p]) for p in prompts]
                vectors = embed_texts(prompts)
                given, full = [], []
                for prompt, vector in zip(prompts, vectors, strict=True):
                    memo = EmbeddingMemo()  # the embedding an earlier stage computed
                    memo[prompt] = vector
                    t = time.perf_counter()
                    await stage.decide(name, router, policy.tiers, prompt, 1, memo)
                    given.append((time.perf_counter() - t) * 1000)
                for prompt in prompts[:20]:  # warm the embedding path
                    await stage.decide(name, router, policy.tiers, prompt, 1, EmbeddingMemo())
                for prompt in prompts:
                    t = time.perf_counter()
                    await stage.decide(name, router, policy.tiers, prompt, 1, EmbeddingMemo())
                    full.append((time.perf_counter() - t) * 1000)
                out[label] = {"requests": len(prompts), "tokens_p50": float(np.median(tokens)),
                              "router_p50_ms": pct(given, 50), "router_p99_ms": pct(given, 99),
                              "with_embedding_p50_ms": pct(full, 50),
                              "with_embedding_p99_ms": pct(full, 99)}
        finally:
            engine.close()
        return out

    return asyncio.run(run())


def live(name: str, n: int) -> dict[str, Any]:
    """Gateway in process: small tier = local engine (SmolLM2), large tier = fake upstream."""
    import openai

    from gateway.app import create_app
    from gateway.config import load_config
    from gateway.testing.fake_upstream import FakeUpstream
    from gateway.testing.server import ServerThread

    data = load_prompts(DATA / "routing" / "labeled_prompts_test.jsonl")
    rng = np.random.default_rng(1)
    picks = [data.prompts[i] for i in rng.choice(len(data.prompts), n, replace=False)]
    records: list[dict[str, Any]] = []
    policy_text = POLICY.read_text().replace('large = ["gpt-4o"]', 'large = ["large-fake"]')
    with tempfile.TemporaryDirectory() as tmp, ServerThread(FakeUpstream()) as fake:
        Path(tmp, "policy.toml").write_text(policy_text)
        Path(tmp, "gateway.toml").write_text(f"""
[server]
policy = "policy.toml"
[logging]
requests = false  # the records come to the sink below, printed on stderr
[upstreams.local]
type = "local"
[upstreams.local.engine]
model = "smollm2"
[upstreams.fake]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{fake.url}/v1"
[models.smollm2]
targets = [{{ upstream = "local", model = "smollm2" }}]
[models."large-fake"]
targets = [{{ upstream = "fake", model = "gpt-4-fake" }}]
""")
        app = create_app(load_config(Path(tmp, "gateway.toml")), request_sink=records.append)
        with ServerThread(app) as gw:
            decisions = []
            with openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", timeout=120) as c:
                for prompt in picks:
                    r = c.chat.completions.with_raw_response.create(
                        model=name, messages=[{"role": "user", "content": prompt}],
                        max_tokens=16, temperature=0)
                    completion = r.parse()
                    decisions.append({"x-route-tier": r.headers.get("x-route-tier"),
                                      "x-route-score": r.headers.get("x-route-score"),
                                      "model": completion.model})
            app.gateway.logger.flush()
        fields = ("model_requested", "router", "route_tier", "route_score", "route_threshold",
                  "route_ms", "model_served", "upstream", "status", "total_ms")
        logged = [{k: rec.get(k) for k in fields} for rec in records]
    for d, rec in zip(decisions, logged, strict=False):
        print(orjson.dumps({"response": d, "log": rec}).decode(), file=sys.stderr)
    return {"requests": n,
            "by_tier": {t: sum(1 for d in decisions if d["x-route-tier"] == t)
                        for t in {d["x-route-tier"] for d in decisions}},
            "log_lines": logged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", default="auto")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--live-requests", type=int, default=10)
    args = parser.parse_args()
    stage = Routers()
    results: dict[str, Any] = {"router": args.router,
                               "artifact": stage.router(load_policy(POLICY).routing
                                                        .routers[args.router].artifact).version}
    results["quality"] = quality(stage, args.router)
    results["latency"] = latency(stage, args.router)
    if not args.skip_live:
        results["live"] = live(args.router, args.live_requests)
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    q, lat = results["quality"], results["latency"]
    print(" | ".join(
        f"{s}: weak share at 95% {q[s]['weak_share_at_95pct']:.3f} vs random "
        f"{q[s]['random_weak_share_at_95pct']:.3f}, CPT50 {q[s]['cpt_50']:.3f}, "
        f"CPT80 {q[s]['cpt_80']:.3f}" for s in ("gsm8k", "mmlu", "all", "mt_bench"))
        + "".join(f" | {k}: router p50 {lat[k]['router_p50_ms']} ms, with embedding "
                  f"{lat[k]['with_embedding_p50_ms']} ms ({lat[k]['tokens_p50']:.0f} tokens)"
                  for k in ("test_split", "chat_prompts")))


if __name__ == "__main__":
    main()
