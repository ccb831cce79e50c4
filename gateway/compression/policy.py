"""The policy's ``[compression]`` section: the ``compress`` stage's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from gateway.schema import bounded

__all__ = ["CompressionPolicy"]


@dataclass(frozen=True)
class CompressionPolicy:
    """Question-aware compression of long context (see gateway.stages.compress).

    ``[compression] enabled = true`` turns the stage on (it is in the default pipeline);
    clients may send ``x-gateway-compress: off | <ratio>`` to override ``target_ratio``.
    """

    enabled: bool = False
    #: Tokens before over tokens after, aimed at for the compressible context.
    target_ratio: float = bounded(4.0, ge=1.0, le=100.0)
    #: Compressible context shorter than this (tokens, estimated) is left alone.
    min_tokens: int = bounded(1024, ge=0)
    #: Also compress the system prompt (documents a single-turn request put there). Off by
    #: default: a stable system prompt is the prefix providers' prompt caches read at 0.1x.
    system: bool = False
    #: Kept documents ordered with the most relevant at both ends (lost in the middle).
    reorder: bool = True
    #: The fine pass (gateway.compression.fine): inside the units the coarse pass keeps,
    #: drop the words SmolLM2 finds least informative (LLMLingua), scored by a ``type =
    #: "local"`` upstream's engine; the budget stays ``tokens / ratio``. Off: on the NQ
    #: test items it ties coarse alone at the same token count (answer retention 100% for
    #: both at 2x and 4x; the engine as reader 5/30 against 4/30 at 4x, 5/30 each at 2x)
    #: for 20 times its CPU time (README, ``bench/compression.py --fine``).
    token_level: bool = False
    #: The compressor's cost with the fine pass before it has measured its own (ms per
    #: 1,000 context tokens; 774 measured on a 2-core CPU at 4x, scoring 94% of it).
    token_level_ms_per_1k_tokens: float = bounded(800.0, ge=0.0)
    #: ``net_positive``: compress only when the predicted prefill time saved (and the
    #: tokens' worth, ``cost_weight``) beats the compressor's predicted time + ``margin_ms``
    #: (gateway.compression.gate); ``always``: whenever there is enough to compress.
    gate: Literal["net_positive", "always"] = "net_positive"
    #: Public model name -> its prefill time per prompt token (ms); models not listed use
    #: the rate learned from their streamed answers (TTFT against prompt tokens).
    prefill_ms_per_token: dict[str, float] = field(default_factory=dict)
    #: The compressor's cost before it has measured its own (ms per 1,000 tokens).
    compressor_ms_per_1k_tokens: float = bounded(60.0, ge=0.0)
    margin_ms: float = bounded(5.0, ge=0.0)
    #: Milliseconds of latency worth trading for 1,000 input tokens not billed (0: the gate
    #: weighs latency only).
    cost_weight: float = bounded(0.0, ge=0.0)
    #: The degraded-mode ``compress`` action's ratio, used before a request is shed.
    degraded_ratio: float = bounded(8.0, ge=1.0, le=100.0)

    def __post_init__(self) -> None:
        for model, rate in self.prefill_ms_per_token.items():
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"prefill_ms_per_token.{model}: must be a number >= 0, "
                                 f"got {rate!r}")
