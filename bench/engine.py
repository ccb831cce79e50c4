"""Local engine throughput and TTFT vs. transformers ``generate``, and prefix-cache TTFT.

    python bench/engine.py [--prompts 32] [--max-tokens 32] [--concurrency 1,8,32]

Part 1: the same real chat prompts (vicuna_bench_questions.jsonl, chat template applied),
greedy, exactly ``--max-tokens`` output tokens each (EOS ignored on both sides, so both do
the same work), through the engine's async API at each concurrency, and through transformers
``generate`` one request at a time. Reports aggregate output tokens/s, its ratio to the
baseline, and TTFT p50/p99 (ms; for the engine, from submission, queueing included).

Part 2: a ~1,000-token shared system prompt with different user questions, one request at a
time: TTFT when the prefix is in the KV prefix cache (hit) vs. when the system prompt is
made unique per request (miss), interleaved.

Part 3: detokenization, the engine thread's per-token text work: streaming a
``--detok-tokens``-token output token by token with incremental detokenization (what the
engine does) vs. decoding the whole output at every step; ms per output, and the ratio.

Part 5 (``--spec``): n-gram speculative decoding off vs. on, greedy, two engines on the same
model, alternating prompt by prompt (batch 1) or round by round (batch 32): an input-grounded
workload (repeat, quote, extract from a given passage; edit given code; see
``bench/spec_workloads.py``) and MT-Bench turn 1 at batch 1 (decode tokens/s: output tokens
after the first over the time after the first), and MT-Bench at batch 32 (output tokens/s
over the wall time). Also whether the outputs are identical, and the acceptance figures
(drafts, draft tokens, accepted tokens by position, mean tokens per decoding step).
``--lossless-prompts N`` checks identity alone on N MT-Bench prompts at batch 1 and 8 with
prefill chunks of 64 tokens and a KV cache small enough that batch 8 preempts.

Part 6 (``--structured``, run alone): grammar-constrained decoding, free vs. constrained
tokens/s at batch 1 and 32 and the τ-bench tools' grammar compile times
(``bench/engine_structured.py``).

Part 7 (``--e2e``, run alone): speculation on vs. off end to end, through ``gateway serve``
with two local upstreams (``bench/engine_e2e.py``): whole-request tokens/s at batch 1
(input-grounded and MT-Bench, alternating request by request) and at batch 32, greedy
answers compared.

Part 8 (``--quant``, run alone): quantized weights and KV cache against the unquantized
default, side by side: decode and prefill tokens/s, weight and KV bytes, seats, perplexity,
greedy agreement and structured-output validity (``bench/engine_quant.py``).

Part 4 (``--baseline-rev REV``): the engine of this tree against the engine of git revision
REV (e.g. the commit before the lean decode step), side by side in one run: engine tokens/s
at each ``--concurrency`` and prefix-hit/miss TTFT, each measured in a fresh child process
that imports ``local_engine`` either from this tree or from a ``git archive`` of REV in a
temporary folder, alternating REV, this, REV, this ... for ``--baseline-rounds`` rounds
(so that drift in the machine's speed hits both alike); medians, and this tree's ratio.

Prints one JSON object, then a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import torch

ROOT = Path(__file__).resolve().parent.parent
# A child measuring another revision's engine imports it from ENGINE_BENCH_SOURCE.
sys.path.insert(0, os.environ.get("ENGINE_BENCH_SOURCE") or str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))

import engine_e2e
import engine_quant
from engine_detok import detok_cost

from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, EngineConfig
from local_engine.loader import load, resolve
from local_engine.sequence import SamplingParams

PROMPTS = ROOT.parent / "shared" / "data" / "prompts" / "vicuna_bench_questions.jsonl"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))], 1)


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


async def run_engine(engine: AsyncEngine, prompts: list[list[int]], concurrency: int,
                     max_tokens: int) -> dict[str, Any]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    sem = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    tokens = 0

    async def one(ids: list[int]) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            first = None
            async for out in engine.generate(ids, params):
                if first is None:
                    first = time.perf_counter()
                if out.finished:
                    tokens += len(out.seq.output_ids)
            assert first is not None
            ttfts.append((first - t0) * 1e3)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 2),
            "ttft_p50_ms": pct(ttfts, 50), "ttft_p99_ms": pct(ttfts, 99)}


class _FirstToken:
    """A transformers streamer that notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def run_generate(hf: Any, prompts: list[list[int]], max_tokens: int,
                 device: torch.device) -> dict[str, Any]:
    ttfts: list[float] = []
    tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in prompts:
            streamer = _FirstToken()
            start = time.perf_counter()
            out = hf.generate(torch.tensor([ids], device=device), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False, streamer=streamer,
                              pad_token_id=0)
            tokens += out.shape[1] - len(ids)
            ttfts.append(((streamer.first or time.perf_counter()) - start) * 1e3)
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 2),
            "ttft_p50_ms": pct(ttfts, 50), "ttft_p99_ms": pct(ttfts, 99)}


