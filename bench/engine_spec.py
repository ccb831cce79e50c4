"""Part 5 of ``bench/engine.py``: n-gram speculative decoding off vs. on (see its docstring).

Imported only when that part runs (so that ``--baseline-rev`` children can import the bench
with an engine that predates speculation).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

import orjson
import spec_workloads as wl

from local_engine.engine import Engine, EngineConfig
from local_engine.sequence import SamplingParams
from local_engine.speculative import SpecConfig

__all__ = ["spec_summary", "speculation"]


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def timed(engine: Engine, prompts: list[list[int]], max_tokens: int,
          stats: dict[str, Any]) -> tuple[list[list[int]], int, float, int, float]:
    """Run ``prompts`` together to the end: outputs, decode tokens, decode seconds (summed
    over requests, each from its first token to its end), output tokens, wall seconds. Adds
    the speculation figures of every step to ``stats``."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    seqs = [engine.add(p, params) for p in prompts]
    ended: dict[int, float] = {}
    t0 = time.perf_counter()
    while engine.has_work():
        for out in engine.step():
            if out.finished:
                ended[out.seq.seq_id] = time.perf_counter()
        last = engine.last
        for key in ("drafts", "draft_tokens", "accepted", "decodes", "decode_tokens"):
            stats[key] = stats.get(key, 0) + getattr(last, key)
        at = stats.setdefault("accepted_at", [])
        at.extend([0] * (len(last.accepted_at) - len(at)))
        for j, n in enumerate(last.accepted_at):
            at[j] += n
    wall = time.perf_counter() - t0
    decode_s = sum(ended[s.seq_id] - (s.first_token_at or 0.0) for s in seqs)
    outputs = [s.output_ids for s in seqs]
    return (outputs, sum(len(o) - 1 for o in outputs), decode_s, sum(map(len, outputs)),
            wall)


def spec_workload(engines: dict[str, Engine], prompts: list[list[int]], batch: int,
                  max_tokens: int, rounds: int = 1) -> dict[str, Any]:
    """Off vs. on, alternating per group of ``batch`` prompts (and per round), which one
    goes first alternating too."""
    fig: dict[str, dict[str, Any]] = {n: {"decode_tokens": 0, "decode_s": 0.0, "tokens": 0,
                                          "wall_s": 0.0, "stats": {}} for n in engines}
    outputs: dict[str, list[list[int]]] = {n: [] for n in engines}
    order = list(engines.items())
    for r in range(rounds):
        for i in range(0, len(prompts), batch):
            order.reverse()  # off first, then on first: the order does not favour one
            for name, engine in order:
                f = fig[name]
                out, dt, ds, t, w = timed(engine, prompts[i:i + batch], max_tokens, f["stats"])
                f["decode_tokens"] += dt
                f["decode_s"] += ds
                f["tokens"] += t
                f["wall_s"] += w
                if r == 0:
                    outputs[name].extend(out)
    result: dict[str, Any] = {"prompts": len(prompts), "batch": batch, "rounds": rounds,
                              "max_tokens": max_tokens}
    for name, f in fig.items():
        result[name] = {"decode_tok_s": round(f["decode_tokens"] / f["decode_s"], 2),
                        "tok_s": round(f["tokens"] / f["wall_s"], 2),
                        "output_tokens": f["tokens"]}
    st = fig["on"]["stats"]
    result["decode_ratio"] = round(result["on"]["decode_tok_s"] / result["off"]["decode_tok_s"],
                                   3)
    result["tok_s_ratio"] = round(result["on"]["tok_s"] / result["off"]["tok_s"], 3)
    result["identical_outputs"] = sum(a == b for a, b in zip(outputs["off"], outputs["on"],
                                                             strict=True))
    result["acceptance"] = {
        "drafts": st.get("drafts", 0), "draft_tokens": st.get("draft_tokens", 0),
        "accepted_tokens": st.get("accepted", 0),
        "accepted_by_position": st.get("accepted_at", []),
        "accept_rate": round(st.get("accepted", 0) / max(1, st.get("draft_tokens", 0)), 3),
        "mean_acceptance_length": round(st.get("decode_tokens", 0)
                                        / max(1, st.get("decodes", 0)), 3)}
    return result


def speculation(loaded: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Part 5."""
    tok = loaded.tokenizer
    spec = SpecConfig.from_dict(orjson.loads(args.spec_config))

    def ids(texts: list[str]) -> list[list[int]]:
        return [chat_ids(tok, t) for t in texts]

    def engines(on: SpecConfig = spec, **kw: Any) -> dict[str, Engine]:
        config = {"max_num_seqs": 32, "max_batch_tokens": 512, "kv_cache_mb": 256, **kw}
        return {name: Engine(loaded.model, lambda x: tok.decode(x), EngineConfig(
            speculative=s, **config), loaded.eos_token_ids) for name, s in
            (("off", None), ("on", on))}

    out: dict[str, Any] = {"config": spec.__dict__, "split": args.spec_split}
    n, m = args.spec_prompts, args.spec_max_tokens
    if n:
        timed(engines()["on"], ids(wl.mt_bench(1)), 4, {})  # warm-up
        out["grounded_b1"] = spec_workload(engines(), ids(wl.grounded(n, args.spec_split)), 1, m)
        out["mt_bench_b1"] = spec_workload(engines(), ids(wl.mt_bench(n, args.spec_split)), 1, m)
        out["mt_bench_b32"] = spec_workload(engines(), ids(wl.mt_bench(32, args.spec_split)),
                                            32, m, rounds=args.spec_rounds)
    if args.lossless_prompts:
        prompts = ids(wl.mt_bench(args.lossless_prompts))
        for batch in (1, 8):
            # drafts in every step (speculation is not skipped at batch 8 here), prompts
            # prefilled in chunks of 64 tokens, and KV for about 5 sequences of 250 tokens
            wide = replace(spec, max_batch_size=batch,
                           max_step_tokens=batch * (1 + spec.num_tokens))
            kw = {"max_num_seqs": batch, "max_batch_tokens": 64,
                  "num_blocks": 40 if batch == 1 else 80, "block_size": 16}
            pair = engines(wide, **kw)
            res = spec_workload(pair, prompts, batch, 128)
            res["preemptions"] = {k: e.scheduler.num_preempted for k, e in pair.items()}
            res["prefix_hit_rate"] = {k: round(e.blocks.hit_rate, 3) for k, e in pair.items()}
            out[f"lossless_b{batch}"] = res
    return out



def spec_summary(sp: dict[str, Any]) -> str:
    parts = []
    for key, v in sp.items():
        if isinstance(v, dict) and "decode_ratio" in v:
            ratio = v["decode_ratio"] if v["batch"] == 1 else v["tok_s_ratio"]
            parts.append(f"{key} {v['off']['decode_tok_s' if v['batch'] == 1 else 'tok_s']}"
                         f" -> {v['on']['decode_tok_s' if v['batch'] == 1 else 'tok_s']} tok/s"
                         f" = {ratio}x (identical {v['identical_outputs']}/{v['prompts']}, "
                         f"acceptance length {v['acceptance']['mean_acceptance_length']})")
    return "speculation: " + "; ".join(parts)
