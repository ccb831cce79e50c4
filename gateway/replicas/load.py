"""A model server's load (running and waiting sequences) from what it publishes: our
engine's /healthz JSON (``load.running``, ``load.waiting``), else its Prometheus /metrics
as vLLM (``vllm:num_requests_running``/``_waiting``) and SGLang (``sglang:num_running_reqs``,
``sglang:num_queue_reqs``) expose them."""

from __future__ import annotations

from typing import Any

__all__ = ["from_health", "from_metrics"]

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")


def from_health(body: Any) -> int | None:
    """Running plus waiting sequences in our engine's /healthz answer (None: not there)."""
    load = body.get("load") if isinstance(body, dict) else None
    if not isinstance(load, dict):
        return None
    running, waiting = load.get("running"), load.get("waiting")
    if isinstance(running, int) and isinstance(waiting, int):
        return running + waiting
    return None


def from_metrics(text: str) -> int | None:
    """Running plus waiting requests in a Prometheus exposition (summed over the series
    of each, e.g. per model; None when neither family is there)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(RUNNING + WAITING):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in RUNNING or name in WAITING:
                try:
                    total += float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    continue
                seen = True
    return round(total) if seen else None
