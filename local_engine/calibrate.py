"""The engine's latency-bounded batch: how many sequences it can decode at once before each
step gets too slow, measured on this machine at start-up.

``max_num_seqs`` bounds what the engine *can* batch (seats, KV slots); on a GPU a decode
step costs about the same at 1 or 128 sequences, so every seat is worth filling. On a CPU a
step's matmuls grow with the batch: SmolLM2-135M in fp32 on this 2-core CPU takes 57 ms per
decode step alone, 98 ms at 16 and 160 ms at 32, and a flood of 96 clients admitted 32 at a
time finished at 5.5x the unloaded latency (p99; 3.6x at 16, bench/flood.py), since each
arrival's prefill also lands in the running batch. The gateway admits at most the batch this
module finds (the local upstream reads it from /healthz): the largest batch whose decode step
is at most ``max_slowdown`` times a lone sequence's. The gateway's default, 1.3, gives 5 to 13
here in fp32 (start-up noise; the flood's admitted answers within 2.6-3.9x of unloaded; 1.5
gives 9 to 17, within 3.6-4.4x, with more goodput), 7 to 11 in bf16 (within 2.7-3.3x).

It also measures the prefill rate (ms per prompt token, a lone 128-token prompt) and gives,
with the decode step at the batch found, the rates the gateway predicts a request's service
time from (``Calibration.rates``; /healthz reports them, gateway.service_time uses them).

The probe runs synthetic sequences (distinct random tokens, so no prefix-cache hit and no
n-gram draft) through the engine before it serves, a prefill and a few decode steps per
batch size, twice: about 3 s on this CPU, well under 1 s on a GPU. The engine's counters
are reset afterwards.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

from local_engine.engine import Engine, StepStats
from local_engine.sequence import SamplingParams

__all__ = ["Calibration", "latency_bounded_batch"]

PROMPT_TOKENS = 16
PREFILL_TOKENS = 128
DECODE_STEPS = 6
ROUNDS = 2


@dataclass(frozen=True)
class Calibration:
    """``batch``: the latency-bounded batch; ``step_ms``: the decode step (ms) of each batch
    size measured; ``prefill_ms_per_token``: a prompt token's share of a prefill (ms; None
    when not probed)."""

    batch: int
    step_ms: dict[int, float]
    prefill_ms_per_token: float | None = None

    def rates(self) -> dict[str, float] | None:
        """What a request costs on this machine with the batch full: ``prefill_ms_per_token``
        and ``decode_ms_per_token`` (the decode step at ``batch``, linear between the sizes
        measured: each step gives every running sequence one token); None when not probed."""
        if self.prefill_ms_per_token is None or not self.step_ms:
            return None
        sizes = sorted(self.step_ms)
        lo = max((b for b in sizes if b <= self.batch), default=sizes[0])
        hi = min((b for b in sizes if b >= self.batch), default=sizes[-1])
        step = self.step_ms[lo] if hi == lo else self.step_ms[lo] + (
            self.step_ms[hi] - self.step_ms[lo]) * (self.batch - lo) / (hi - lo)
        return {"prefill_ms_per_token": self.prefill_ms_per_token,
                "decode_ms_per_token": round(step, 2)}


def decode_step_ms(engine: Engine, batch: int, rng: random.Random) -> float:
    """Wall time (ms) of a decode step with ``batch`` sequences in it: the fastest of a few,
    since whatever else runs at start-up (the gateway loading its embedder) only adds."""
    vocab = engine.model.cfg.vocab_size
    params = SamplingParams(temperature=0, max_tokens=DECODE_STEPS + 2, ignore_eos=True)
    seqs = [engine.add([rng.randrange(vocab) for _ in range(PROMPT_TOKENS)], params)
            for _ in range(batch)]
    times: list[float] = []
    while engine.has_work():
        decoding = all(s.num_computed >= len(s.prompt_ids) for s in seqs)
        t0 = time.perf_counter()
        engine.step()
        if decoding:
            times.append((time.perf_counter() - t0) * 1000)
    # The first decode step at a new batch size may warm up kernels (or capture a CUDA
    # graph): not counted.
    return min(times[1:] or times)


def prefill_ms_per_token(engine: Engine, rng: random.Random) -> float:
    """Wall time (ms) per token of a lone ``PREFILL_TOKENS``-token prompt's prefill (the
    steps until its first token, chunked by the engine's max_batch_tokens)."""
    vocab = engine.model.cfg.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seq = engine.add([rng.randrange(vocab) for _ in range(PREFILL_TOKENS)], params)
    t0 = time.perf_counter()
    while engine.has_work() and seq.num_computed < len(seq.prompt_ids):
        engine.step()
    ms = (time.perf_counter() - t0) * 1000
    while engine.has_work():
        engine.step()
    return ms / PREFILL_TOKENS


def latency_bounded_batch(engine: Engine, max_slowdown: float) -> Calibration:
    """Probe the engine (which must be idle and not yet serving) at 1, half of and all of
    ``max_num_seqs`` sequences, twice; between those sizes the step time is taken as linear. The
    batch is the largest whose step is at most ``max_slowdown`` x the lone sequence's (at
    least 1). ``max_slowdown`` <= 0 skips the probe and gives ``max_num_seqs``."""
    top = engine.config.max_num_seqs
    if max_slowdown <= 0 or top == 1:
        return Calibration(top, {})
    rng = random.Random(0)
    # Rounds over all sizes, the fastest of each kept: a fresh engine's first steps are
    # slower, and whatever else starts alongside (the gateway) comes and goes.
    step_ms: dict[int, float] = {}
    for _ in range(ROUNDS):
        for b in sorted({1, max(1, top // 2), top}):
            step_ms[b] = min(step_ms.get(b, float("inf")), decode_step_ms(engine, b, rng))
    prefill = min(prefill_ms_per_token(engine, rng) for _ in range(ROUNDS))
    engine.decodes = engine.decode_tokens = 0
    engine.blocks.hits = engine.blocks.lookups = 0
    engine.last = StepStats()
    limit = max_slowdown * step_ms[1]
    batch = 1
    for lo, hi in itertools.pairwise(sorted(step_ms)):
        if step_ms[hi] <= limit:
            batch = hi
            continue
        rise = (step_ms[hi] - step_ms[lo]) / (hi - lo)  # ms per sequence in this stretch
        if rise > 0:
            batch = max(batch, min(hi, lo + int((limit - step_ms[lo]) / rise)))
        break
    return Calibration(batch, {b: round(ms, 2) for b, ms in step_ms.items()},
                       round(prefill, 3))
