"""Compression end to end (part of ``bench/compression.py``, ``--e2e N``): the local engine
answering from compressed prompts, and the net-positive gate's decisions against what
compressing actually saved.

Reader: ``python -m local_engine`` (SmolLM2-135M-Instruct on CPU, the command the gateway's
``type = "local"`` upstream runs, ``--max-model-len 8192`` so that 40 documents fit, no
embeddings) on a free loopback port, streamed, greedy (temperature 0), at most 24 tokens.
The user message is lost-in-the-middle's QA template (Liu et al., TACL 2024): instruction,
the documents, ``Question: ...\\nAnswer:``. The system message is the chat template's default
with a request number in front, so that the engine's prefix cache never serves one prompt's
blocks to another (its ``cached_tokens`` are reported). Accuracy: a gold answer (SQuAD
normalisation) appears in the output. The first N test items whose answer is in the context,
gold at position 1, 10, 20 in turn, each read uncompressed and compressed 2x and 4x (the
documents only; the question is passed apart, as the retention runs do), one after the
other; tokens counted in the engine's own tokenizer (its ``tokenizer.json``). TTFT: from
sending to the first content chunk.

Gate: every measured pair (a prompt uncompressed and compressed) of the e2e items, plus a
mix of 2, 5, 10 and 40 documents (4x, read for one token), decided as the ``compress``
stage decides: ``gate.decide`` on the documents' estimated tokens (UTF-8 bytes / 4), the
policy's margin, a :class:`CompressorRate` whose prior is the timing section's NQ p50 and
which observes each compression the gate lets through (the stage's ``min_tokens`` rule,
which leaves context under 1,024 estimated tokens alone before the gate is asked, is not
applied: the gate alone is judged). Two kinds of upstream:

- the local engine: prefill rate learned by :class:`PrefillRate` from all the uncompressed
  TTFTs measured here (in sample); saved = TTFT uncompressed - compressed, measured;
- hosted models with a set prefill rate (``--hosted-ms-per-token``; 0.02 ms/token, 50,000
  tokens/s, is an assumption typical of a hosted GPU model, not a measurement): the same
  documents compressed in o200k_base; saved = tokens removed x the rate.

The compressor's time is measured on every prompt (live MiniLM embedding). A decision is
right when compressing saved more than the compressor took, or skipping avoided a
compressor that would have taken at least what it saved; the target: no prompt compressed
at a loss.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp
import numpy as np
from compression_data import Item, normalize, rate
from processes import ROOT, chat_chunks, wait_ready

from gateway.compression import compress
from gateway.compression.gate import CompressorRate, PrefillRate, decide
from gateway.compression.policy import CompressionPolicy
from gateway.compression.tokens import CountTokens, estimate, o200k, tokenizer_file
from gateway.upstreams.ports import free_port

__all__ = ["checks", "run", "summary_parts"]

INSTRUCTION = ("Write a high-quality answer for the given question using only the provided "
               "search results (some of which might be irrelevant).")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # its default
POSITIONS = (1, 10, 20)
RATIOS = (2.0, 4.0)
MIX_DOCS = (2, 5, 10, 40)
MAX_TOKENS = 24
MARGIN_MS = CompressionPolicy().margin_ms


def qa_prompt(documents: str, question: str) -> str:
    return f"{INSTRUCTION}\n\n{documents}\n\nQuestion: {question}\nAnswer:"


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Case:
    """One prompt compressed ``ratio`` times, for the gate: its documents' estimated tokens
    (as the stage counts them), tokens before and after in the upstream's tokenizer, the
    compressor's measured ms, and the prefill time it saved (ms)."""

    label: str
    ratio: float
    estimated: int
    tokens_before: int
    tokens_after: int
    compressor_ms: float
    saved_ms: float