async def prefix_ttft(engine: AsyncEngine, tokenizer: Any, questions: list[str],
                      rounds: int) -> dict[str, Any]:
    system = " ".join(questions) * 4
    words = system.split()
    # trim to about 1,000 tokens of system prompt
    while len(tokenizer(system)["input_ids"]) > 1000:
        words = words[:int(len(words) * 0.95)]
        system = " ".join(words)
    n_system = len(tokenizer(system)["input_ids"])
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    async def ttft(sys_prompt: str, question: str) -> tuple[float, int]:
        ids = chat_ids(tokenizer, [{"role": "system", "content": sys_prompt},
                                   {"role": "user", "content": question}])
        t0 = time.perf_counter()
        async for out in engine.generate(ids, params):
            return (time.perf_counter() - t0) * 1e3, out.seq.num_cached
        raise RuntimeError("no output")

    await ttft(system, questions[0])  # warm the shared prefix
    hits, misses, cached = [], [], []
    for i in range(rounds):
        q = questions[(i + 1) % len(questions)]
        ms, n = await ttft(f"Session {i} {time.time_ns()}. " + system, q)
        misses.append(ms)
        ms, n = await ttft(system, q)
        hits.append(ms)
        cached.append(n)
    hit, miss = statistics.median(hits), statistics.median(misses)
    return {"system_prompt_tokens": n_system, "rounds": rounds,
            "hit_ttft_p50_ms": round(hit, 1), "miss_ttft_p50_ms": round(miss, 1),
            "hit_over_miss": round(hit / miss, 3), "cached_tokens_p50": statistics.median(cached)}


def load_model(args: argparse.Namespace) -> Any:
    """The model in ``--dtype`` (a revision older than the dtype option loads its own way:
    fp32 on a CPU, bf16 on CUDA)."""
    if "dtype" in inspect.signature(load).parameters:
        return load(dtype=args.dtype)
    return load()


def dtype_of(loaded: Any) -> str:
    return str(next(loaded.model.parameters()).dtype).removeprefix("torch.")


