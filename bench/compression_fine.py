"""Coarse alone against coarse + fine (``token_level``), side by side (part of
``bench/compression.py``, ``--fine N``).

The fine pass (:mod:`gateway.compression.fine`) is scored by SmolLM2-135M-Instruct, the
local engine's model, run in this process through the engine's own scoring code
(:class:`local_engine.scorer.ScoreBatch` and :func:`~local_engine.scorer.encode_text`, what
``/v1/completions`` runs), on the CPU unless a GPU is present.

- Retention: the first N NQ items of the split and every KV item, gold at each position;
  each context is compressed coarse alone at 2x and 4x, then coarse + fine to the very
  same token budget (the coarse result's own token count), so both compare at the same
  achieved ratio. Scores are memoised on disk per text (``.cache/compression``): a unit
  kept at several positions and ratios is scored once, as the embedding memo does.
- Time: coarse + fine on ``--timing`` NQ contexts at 4x with live embedding and live
  scoring (no memo): ms per 1,000 context tokens, and the scoring's share.
- End to end (``--fine-e2e N``): the local engine reads the same prompts compressed coarse
  alone and coarse + fine (2x, 4x; tokens in its own tokenizer), as
  ``bench/compression_e2e.py`` reads them.
- ``--fine-tune``: the options grid (:class:`~gateway.compression.fine.FineOptions`) on dev.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from compression_data import KV_QUESTION, POSITIONS, Item, kv_context, normalize, rate

from gateway.compression import compress
from gateway.compression.fine import FINE, FineOptions, Scored
from gateway.compression.tokens import CountTokens
from gateway.embedding import Embed

__all__ = ["EngineScorer", "e2e", "print_tune", "run", "side_by_side", "summary_parts",
           "timing", "tune"]

RATIOS = (2.0, 4.0)


class EngineScorer:
    """A :data:`~gateway.compression.fine.Score` on SmolLM2 in this process; ``path``:
    where scores are memoised (None: every call scores live). ``spent_s``: scoring time."""

    def __init__(self, path: Path | None = None) -> None:
        import torch

        from local_engine.loader import load

        torch.set_num_threads(os.cpu_count() or 1)
        self.loaded = load("smollm2")
        self.path = path
        self.memo: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.new = 0
        self.spent_s = 0.0
        self.tokens = 0
        if path is not None and path.exists():
            with np.load(path) as saved:
                cuts = np.cumsum(saved["lengths"])[:-1]
                for key, offsets, logprobs in zip(saved["keys"].tolist(),
                                                  np.split(saved["offsets"], cuts),
                                                  np.split(saved["logprobs"], cuts)):
                    self.memo[key] = (offsets, logprobs)

    async def __call__(self, texts: list[str]) -> list[Scored]:
        from local_engine.scorer import ScoreBatch, encode_text

        keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if self.path is None or k not in self.memo}
        if todo:
            t0 = time.perf_counter()
            encoded = [encode_text(self.loaded.tokenizer, t) for t in todo.values()]
            batch = ScoreBatch(self.loaded.model, [ids for ids, _ in encoded])
            while not batch.advance():
                pass
            for key, (_, offsets), logprobs in zip(todo, encoded, batch.logprobs):
                self.memo[key] = (np.asarray(offsets, np.int32), logprobs)
            self.spent_s += time.perf_counter() - t0
            self.tokens += batch.tokens
            self.new += len(todo)
        return [Scored(self.memo[k][0].astype(np.int64), self.memo[k][1].astype(np.float64))
                for k in keys]

    def save(self) -> None:
        if self.path is None or not self.new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self.memo)
        np.savez(self.path, keys=np.array(keys),
                 lengths=np.array([len(self.memo[k][0]) for k in keys]),
                 offsets=np.concatenate([self.memo[k][0] for k in keys]),
                 logprobs=np.concatenate([self.memo[k][1] for k in keys]))


def _has(text: str, answers: list[str]) -> bool:
    n = normalize(text)
    return any(a in n for a in answers)


async def side_by_side(items: list[Item], kv: list[dict[str, Any]], embed: Embed,
                       count: CountTokens, scorer: EngineScorer,
                       options: FineOptions = FINE,
                       positions: tuple[int, ...] = POSITIONS) -> dict[str, Any]:
    """Answer retention (NQ) and KV retrieval, coarse alone and coarse + fine at the same
    token count, at 2x and 4x; the fine pass's outcomes; a sample of its output."""
    out: dict[str, Any] = {"options": {"slack": options.slack, "whole": options.whole,
                                       "keep_names": options.keep_names}}
    for ratio in RATIOS:
        hits: dict[str, dict[int, list[bool]]] = {"coarse": {}, "fine": {}}
        achieved: dict[str, list[float]] = {"coarse": [], "fine": []}
        outcomes: dict[str, int] = {}
        sample = None
        for position in positions:
            for per in hits.values():
                per[position] = []
            for item in items:
                context = item.context(position)
                answers = [a for a in map(normalize, item.answers) if a.strip()]
                if not _has(context, answers):
                    continue
                coarse = await compress(context, item.question, ratio, embed, count)
                same = coarse.tokens_before / (coarse.tokens_after + 0.5)
                fine = await compress(context, item.question, same, embed, count,
                                      score=scorer, options=options)
                outcomes[fine.fine or "none"] = outcomes.get(fine.fine or "none", 0) + 1
                for method, result in (("coarse", coarse), ("fine", fine)):
                    hits[method][position].append(_has(result.text, answers))
                    achieved[method].append(result.ratio)
                if sample is None and fine.fine == "applied":
                    sample = {"question": item.question, "answers": list(item.answers),
                              "text": fine.text[:1200]}
        row: dict[str, Any] = {"items": len(hits["coarse"][positions[0]]),
                               "fine_outcomes": outcomes}
        for method in hits:
            per = {str(p): rate(hits[method][p]) for p in positions}
            row[method] = {"achieved_ratio_mean": round(statistics.fmean(achieved[method]), 3),
                           "mean_over_positions": round(statistics.fmean(per.values()), 4),
                           "min_over_positions": min(per.values()), "by_position": per}
        row["sample"] = sample
        out[f"{ratio:g}x"] = row
    out["kv"] = await _kv(kv, embed, count, scorer, options)
    return out


