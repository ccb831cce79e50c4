"""Part 3 of ``bench/engine.py``: what incremental detokenization saves a stream, against
decoding the whole output again at every step (the engine's ``detokenize``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from local_engine.engine import detokenize
from local_engine.sequence import SamplingParams, Sequence

__all__ = ["detok_cost"]


def detok_cost(tokenizer: Any, questions: list[str], length: int) -> dict[str, Any]:
    """Stream ``length`` tokens of real text token by token, both ways, 5 rounds each,
    interleaved; medians."""
    ids = tokenizer(" ".join(questions * 20), add_special_tokens=False)["input_ids"][:length]

    def decode(x: list[int]) -> str:
        return tokenizer.decode(x, skip_special_tokens=True)

    def incremental() -> str:
        seq = Sequence([], SamplingParams())
        return "".join(detokenize(decode, seq, ids[:n], n == len(ids))
                       for n in range(1, len(ids) + 1))

    def whole() -> str:
        text = ""
        for n in range(1, len(ids) + 1):
            text = decode(ids[:n])
        return text

    assert incremental() == whole()
    times: dict[str, list[float]] = {"incremental": [], "whole": []}
    for _ in range(5):
        for name, fn in (("incremental", incremental), ("whole", whole)):
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    inc, full = statistics.median(times["incremental"]), statistics.median(times["whole"])
    return {"output_tokens": len(ids), "incremental_ms": round(inc, 2),
            "whole_decode_each_step_ms": round(full, 2), "speedup": round(full / inc, 1)}