class Reader:
    """The local engine, started as the gateway starts it, on a free loopback port."""

    process: asyncio.subprocess.Process
    session: aiohttp.ClientSession

    def __init__(self, max_model_len: int = 8192) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.command = [sys.executable, "-m", "local_engine", "--host", "127.0.0.1",
                        "--port", self.url.rsplit(":", 1)[1], "--model", "smollm2",
                        "--max-model-len", str(max_model_len), "--no-embeddings"]
        self.answers: list[Answer] = []

    async def __aenter__(self) -> Self:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
        try:
            await wait_ready(f"{self.url}/healthz", timeout=300.0)
        except BaseException:
            await self._stop()
            raise
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.session.close()
        await self._stop()

    async def _stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited 10 s later."""
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 10.0)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    async def ask(self, prompt: str, max_tokens: int = MAX_TOKENS) -> Answer:
        body = {"model": "smollm2", "temperature": 0, "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": f"Request {len(self.answers) + 1}. {SYSTEM}"},
                             {"role": "user", "content": prompt}]}
        parts: list[str] = []
        ttft: float | None = None
        usage: dict[str, Any] = {}
        started = time.perf_counter()
        async with self.session.post(f"{self.url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"engine answered {r.status}: {(await r.read())[:300]!r}")
            async for chunk in chat_chunks(r):
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    if content := (choice.get("delta") or {}).get("content"):
                        if ttft is None:
                            ttft = (time.perf_counter() - started) * 1e3
                        parts.append(content)
        if ttft is None:  # no content at all (an immediate end of sequence): the answer's end
            ttft = (time.perf_counter() - started) * 1e3
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.answers.append(Answer("".join(parts), ttft, usage.get("prompt_tokens", 0), cached))
        return self.answers[-1]


def engine_counter() -> tuple[CountTokens, str]:
    from local_engine.paths import DEFAULT_MODEL, converted

    folder = converted(DEFAULT_MODEL)  # the engine converted it when it started
    if folder is None:
        return o200k(), "o200k_base (the engine's tokenizer.json not found)"
    return tokenizer_file(folder / "tokenizer.json"), f"{folder.name} tokenizer.json"


def mixed(items: list[Item], sizes: tuple[int, ...]) -> list[tuple[str, str]]:
    """(documents, question) of ``sizes`` documents each: item j's gold passage first, then
    its distractors, then the passages of the items after it."""
    out = []
    for j, size in enumerate(sizes):
        passages = [p for item in items[j:] for p in (item.gold, *item.distractors)]
        out.append(("\n".join(f"Document [{i}]{p}" for i, p in enumerate(passages[:size], 1)),
                    items[j].question))
    return out


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def pick(items: list[Item], limit: int) -> list[tuple[Item, int]]:
    """The first ``limit`` items whose gold answer is in their context, gold at position 1,
    10, 20 in turn."""
    chosen: list[tuple[Item, int]] = []
    for item in items:
        if len(chosen) == limit:
            break
        position = POSITIONS[len(chosen) % len(POSITIONS)]
        answers = [a for a in map(normalize, item.answers) if a.strip()]
        if any(a in normalize(item.context(position)) for a in answers):
            chosen.append((item, position))
    return chosen


def scored(name: str, item: Item, position: int, documents: str, read: Answer, ms: float,
           count: CountTokens) -> dict[str, Any]:
    """One reading: correct when a gold answer (normalised) is in the output."""
    answers = [a for a in map(normalize, item.answers) if a.strip()]
    return {"variant": name, "position": position, "question": item.question,
            "gold": item.answers[0], "answer": read, "tokens": count(documents), "ms": ms,
            "correct": any(a in normalize(read.text) for a in answers),
            "in_prompt": any(a in normalize(documents) for a in answers)}


async def run(items: list[Item], embedder: Any, limit: int, prior_ms_per_1k: float,
              hosted: tuple[float, ...]) -> dict[str, Any]:
    """Read ``limit`` of ``items`` on the engine (off, 2x, 4x), and the mix built from the
    last items; then judge the gate on those prompts for the engine and for each ``hosted``
    prefill rate (ms/token). ``embedder``: texts -> vectors (all-MiniLM-L6-v2, called
    live). The figures for ``doc["e2e"]`` and ``doc["gate"]``."""

    async def embed(texts: list[str]) -> np.ndarray:
        vectors: np.ndarray = embedder(texts)
        return vectors

    names = ["off", *(f"{r:g}x" for r in RATIOS)]
    rows: list[dict[str, Any]] = []
    uncompressed: list[Answer] = []
    cases: list[Case] = []
    prompts: list[tuple[str, str, str, float]] = []  # label, documents, question, ratio
    async with Reader() as reader:
        count, tokenizer = engine_counter()
        t0 = time.perf_counter()
        for item, position in pick(items, limit):
            documents, question = item.context(position), item.question
            off = await reader.ask(qa_prompt(documents, question))
            uncompressed.append(off)
            rows.append(scored("off", item, position, documents, off, 0.0, count))
            for ratio in RATIOS:  # the same prompt compressed, read right after it
                result = await compress(documents, question, ratio, embed, count)
                on = await reader.ask(qa_prompt(result.text, question))
                rows.append(scored(f"{ratio:g}x", item, position, result.text, on, result.ms,
                                   count))
                cases.append(Case(f"e2e pos {position}", ratio, estimate(documents),
                                  result.tokens_before, result.tokens_after, result.ms,
                                  off.ttft_ms - on.ttft_ms))
                prompts.append((f"e2e pos {position}", documents, question, ratio))
        e2e_s = time.perf_counter() - t0
        mix = mixed(items[-len(MIX_DOCS) - 1:], MIX_DOCS)
        for k, (documents, question) in zip(MIX_DOCS, mix):
            label = f"mix {k} docs"
            result = await compress(documents, question, 4.0, embed, count)
            off = await reader.ask(qa_prompt(documents, question), 1)
            on = await reader.ask(qa_prompt(result.text, question), 1)
            uncompressed.append(off)
            cases.append(Case(label, 4.0, estimate(documents), result.tokens_before,
                              result.tokens_after, result.ms, off.ttft_ms - on.ttft_ms))
            prompts.append((label, documents, question, 4.0))
        cached = max(a.cached_tokens for a in reader.answers)
    learned, slope = PrefillRate(), PrefillRate(z=0.0)
    for a in uncompressed:
        learned.observe(a.prompt_tokens, a.ttft_ms)
        slope.observe(a.prompt_tokens, a.ttft_ms)
    gate: dict[str, Any] = {
        "margin_ms": MARGIN_MS, "compressor_prior_ms_per_1k": prior_ms_per_1k,
        "engine": {"tokens": tokenizer,
                   "prefill_ms_per_token_learned": _round(learned.ms_per_token, 4),
                   "prefill_slope_ms_per_token": _round(slope.ms_per_token, 4),
                   "prefill_observations": len(uncompressed),
                   **judge(cases, learned.ms_per_token, prior_ms_per_1k)}}
    count200k = o200k()  # the hosted model's tokenizer: the same prompts, compressed again
    runs = [(label, documents, ratio, await compress(documents, question, ratio, embed,
                                                     count200k))
            for label, documents, question, ratio in prompts]
    for ms_per_token in hosted:
        hosted_cases = [Case(label, ratio, estimate(documents), r.tokens_before,
                             r.tokens_after, r.ms, (r.tokens_before - r.tokens_after)
                             * ms_per_token) for label, documents, ratio, r in runs]
        gate[f"hosted_{ms_per_token:g}"] = {
            "tokens": "o200k_base", "prefill_ms_per_token_set": ms_per_token,
            **judge(hosted_cases, ms_per_token, prior_ms_per_1k)}
    return {"e2e": e2e_summary(rows, names, tokenizer, cached, e2e_s), "gate": gate}


def judge(cases: list[Case], ms_per_token: float | None, prior_ms_per_1k: float
          ) -> dict[str, Any]:
    """The gate's decision on each case in turn (the compressor's rate learning from the
    runs it lets through, as the stage's does), against what compressing did."""
    compressor = CompressorRate(prior_ms_per_1k)
    rows = []
    for c in cases:
        d = decide(c.estimated, c.ratio, ms_per_token, compressor.ms_per_1k,
                   margin_ms=MARGIN_MS)
        if d.compress:
            compressor.observe(c.estimated, c.compressor_ms)
        pays = c.saved_ms > c.compressor_ms
        rows.append({"prompt": c.label, "ratio": c.ratio, "tokens_estimated": c.estimated,
                     "tokens_before": c.tokens_before, "tokens_after": c.tokens_after,
                     "decision": "compress" if d.compress else f"skip: {d.skip}",
                     "predicted_saved_ms": _round(d.saved_ms, 1),
                     "predicted_compressor_ms": round(d.cost_ms, 1),
                     "compressor_ms": round(c.compressor_ms, 1),
                     "saved_ms": round(c.saved_ms, 1), "pays": pays,
                     "right": d.compress == pays})
    done = [r for r in rows if r["decision"] == "compress"]
    return {"prompts": len(rows), "compressed": len(done), "skipped": len(rows) - len(done),
            "paid": sum(r["pays"] for r in rows),
            "compressed_at_a_loss": sum(not r["pays"] for r in done),
            "skipped_a_gain": sum(r["pays"] and r["decision"] != "compress" for r in rows),
            "wrong": sum(not r["right"] for r in rows), "rows": rows}


