"""Part 8 of bench/engine.py (``--quant``, run alone): quantized weights and KV cache against
the unquantized default, side by side in one run on this machine.

Modes (``--quant-modes``; default: those the device runs): ``default`` (weights and KV in
the compute dtype), ``int8`` (INT8 weight-only, a CPU), ``fp8`` (FP8 weights, CUDA 8.9+),
``kv-int8``, ``kv-fp8`` (the KV cache quantized), and ``int8+kv-int8``, ``fp8+kv-fp8``.
Every engine is loaded once, in the compute dtype ``--dtype`` picks, speculation off (the
figures are the model's own cost). For each mode:

- speed, modes alternating round by round (``--quant-rounds``, medians) so that drift in
  the machine's speed hits all alike: decode tokens/s at batch 1 (MT-Bench turn-1 prompts
  one at a time, ``--quant-max-tokens`` tokens each, EOS ignored) and at batch 32 (32
  prompts at once), both as the tokens after the first over the time after the first
  (every sequence's first token); prefill tokens/s of a 2,048-token prompt (held-out text, a fresh window
  each time so that no prefix is cached, one token out);
- memory: weight bytes (parameters and buffers, a tied matrix once), KV bytes per token,
  and seats: sequences of ``max_model_len`` (2,048) tokens the default ``kv_cache_mb``
  (1,024 MiB) holds, from the bytes a block really takes (what the engine allocates);
- quality: perplexity on a fixed held-out text (GPT-4's MT-Bench answers as
  ../shared/data/routing/mt_bench_judgements.jsonl quotes them, ``--quant-ppl-texts``
  texts of up to 1,024 tokens, scored by the engine's own scorer in the mode's KV cache);
  greedy agreement with the default on the 80 MT-Bench prompts (turn 1, 64 tokens, EOS
  ignored): the mean share of the 64 tokens before the first difference, and the share of
  prompts identical throughout; and structured output: 32 Vicuna prompts asked for a JSON
  array of people under that JSON Schema (bounded as the server bounds it, up to 256
  tokens), the share of complete answers that validate.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import orjson
import torch

from local_engine.engine import Engine, EngineConfig
from local_engine.grammar import GrammarCompiler
from local_engine.loader import LoadedModel, load
from local_engine.model_runner import ModelRunner
from local_engine.quantize import weight_bytes
from local_engine.scorer import ScoreBatch
from local_engine.sequence import SamplingParams
from local_engine.structured import compile_structured, parse_structured

__all__ = ["MODES", "add_arguments", "quant", "quant_summary"]

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
MODES = {"default": ("none", "auto"), "int8": ("int8", "auto"), "fp8": ("fp8", "auto"),
         "kv-int8": ("none", "int8"), "kv-fp8": ("none", "fp8"),
         "int8+kv-int8": ("int8", "int8"), "fp8+kv-fp8": ("fp8", "fp8")}
CPU_MODES = "default,int8,kv-int8,kv-fp8,int8+kv-int8"
CUDA_MODES = "default,fp8,kv-fp8,fp8+kv-fp8"
PEOPLE = {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                     "age": {"type": "integer"}},
    "required": ["name", "city", "age"], "additionalProperties": False}}
SEAT_TOKENS, DEFAULT_KV_MB, AGREE_TOKENS = 2048, 1024, 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quant", action="store_true",
                        help="run part 8 alone (quantized weights and KV cache)")
    parser.add_argument("--quant-modes", help=f"default: {CPU_MODES} (CUDA: {CUDA_MODES})")
    parser.add_argument("--quant-rounds", type=int, default=3)
    parser.add_argument("--quant-max-tokens", type=int, default=64)
    parser.add_argument("--quant-ppl-texts", type=int, default=16)
    parser.add_argument("--quant-agree-prompts", type=int, default=80)


def _chat(tok: Any, text: str) -> list[int]:
    out = tok.apply_chat_template([{"role": "user", "content": text}],
                                  add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _held_out(tok: Any, n: int) -> list[list[int]]:
    texts, seen = [], set()
    for line in (DATA / "routing" / "mt_bench_judgements.jsonl").read_text().splitlines():
        row = orjson.loads(line)
        if row["question_id"] not in seen:
            seen.add(row["question_id"])
            texts.append(row["user_prompt"])
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:n]]


def _generate(engine: Engine, prompts: list[list[int]], params: SamplingParams
              ) -> tuple[list[Any], float, float]:
    """Run ``prompts`` at once; (sequences, seconds to the first token, seconds after)."""
    seqs = [engine.add(p, params) for p in prompts]
    t0 = time.perf_counter()
    first = None
    while engine.has_work():
        engine.step()
        if first is None and all(s.output_ids for s in seqs):
            first = time.perf_counter()
    end = time.perf_counter()
    return seqs, (first or end) - t0, end - (first or end)


def _perplexity(loaded: LoadedModel, texts: list[list[int]], kv: str) -> float:
    batch = ScoreBatch(loaded.model, [t[:1024] for t in texts], kv_cache_dtype=kv)
    while not batch.advance():
        pass
    logprobs = np.concatenate([lp[1:] for lp in batch.logprobs])
    return round(math.exp(-float(logprobs.mean())), 4)


def _structured(engine: Engine, loaded: LoadedModel, questions: list[str]) -> dict[str, Any]:
    compiler = GrammarCompiler.from_hf(loaded.tokenizer, loaded.eos_token_ids)
    body = {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "people", "schema": PEOPLE}}}
    grammar = compile_structured(compiler, parse_structured(body))
    prompts = [_chat(loaded.tokenizer, q + "\nList the people involved as a JSON array.")
               for q in questions[:32]]
    seqs, _, _ = _generate(engine, prompts, SamplingParams(temperature=0, max_tokens=256,
                                                           grammar=grammar))
    complete = [s for s in seqs if s.finish_reason == "stop"]
    valid = 0
    for s in complete:
        try:
            jsonschema.validate(orjson.loads(s.text), PEOPLE)
            valid += 1
        except (orjson.JSONDecodeError, jsonschema.ValidationError):
            pass
    return {"prompts": len(seqs), "complete": len(complete), "valid": valid,
            "valid_share": round(valid / len(complete), 3) if complete else None}


def _agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict[str, float]:
    shares, same = [], 0
    for out, ref in zip(outputs, reference, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(out, ref, strict=True)) if a != b), len(ref))
        shares.append(n / len(ref))
        same += n == len(ref)
    return {"prefix_share": round(statistics.mean(shares), 3),
            "identical_share": round(same / len(reference), 3)}


def quant(args: argparse.Namespace) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    names = (args.quant_modes or (CUDA_MODES if cuda else CPU_MODES)).split(",")
    loaded: dict[str, LoadedModel] = {}
    engines: dict[str, Engine] = {}
    for name in names:
        weights, kv = MODES[name]
        loaded[name] = load(dtype=args.dtype, quantization=weights)
        tok = loaded[name].tokenizer
        engines[name] = Engine(loaded[name].model, lambda ids, t=tok: t.decode(ids),
                               EngineConfig(max_num_seqs=32, max_batch_tokens=512,
                                            kv_cache_mb=256, kv_cache_dtype=kv,
                                            max_model_len=2 * SEAT_TOKENS),
                               loaded[name].eos_token_ids)
    tok = loaded[names[0]].tokenizer
    param = next(loaded[names[0]].model.parameters())
    mt = [orjson.loads(line)["turns"][0] for line in
          (DATA / "prompts" / "mt_bench_questions.jsonl").read_text().splitlines()]
    vicuna = [orjson.loads(line)["turns"][0] for line in
              (DATA / "prompts" / "vicuna_bench_questions.jsonl").read_text().splitlines()]
    prompts = [_chat(tok, q) for q in mt]
    texts = _held_out(tok, args.quant_ppl_texts)
    long_text = [t for text in _held_out(tok, 80) for t in text]
    greedy = SamplingParams(temperature=0, max_tokens=args.quant_max_tokens, ignore_eos=True)
    runs: dict[str, dict[str, list[float]]] = {n: {"b1": [], "b32": [], "prefill": []}
                                               for n in names}
    for name in names:  # warm-up
        _generate(engines[name], prompts[:2], SamplingParams(temperature=0, max_tokens=4))
    window = 0
    for r in range(args.quant_rounds):
        for name in names:
            e, out = engines[name], runs[name]
            tokens = time_after = 0.0
            for p in prompts[2 * r:2 * r + 2]:
                seqs, _, after = _generate(e, [p], greedy)
                tokens += len(seqs[0].output_ids) - 1
                time_after += after
            out["b1"].append(tokens / time_after)
            batch = prompts[32 * r % 48:32 * r % 48 + 32]
            seqs, _, after = _generate(e, batch, greedy)
            out["b32"].append(sum(len(s.output_ids) - 1 for s in seqs) / after)
            window += 1
            start = window * 97 % max(1, len(long_text) - SEAT_TOKENS)
            seqs, first, _ = _generate(e, [long_text[start:start + SEAT_TOKENS]],
                                       SamplingParams(temperature=0, max_tokens=1))
            out["prefill"].append(SEAT_TOKENS / first)
    result: dict[str, Any] = {"device": str(param.device),
                              "dtype": str(param.dtype).removeprefix("torch."),
                              "torch_threads": torch.get_num_threads(),
                              "rounds": args.quant_rounds, "modes": {}}
    reference: list[list[int]] | None = None
    agree = SamplingParams(temperature=0, max_tokens=AGREE_TOKENS, ignore_eos=True)
    for name in names:
        e, m = engines[name], loaded[name]
        per_token = ModelRunner.kv_bytes_per_block(m.model, 1, param.dtype, MODES[name][1])
        blocks = DEFAULT_KV_MB * 2**20 // (per_token * e.config.block_size)
        outputs = [s.output_ids for s in
                   _generate(e, prompts[:args.quant_agree_prompts], agree)[0]]
        reference = reference or outputs
        result["modes"][name] = {
            "quantization": MODES[name][0], "kv_cache_dtype": MODES[name][1],
            **{f"{k}_tok_s": round(statistics.median(v), 1) for k, v in runs[name].items()},
            "weight_bytes": weight_bytes(m.model), "kv_bytes_per_token": per_token,
            "seats": blocks * e.config.block_size // SEAT_TOKENS,
            "perplexity": _perplexity(m, texts, MODES[name][1]),
            "greedy_agreement": _agreement(outputs, reference),
            "structured": _structured(e, m, vicuna),
            "runs": {k: [round(x, 1) for x in v] for k, v in runs[name].items()}}
    base = result["modes"][names[0]]
    for fig in result["modes"].values():
        fig["vs_default"] = {
            "b1": round(fig["b1_tok_s"] / base["b1_tok_s"], 3),
            "b32": round(fig["b32_tok_s"] / base["b32_tok_s"], 3),
            "prefill": round(fig["prefill_tok_s"] / base["prefill_tok_s"], 3),
            "weight_bytes": round(fig["weight_bytes"] / base["weight_bytes"], 3),
            "seats": round(fig["seats"] / base["seats"], 3),
            "perplexity": round(fig["perplexity"] / base["perplexity"] - 1, 4)}
    return result


def quant_summary(res: dict[str, Any]) -> str:
    parts = []
    for name, f in res["modes"].items():
        v, s = f["vs_default"], f["structured"]
        parts.append(
            f"{name}: decode b1 {f['b1_tok_s']} ({v['b1']}x), b32 {f['b32_tok_s']} "
            f"({v['b32']}x), prefill 2k {f['prefill_tok_s']} ({v['prefill']}x) tok/s; "
            f"weights {f['weight_bytes'] / 2**20:.0f} MiB ({v['weight_bytes']}x); "
            f"KV {f['kv_bytes_per_token']} B/token, {f['seats']} seats ({v['seats']}x); "
            f"ppl {f['perplexity']} ({v['perplexity']:+.2%}); greedy agreement "
            f"{f['greedy_agreement']['prefix_share']}; structured {s['valid']}/{s['complete']}"
            " valid")
    return f"quantization ({res['device']}, {res['dtype']}): " + " | ".join(parts)
