"""Prompt log-probabilities: how surprising each token of a text is to the model.

For a text's tokens ``t_0 .. t_{n-1}``, :class:`ScoreBatch` computes ``log p(t_i | t_<i)``
for ``i >= 1`` (``t_0`` has no prefix: NaN) with the engine's own model, in one causal
forward pass per chunk of at most ``chunk_tokens`` tokens, several texts packed into a
chunk as the engine packs prefill chunks. This is the scoring call behind LLMLingua's
token-level compression (Jiang et al., EMNLP 2023: a token's self-information is
``-log p(t_i | t_<i)``; the least informative go first), served as OpenAI's legacy
completions with ``echo`` and ``max_tokens: 0`` (:mod:`local_engine.server`).

Scoring never touches the engine's paged KV cache nor its scheduler: a batch keeps its keys
and values in a scratch cache of its own (freed with it) and the engine thread runs one of
its chunks between two engine steps (:mod:`local_engine.async_engine`), so running decodes
wait at most one prefill chunk's time per step. Tensors only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from local_engine.kv_cache import KvCache
from local_engine.model import AttentionMeta, LlamaModel, prefill_mask

__all__ = ["ScoreBatch", "encode_text"]


def encode_text(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """A plain text's token ids (no special tokens, no chat template) by a Hugging Face
    fast tokenizer, and the character where each token starts (non-decreasing: a token
    that continues a character split across tokens starts where that character does)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets, last = [], 0
    for start, _ in enc["offset_mapping"]:
        last = max(last, start)
        offsets.append(last)
    return list(enc["input_ids"]), offsets


class ScoreBatch:
    """The texts ``seqs`` (token ids each, non-empty) scored in chunks; :meth:`advance` runs
    one; :attr:`logprobs` [len(seq)] float32 arrays (NaN at index 0) once :attr:`done`.

    The scratch cache holds every text's keys and values ([sum of each text's length
    rounded up to ``block_size``] slots per layer, the model's dtype): the caller bounds the
    total (:class:`~local_engine.async_engine.AsyncEngine` takes ``max_score_tokens``)."""

    def __init__(self, model: LlamaModel, seqs: list[list[int]], chunk_tokens: int = 512,
                 block_size: int = 16, kv_cache_dtype: str = "auto"):
        if not seqs or any(not s for s in seqs):
            raise ValueError("every text to score needs at least one token")
        self.model = model
        self.seqs = seqs
        self.chunk_tokens = max(1, chunk_tokens)
        self.block_size = block_size
        cfg = model.cfg
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        param = next(model.parameters())
        self.device = param.device
        self.first_block: list[int] = []
        blocks = 0
        for ids in seqs:
            self.first_block.append(blocks)
            blocks += -(-len(ids) // block_size)
        self.caches = [KvCache(blocks * block_size, cfg.num_key_value_heads, cfg.head_dim,
                               param.dtype, self.device, kv_cache_dtype)
                       for _ in range(cfg.num_hidden_layers)]
        self.logprobs = [np.full(len(ids), np.nan, np.float32) for ids in seqs]
        self._next = [0] * len(seqs)  # per text: tokens computed so far
        self._current = 0  # the first text not finished

    @property
    def done(self) -> bool:
        return self._current >= len(self.seqs)

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.seqs)

    @torch.inference_mode()
    def advance(self) -> bool:
        """Compute the next chunk (texts in order, the last one cut where the chunk is
        full); returns :attr:`done`."""
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        targets: list[int] = []  # per row: the next token of its text, -1 after the last
        owners: list[tuple[int, int, int, int]] = []  # (text, first position, row, rows)
        meta = AttentionMeta(slots=torch.empty(0), block_size=bs)
        i = self._current
        while i < len(self.seqs) and len(ids) < self.chunk_tokens:
            seq, start = self.seqs[i], self._next[i]
            end = min(len(seq), start + self.chunk_tokens - len(ids))
            row, base = len(ids), self.first_block[i]
            ids.extend(seq[start:end])
            positions.extend(range(start, end))
            slots.extend(range(base * bs + start, base * bs + end))
            targets.extend(seq[start + 1:end + 1])
            if end == len(seq):
                targets.append(-1)
            width = -(-end // bs)
            blocks = torch.arange(base, base + width, device=dev)
            mask = prefill_mask(start, end, width * bs, self.group, dev)
            meta.prefills.append((row, end - start, blocks, mask))
            owners.append((i, start, row, end - start))
            self._next[i] = end
            if end == len(seq):
                i += 1
        self._current = i
        meta.slots = torch.tensor(slots, device=dev)
        hidden = self.model(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev),
                            self.caches, meta)
        logits = self.model.logits(hidden)  # [rows, vocab] float32
        target = torch.tensor(targets, device=dev)
        picked = logits.gather(1, target.clamp(min=0)[:, None])[:, 0]
        scores = (picked - torch.logsumexp(logits, dim=-1)).cpu().numpy()
        for text, start, row, rows in owners:
            # row + r predicts the token after position start + r
            out = self.logprobs[text]
            stop = min(rows, len(out) - start - 1)
            out[start + 1:start + 1 + stop] = scores[row:row + stop]
        return self.done