def e2e_summary(rows: list[dict[str, Any]], names: list[str], tokenizer: str, cached: int,
                seconds: float) -> dict[str, Any]:
    off = [r for r in rows if r["variant"] == "off"]
    out: dict[str, Any] = {
        "reader": f"SmolLM2-135M-Instruct (local_engine, CPU), greedy, max_tokens {MAX_TOKENS}",
        "tokens": tokenizer, "items": len(off), "positions": list(POSITIONS),
        "max_cached_tokens": cached, "seconds": round(seconds, 1)}
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        ttft = [r["answer"].ttft_ms for r in mine]
        row: dict[str, Any] = {
            "accuracy": rate([r["correct"] for r in mine]),
            "by_position": {str(p): rate([r["correct"] for r in mine if r["position"] == p])
                            for p in POSITIONS},
            "answer_in_prompt": rate([r["in_prompt"] for r in mine]),
            "prompt_tokens_mean": round(statistics.fmean(r["answer"].prompt_tokens
                                                         for r in mine)) if mine else 0,
            "ttft_ms_p50": round(statistics.median(ttft)) if ttft else None,
            "ttft_ms_mean": round(statistics.fmean(ttft)) if ttft else None}
        if name != "off" and mine:
            row |= {"achieved_ratio_mean": round(statistics.fmean(
                        o["tokens"] / r["tokens"] for o, r in zip(off, mine)), 3),
                    "compressor_ms_mean": round(statistics.fmean(r["ms"] for r in mine), 1),
                    "ttft_saved_ms_mean": round(statistics.fmean(
                        o["answer"].ttft_ms - r["answer"].ttft_ms for o, r in zip(off, mine))),
                    "correct_only_uncompressed": sum(o["correct"] and not r["correct"]
                                                     for o, r in zip(off, mine)),
                    "correct_only_compressed": sum(r["correct"] and not o["correct"]
                                                   for o, r in zip(off, mine))}
        out[name] = row
    out["outputs"] = [{"position": o["position"], "question": o["question"], "gold": o["gold"],
                       **{r["variant"]: r["answer"].text for r in rows
                          if r["question"] == o["question"]}} for o in off]
    return out