async def engine_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Child mode of part 4: tokens/s at each concurrency and prefix TTFT of whichever
    ``local_engine`` this process imports."""
    loaded = load_model(args)
    tok = loaded.tokenizer
    questions = [orjson.loads(line)["turns"][0] for line in PROMPTS.read_text().splitlines()]
    prompts = [chat_ids(tok, [{"role": "user", "content": q}])
               for q in questions[:args.prompts]]
    engine = AsyncEngine(Engine(loaded.model, lambda ids: tok.decode(ids), EngineConfig(
        max_num_seqs=32, max_batch_tokens=512, kv_cache_mb=256), loaded.eos_token_ids)).start()
    await run_engine(engine, prompts[:2], 2, 4)  # warm-up
    out: dict[str, Any] = {}
    for c in (int(x) for x in args.concurrency.split(",")):
        out[f"c{c}_tok_s"] = (await run_engine(engine, prompts, c, args.max_tokens))["tok_s"]
    pc = await prefix_ttft(engine, tok, questions, args.prefix_rounds)
    out["prefix_hit_ttft_ms"], out["prefix_miss_ttft_ms"] = (pc["hit_ttft_p50_ms"],
                                                             pc["miss_ttft_p50_ms"])
    out["dtype"] = dtype_of(loaded)
    engine.close()
    return out


def against_revision(args: argparse.Namespace) -> dict[str, Any]:
    """Part 4: children alternating between REV's engine and this tree's; medians."""
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    child = [sys.executable, __file__, "--engine-figures", "--prompts", str(args.prompts),
             "--max-tokens", str(args.max_tokens), "--concurrency", args.concurrency,
             "--prefix-rounds", str(args.prefix_rounds), "--dtype", args.dtype]
    with tempfile.TemporaryDirectory(prefix="engine-rev-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline_rev,
                                  "local_engine", "llm_wire"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for _ in range(args.baseline_rounds):
            for name, source in (("baseline", tmp), ("this", str(ROOT))):
                env = {**os.environ, "ENGINE_BENCH_SOURCE": source, "PYTHONPATH": source}
                done = subprocess.run(child, env=env, check=True, capture_output=True,
                                      text=True)
                runs[name].append(orjson.loads(done.stdout.strip().splitlines()[-1]))
    result: dict[str, Any] = {"baseline_rev": args.baseline_rev,
                              "rounds": args.baseline_rounds,
                              "dtype": {name: r[0]["dtype"] for name, r in runs.items()}}
    for r in runs["baseline"] + runs["this"]:
        del r["dtype"]
    for key in runs["this"][0]:
        base = statistics.median(r[key] for r in runs["baseline"])
        this = statistics.median(r[key] for r in runs["this"])
        result[key] = {"baseline": base, "this": this, "ratio": round(this / base, 3),
                       "runs_baseline": [r[key] for r in runs["baseline"]],
                       "runs_this": [r[key] for r in runs["this"]]}
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,8,32")
    # Spelled out, not loader.DTYPES: part 4's children import an older local_engine.
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="the engine's compute dtype (local_engine.loader.engine_dtype)")
    parser.add_argument("--prefix-rounds", type=int, default=5)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--detok-tokens", type=int, default=2000)
    parser.add_argument("--baseline-rev", help="also compare with this git revision's engine")
    parser.add_argument("--baseline-rounds", type=int, default=3)
    parser.add_argument("--only-baseline-rev", action="store_true",
                        help="run part 4 alone")
    parser.add_argument("--engine-figures", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", action="store_true", help="run part 5 (speculation)")
    parser.add_argument("--only-spec", action="store_true", help="run part 5 alone")
    parser.add_argument("--spec-config", default='{"method": "ngram"}',
                        help="SpecConfig as JSON (engine defaults otherwise)")
    parser.add_argument("--spec-prompts", type=int, default=16)
    parser.add_argument("--spec-max-tokens", type=int, default=128)
    parser.add_argument("--spec-split", choices=("dev", "test"), default="test")
    parser.add_argument("--spec-rounds", type=int, default=2,
                        help="rounds of the batch-32 workload, off and on alternating")
    parser.add_argument("--lossless-prompts", type=int, default=0)
    parser.add_argument("--structured", action="store_true",
                        help="run part 6 alone (grammar-constrained decoding)")
    parser.add_argument("--structured-max-tokens", type=int, default=64)
    parser.add_argument("--structured-rounds", type=int, default=2)
    parser.add_argument("--structured-compile-rounds", type=int, default=5)
    engine_e2e.add_arguments(parser)
    engine_quant.add_arguments(parser)
    args = parser.parse_args()
    if args.quant:
        res = engine_quant.quant(args)
        print(orjson.dumps({"quant": res}, option=orjson.OPT_INDENT_2).decode())
        print("summary: " + engine_quant.quant_summary(res))
        return
    if args.e2e:
        res = await engine_e2e.e2e(args)
        print(orjson.dumps({"e2e": res}, option=orjson.OPT_INDENT_2).decode())
        print("summary: " + engine_e2e.e2e_summary(res))
        return
    if args.engine_figures:
        print(orjson.dumps(await engine_figures(args)).decode())
        return
    if args.only_spec:
        from engine_spec import spec_summary, speculation

        model = load_model(args)
        sp = speculation(model, args)
        print(orjson.dumps({"dtype": dtype_of(model), "speculation": sp},
                           option=orjson.OPT_INDENT_2).decode())
        print(f"summary: {dtype_of(model)}; " + spec_summary(sp))
        return
    if args.structured:
        from engine_structured import structured, structured_summary

        model = load_model(args)
        st = await structured(model, args)
        print(orjson.dumps({"dtype": dtype_of(model), "torch_threads": torch.get_num_threads(),
                            "structured": st}, option=orjson.OPT_INDENT_2).decode())
        print(f"summary: {dtype_of(model)}; " + structured_summary(st))
        return
    if args.only_baseline_rev:
        rev = against_revision(args)
        print(orjson.dumps({"against_revision": rev}, option=orjson.OPT_INDENT_2).decode())
        print(f"summary: this tree ({rev['dtype']['this']}) vs {args.baseline_rev} "
              f"({rev['dtype']['baseline']}): " + "; ".join(
            f"{k} {v['this']} vs {v['baseline']} = {v['ratio']}x" for k, v in rev.items()
            if isinstance(v, dict) and "ratio" in v))
        return
    from transformers import AutoModelForCausalLM

    loaded = load_model(args)
    tok = loaded.tokenizer
    device = next(loaded.model.parameters()).device
    questions = [orjson.loads(line)["turns"][0] for line in PROMPTS.read_text().splitlines()]
    prompts = [chat_ids(tok, [{"role": "user", "content": q}])
               for q in questions[:args.prompts]]
    engine = AsyncEngine(Engine(loaded.model, lambda ids: tok.decode(ids), EngineConfig(
        max_num_seqs=32, max_batch_tokens=512, kv_cache_mb=256), loaded.eos_token_ids)).start()
    result: dict[str, Any] = {"device": str(device), "dtype": dtype_of(loaded),
                              "torch_threads": torch.get_num_threads(),
                              "prompts": len(prompts), "max_tokens": args.max_tokens,
                              "prompt_tokens_mean": round(statistics.mean(map(len, prompts)), 1)}
    await run_engine(engine, prompts[:2], 2, 4)  # warm-up
    if not args.skip_baseline:
        hf = AutoModelForCausalLM.from_pretrained(resolve(), dtype=next(
            loaded.model.parameters()).dtype).to(device).eval()
        run_generate(hf, prompts[:1], 4, device)  # warm-up
        result["generate_sequential"] = run_generate(hf, prompts, args.max_tokens, device)
        del hf
    for c in (int(x) for x in args.concurrency.split(",")):
        r = await run_engine(engine, prompts, c, args.max_tokens)
        if "generate_sequential" in result:
            r["ratio_vs_generate"] = round(r["tok_s"] / result["generate_sequential"]["tok_s"],
                                           2)
        result[f"engine_c{c}"] = r
    result["prefix_cache"] = await prefix_ttft(engine, tok, questions, args.prefix_rounds)
    engine.close()
    result["detokenize"] = detok_cost(tok, questions, args.detok_tokens)
    if args.spec:
        from engine_spec import spec_summary, speculation

        result["speculation"] = speculation(loaded, args)
    if args.baseline_rev:
        del loaded, engine
        result["against_revision"] = against_revision(args)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    parts = [f"engine c{c}: {result[f'engine_c{c}']['tok_s']} tok/s"
             + (f" ({result[f'engine_c{c}']['ratio_vs_generate']}x generate)"
                if "generate_sequential" in result else "")
             for c in (int(x) for x in args.concurrency.split(","))]
    pc = result["prefix_cache"]
    base = result.get("generate_sequential", {}).get("tok_s")
    print(f"summary: {result['dtype']}; generate {base} tok/s; " + "; ".join(parts)
          + f"; prefix hit/miss TTFT {pc['hit_ttft_p50_ms']}/{pc['miss_ttft_p50_ms']} ms "
          f"= {pc['hit_over_miss']}x; detokenizing {result['detokenize']['output_tokens']} "
          f"tokens {result['detokenize']['incremental_ms']} ms vs "
          f"{result['detokenize']['whole_decode_each_step_ms']} ms decoding the whole output "
          f"each step ({result['detokenize']['speedup']}x)"
          + (f"; {spec_summary(result['speculation'])}" if args.spec else "")
          + (f"; vs {args.baseline_rev}: " + ", ".join(
              f"{k} {v['ratio']}x" for k, v in result["against_revision"].items()
              if isinstance(v, dict) and "ratio" in v) if args.baseline_rev else ""))


if __name__ == "__main__":
    asyncio.run(main())
