"""What the prompt_cache stage itself costs per request: from the gateways' request logs,
``overhead_ms`` (total minus upstream time) of the same requests with the stage and without
it, on prompts of a given size (tokens, as the upstream counted them)."""

from __future__ import annotations

from typing import Any

__all__ = ["overhead_by_cell", "pct"]


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