def checks(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's gate target: no prompt compressed where the compressor took longer than
    the prefill it saved, over every upstream judged."""
    loss = sum(v["compressed_at_a_loss"] for v in doc["gate"].values() if isinstance(v, dict))
    return {"gate_never_compresses_at_a_loss": {"value": loss, "max": 0, "holds": loss == 0}}


def summary_parts(doc: dict[str, Any]) -> list[str]:
    e2e, gate = doc["e2e"], doc["gate"]
    parts = []
    if e2e["items"]:
        acc = ", ".join(f"{n} {e2e[n]['accuracy']:.1%}" for n in ("off", "2x", "4x"))
        ttft = ", ".join(f"{n} {e2e[n]['ttft_ms_p50']}" for n in ("off", "2x", "4x"))
        parts.append(f"e2e SmolLM2-135M reader ({e2e['items']} NQ items, gold at "
                     f"{'/'.join(map(str, POSITIONS))}): accuracy {acc}; TTFT p50 ms {ttft}")
    judged = []
    for name, v in gate.items():
        if not isinstance(v, dict):
            continue
        speed = (f"learned {v['prefill_ms_per_token_learned']} ms/token" if name == "engine"
                 else f"set {v['prefill_ms_per_token_set']} ms/token")
        judged.append(f"{name} ({speed}) compressed {v['compressed']}/{v['prompts']} "
                      f"(paid {v['paid']}), at a loss {v['compressed_at_a_loss']}, "
                      f"skipped a gain {v['skipped_a_gain']}")
    loss = checks(doc)["gate_never_compresses_at_a_loss"]
    parts.append(f"gate (compressor prior {gate['compressor_prior_ms_per_1k']} ms/1k, margin "
                 f"{gate['margin_ms']:g} ms): " + "; ".join(judged)
                 + f"; never compresses at a loss: {'yes' if loss['holds'] else 'NO'}")
    return parts
