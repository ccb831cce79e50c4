"""``gateway route eval|train``: audit the router on your own prompts, or retrain it.

    gateway route eval --prompts FILE [--router NAME] [--policy policies/default.toml]

reads a JSONL file with a ``prompt`` field per line and prints, per prompt, one JSON line:
its index (and ``id`` when the row has one), the router's score, the threshold and the tier
chosen at the policy's operating point. Rows that also carry ``weak_correct`` and
``strong_correct`` (like ../shared/data/routing/labeled_prompts_*.jsonl) get a summary line
on stderr: weak-call share and quality relative to strong-only accuracy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson

__all__ = ["add_arguments"]

ROOT = Path(__file__).resolve().parents[2]


def _eval(args: argparse.Namespace) -> int:
    from gateway.policy import load_policy
    from gateway.routing.decision import Routers
    from gateway.routing.features import text_features
    from gateway.tools.embeddings import embed_texts

    policy = load_policy(Path(args.policy)).routing
    name = args.router or next(iter(policy.routers), None)
    if name is None or name not in policy.routers:
        known = ", ".join(policy.routers) or "none"
        print(f"error: no router '{name}' in {args.policy} (routers: {known})", file=sys.stderr)
        return 2
    router_policy = policy.routers[name]
    stage = Routers()
    router = stage.router(router_policy.artifact)
    threshold = stage.threshold(router_policy)
    rows = [orjson.loads(line) for line in Path(args.prompts).read_bytes().splitlines()
            if line.strip()]
    missing = [i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)]
    if missing:
        print(f"error: line {missing[0] + 1} of {args.prompts} has no string 'prompt'",
              file=sys.stderr)
        return 2
    prompts = [r["prompt"] for r in rows]
    vectors = embed_texts(prompts, cache=False)
    strong_tier: list[bool] = []
    out = sys.stdout
    for i, (row, prompt, vector) in enumerate(zip(rows, prompts, vectors, strict=True)):
        score = router.score(vector, text_features(prompt))
        strong = score >= threshold
        strong_tier.append(strong)
        line: dict[str, Any] = {"index": i}
        if "id" in row or "question_id" in row:
            line["id"] = row.get("id", row.get("question_id"))
        line |= {"score": round(score, 4), "threshold": round(threshold, 4),
                 "tier": router_policy.strong if strong else router_policy.weak}
        out.write(orjson.dumps(line).decode() + "\n")
    if rows and all("weak_correct" in r and "strong_correct" in r for r in rows):
        weak = np.array([float(bool(r["weak_correct"])) for r in rows])
        strong_acc = np.array([float(bool(r["strong_correct"])) for r in rows])
        to_strong = np.array(strong_tier)
        quality = np.where(to_strong, strong_acc, weak).mean() / max(strong_acc.mean(), 1e-9)
        print(orjson.dumps({"router": name, "prompts": len(rows),
                            "weak_share": round(float(1 - to_strong.mean()), 4),
                            "quality_vs_strong": round(float(quality), 4)}).decode(),
              file=sys.stderr)
    return 0


def _train(args: argparse.Namespace) -> int:
    from gateway.tools.train_router import main

    argv = ["--prompts", args.prompts] if args.prompts else []
    return main(argv + (["--out", args.out] if args.out else []))


def add_arguments(route: argparse.ArgumentParser) -> None:
    """Fill the ``gateway route`` parser: its eval and train actions."""
    actions = route.add_subparsers(dest="route_command", required=True)
    ev = actions.add_parser("eval", help="each prompt's score and tier at the shipped "
                            "operating point, one JSON line per prompt")
    ev.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field per line")
    ev.add_argument("--router", help="router name in the policy (default: its first)")
    ev.add_argument("--policy", default=str(ROOT / "policies" / "default.toml"))
    ev.set_defaults(func=_eval)
    tr = actions.add_parser("train", help="retrain the shipped router (dev prompts only)")
    tr.add_argument("--prompts")
    tr.add_argument("--out")
    tr.set_defaults(func=_train)