async def _kv(rows: list[dict[str, Any]], embed: Embed, count: CountTokens,
              scorer: EngineScorer, options: FineOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ratio in RATIOS:
        kept: dict[str, list[bool]] = {"coarse": [], "fine": []}
        outcomes: dict[str, int] = {}
        for row in rows:
            context = kv_context(row["ordered_kv_records"])
            question = KV_QUESTION.format(key=row["key"])
            coarse = await compress(context, question, ratio, embed, count)
            same = coarse.tokens_before / (coarse.tokens_after + 0.5)
            fine = await compress(context, question, same, embed, count, score=scorer,
                                  options=options)
            outcomes[fine.fine or "none"] = outcomes.get(fine.fine or "none", 0) + 1
            for method, result in (("coarse", coarse), ("fine", fine)):
                kept[method].append(f'"{row["key"]}": "{row["value"]}"' in result.text)
        out[f"{ratio:g}x"] = {"items": len(rows), "coarse": rate(kept["coarse"]),
                              "fine": rate(kept["fine"]), "fine_outcomes": outcomes}
    return out


async def timing(items: list[Item], embedder: Any, count: CountTokens) -> dict[str, Any]:
    """Live: coarse alone and coarse + fine at 4x, ms per 1k context tokens."""
    scorer = EngineScorer(None)

    async def embed(texts: list[str]) -> np.ndarray:
        vectors: np.ndarray = embedder(texts)
        return vectors

    cases = [(item.context(POSITIONS[i % len(POSITIONS)]), item.question)
             for i, item in enumerate(items)]
    await compress(*cases[0], 4.0, embed, count, score=scorer)  # warm-up
    coarse, fine, scoring, per_scored = [], [], [], []
    for context, question in cases:
        result = await compress(context, question, 4.0, embed, count)
        coarse.append(result.ms / result.tokens_before * 1e3)
        scorer.spent_s, scorer.tokens = 0.0, 0
        result = await compress(context, question, 4.0, embed, count, score=scorer)
        fine.append(result.ms / result.tokens_before * 1e3)
        scoring.append(scorer.spent_s * 1e3 / result.ms)
        if scorer.tokens:
            per_scored.append(scorer.spent_s * 1e6 / scorer.tokens)
    import torch

    return {"contexts": len(cases), "device": str(scorer.loaded.model.lm_head.weight.device),
            "torch_threads": torch.get_num_threads(), "load_average_1m": os.getloadavg()[0],
            "coarse_ms_per_1k_tokens_p50": round(statistics.median(coarse), 1),
            "fine_ms_per_1k_tokens_p50": round(statistics.median(fine), 1),
            "fine_ms_per_1k_tokens_p90": round(float(np.percentile(fine, 90)), 1),
            "scoring_share": round(statistics.fmean(scoring), 3),
            "scoring_ms_per_1k_scored_tokens_p50": round(statistics.median(per_scored), 1)
            if per_scored else None}


async def tune(items: list[Item], embed: Embed, count: CountTokens, scorer: EngineScorer
               ) -> dict[str, Any]:
    """Dev: retention of each :class:`FineOptions` in the grid, gold at positions 1, 10."""
    table = []
    for slack, whole, names in itertools.product((1.25, 1.5, 2.0), (0, 1, 2), (True, False)):
        doc = await side_by_side(items, [], embed, count, scorer,
                                 FineOptions(slack, whole, names), (1, 10))
        table.append({"slack": slack, "whole": whole, "keep_names": names, **{
            f"{r}_{m}": doc[r][m]["mean_over_positions"] for r in ("4x", "2x")
            for m in ("coarse", "fine")}, **{f"{r}_applied": doc[r]["fine_outcomes"].get(
                "applied", 0) for r in ("4x", "2x")}})
    table.sort(key=lambda r: (-r["4x_fine"], -r["2x_fine"]))
    return {"items": len(items), "table": table}


async def e2e(items: list[Item], embedder: Any, limit: int, scorer: EngineScorer
              ) -> dict[str, Any]:
    """The local engine reads ``limit`` items compressed coarse alone and coarse + fine at
    the same token count, 2x and 4x: accuracy overall and by gold position."""
    from compression_e2e import POSITIONS as E2E_POSITIONS
    from compression_e2e import Reader, engine_counter, pick, qa_prompt

    async def embed(texts: list[str]) -> np.ndarray:
        vectors: np.ndarray = embedder(texts)
        return vectors

    rows: list[dict[str, Any]] = []
    async with Reader() as reader:
        count, tokenizer = engine_counter()
        for item, position in pick(items, limit):
            answers = [a for a in map(normalize, item.answers) if a.strip()]
            for ratio in RATIOS:
                coarse = await compress(item.context(position), item.question, ratio, embed,
                                        count)
                fine = await compress(item.context(position), item.question,
                                      coarse.tokens_before / (coarse.tokens_after + 0.5),
                                      embed, count, score=scorer)
                for method, result in (("coarse", coarse), ("fine", fine)):
                    read = await reader.ask(qa_prompt(result.text, item.question))
                    rows.append({"method": method, "ratio": ratio, "position": position,
                                 "fine": result.fine, "tokens": result.tokens_after,
                                 "correct": _has(read.text, answers),
                                 "in_prompt": _has(result.text, answers)})
    out: dict[str, Any] = {"items": len(rows) // 4, "tokens": tokenizer,
                           "positions": list(E2E_POSITIONS)}
    for ratio, method in itertools.product(RATIOS, ("coarse", "fine")):
        mine = [r for r in rows if r["ratio"] == ratio and r["method"] == method]
        out[f"{ratio:g}x_{method}"] = {
            "accuracy": rate([r["correct"] for r in mine]),
            "by_position": {str(p): rate([r["correct"] for r in mine if r["position"] == p])
                            for p in E2E_POSITIONS},
            "answer_in_prompt": rate([r["in_prompt"] for r in mine]),
            "prompt_tokens_mean": round(statistics.fmean(r["tokens"] for r in mine))
            if mine else 0}
    return out


def summary_parts(doc: dict[str, Any]) -> list[str]:
    """The summary line's fine-pass parts."""
    fine = doc["fine"]
    parts = []
    for r in ("4x", "2x"):
        row = fine[r]
        c, f = row["coarse"], row["fine"]
        pos = "/".join(f"{v:.0%}" for v in f["by_position"].values())
        parts.append(f"token_level NQ {r} ({row['items']} items, achieved {c['achieved_ratio_mean']}"
                     f"x vs {f['achieved_ratio_mean']}x) retention coarse "
                     f"{c['mean_over_positions']:.1%} vs coarse+fine {f['mean_over_positions']:.1%}"
                     f" [pos: {pos}], fine applied {row['fine_outcomes'].get('applied', 0)}")
    kv = fine["kv"]
    parts.append("token_level KV " + ", ".join(
        f"{r} coarse {kv[r]['coarse']:.0%} vs fine {kv[r]['fine']:.0%}" for r in ("4x", "2x")))
    if "fine_timing" in doc:
        t = doc["fine_timing"]
        parts.append(f"token_level ms per 1k tokens p50 {t['fine_ms_per_1k_tokens_p50']} "
                     f"(coarse alone {t['coarse_ms_per_1k_tokens_p50']}, scoring "
                     f"{t['scoring_share']:.0%}, {t['device']})")
    if "fine_e2e" in doc:
        e = doc["fine_e2e"]
        parts.append(f"token_level e2e ({e['items']} items) accuracy " + ", ".join(
            f"{r} coarse {e[f'{r}_coarse']['accuracy']:.1%} vs fine "
            f"{e[f'{r}_fine']['accuracy']:.1%}" for r in ("2x", "4x")))
    return parts


async def run(items: list[Item], kv: list[dict[str, Any]], embed: Embed, embedder: Any,
              count: CountTokens, limit: int, timed: int, e2e_limit: int, path: Path
              ) -> dict[str, Any]:
    """``bench/compression.py``'s fine part: the side by side on the first ``limit`` items
    (all KV ones), live timing on ``timed`` contexts, the reader on ``e2e_limit`` items."""
    scorer = EngineScorer(path)
    try:
        doc: dict[str, Any] = {"fine": await side_by_side(items[:limit], kv, embed, count,
                                                          scorer)}
        if e2e_limit:
            doc["fine_e2e"] = await e2e(items, embedder, e2e_limit, scorer)
    finally:
        scorer.save()
    if timed:
        doc["fine_timing"] = await timing(items[:timed], embedder, count)
    return doc


async def print_tune(items: list[Item], embed: Embed, count: CountTokens, cache: Path) -> int:
    """``--fine-tune``: :func:`tune` on dev, printed as JSON and one line per option."""
    scorer = EngineScorer(cache / "smollm2_scores.npz")
    try:
        doc = await tune(items, embed, count, scorer)
    finally:
        scorer.save()
    print(json.dumps(doc, indent=2))
    for row in doc["table"]:
        print("compression fine tune (dev): " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return 0
