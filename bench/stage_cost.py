"""What the prompt_cache stage itself costs per request, two ways:

- :func:`overhead_by_cell`: from the gateways' request logs, ``overhead_ms`` (total minus
  upstream time) of the same requests with the stage and without it, on prompts of a given
  size (tokens, as the upstream counted them): the whole gateway, noise included;
- :func:`shape_timing`: the stage's own work, timed in-process on the same bodies.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

__all__ = ["overhead_by_cell", "pct", "shape_timing"]


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def overhead_by_cell(by_cell: dict[str, list[dict[str, Any]]], low: int, high: int
                     ) -> dict[str, Any]:
    """Per "api/variant": overhead_ms p50/p99 (ms) of the ``none`` and ``stage`` cells'
    requests whose ``prompt_tokens`` is within [low, high] in the ``none`` cell, and what
    the stage adds."""
    out: dict[str, Any] = {}
    for cell, records in by_cell.items():
        api_variant, _, setup = cell.rpartition("/")
        if setup != "none" or f"{api_variant}/stage" not in by_cell:
            continue
        sized = {r["request_id"].rsplit("/", 1)[1] for r in records
                 if low <= (r.get("prompt_tokens") or 0) <= high}
        samples = {}
        for name in ("none", "stage"):
            samples[name] = [r["overhead_ms"] for r in by_cell[f"{api_variant}/{name}"]
                             if r["request_id"].rsplit("/", 1)[1] in sized
                             and r.get("overhead_ms") is not None]
        if not samples["none"] or not samples["stage"]:
            continue
        row: dict[str, Any] = {"requests": len(samples["stage"]), "prompt_tokens": [low, high]}
        for name, values in samples.items():
            row[f"{name}_p50_ms"] = round(pct(values, 50), 3)
            row[f"{name}_p99_ms"] = round(pct(values, 99), 3)
        row["added_p50_ms"] = round(row["stage_p50_ms"] - row["none_p50_ms"], 3)
        row["added_p99_ms"] = round(row["stage_p99_ms"] - row["none_p99_ms"], 3)
        out[api_variant] = row
    return out


def shape_timing(bodies: dict[str, list[dict[str, Any]]], sized: list[bool],
                 rounds: int = 3) -> dict[str, Any] | None:
    """The stage's own work per request, in-process: reading the client's body, shaping it
    for the upstream and remembering what it asked to cache (``Shaping``, then its call,
    then ``commit``), under the default policy, for each API's ``bodies`` in order (the
    client's and the upstream's API alike), ``rounds`` times over with one memory. p50/p99
    (ms) over the requests that ``sized`` marks. None while the stage does not exist."""
    try:
        from gateway.policy import PromptCachePolicy
        from gateway.prompt_cache.cache_keys import CacheKeys
        from gateway.prompt_cache.memory import PromptMemory
        from gateway.prompt_cache.shape import Shaping
        from gateway.requestlog import RequestRecord
        from gateway.stages.prompt_cache import settings
    except ImportError:
        return None
    config = settings(PromptCachePolicy())
    keys = CacheKeys(b"bench-secret" * 3)
    out: dict[str, Any] = {}
    for api, items in bodies.items():
        memory = PromptMemory()
        copies = [orjson.dumps(body) for body in items]
        samples: list[float] = []
        for _ in range(rounds):
            for raw, keep in zip(copies, sized, strict=True):
                client, upstream = orjson.loads(raw), orjson.loads(raw)
                record = RequestRecord("bench", "/v1/chat/completions")
                started = time.perf_counter()
                shaping = Shaping(config, memory, keys, record, None, client["model"], client,
                                  api)
                shaping(upstream, api)
                shaping.commit()
                if keep:
                    samples.append((time.perf_counter() - started) * 1000)
        if samples:
            out[api] = {"requests": len(samples), "p50_ms": round(pct(samples, 50), 3),
                        "p99_ms": round(pct(samples, 99), 3)}
    return out
