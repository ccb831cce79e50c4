"""Next-token choice from logits: greedy, temperature, nucleus (top-p), per-request seeds."""

from __future__ import annotations

import torch

from local_engine.sequence import SamplingParams

__all__ = ["sample"]


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """``logits``: [N, vocab] float32, one row per sequence. Temperature 0 is greedy; top-p
    keeps the smallest set of tokens whose probability reaches ``top_p`` (Holtzman et al.,
    "The Curious Case of Neural Text Degeneration", ICLR 2020)."""
    out: list[int] = []
    greedy = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.temperature <= 0:
            out.append(int(greedy[i]))
            continue
        probs = torch.softmax(logits[i] / p.temperature, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p
            sorted_probs = sorted_probs * keep
            choice = torch.multinomial(sorted_probs, 1, generator=generators[i])
            out.append(int(order[choice]))
        else:
            out.append(int(torch.multinomial(probs, 1, generator=generators[i])))
    return out
