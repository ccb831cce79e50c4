"""CUDA graphs for decode steps (CUDA only; the CPU path never comes here).

A decode step of a small model is launch-bound on a GPU: hundreds of small kernels whose
launch costs more than their work (about 21 ms a step at batch 1 for SmolLM2-135M on an H200,
eager). The step is one small side-effect-free function of fixed-shape tensors,
:func:`decode_logits` (gpt-fast's ``decode_one_token`` habit; the only writes are the new
keys and values into the cache), captured once per shape bucket into a CUDA graph and
replayed (vLLM and SGLang capture decode the same way). Shapes are bucketed: batch to a
few sizes, queries per sequence to 1 (plain decode) or ``1 + k`` (verifying a draft), the
block-table width to a power of two. Padding rows write their keys and values into a
scratch block no sequence owns and see only its first key; their logits are ignored.
Graphs are captured lazily, on the first step of each shape, into one shared memory pool
(safe here: a graph's output is read before the next replay).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from local_engine.kv_cache import KvCache
from local_engine.model import AttentionMeta, Decodes, LlamaModel

__all__ = ["DecodeGraphs", "decode_logits"]

Caches = list[KvCache]


def decode_logits(model: LlamaModel, caches: Caches, ids: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, tables: torch.Tensor, last: torch.Tensor,
                  block_size: int, group: int) -> torch.Tensor:
    """Logits [B * Q, vocab] (float32) for ``B`` sequences of ``Q`` query rows each.
    ``ids``, ``positions``, ``slots`` [B * Q]; ``tables`` [B, W] block ids; ``last`` [B, Q]
    the last key position each query sees (causal within the sequence's new tokens)."""
    b, q = last.shape
    width = tables.shape[1] * block_size
    mask = torch.arange(width, device=last.device)[None, None, :] <= last[:, :, None]
    if q > 1:
        mask = mask.repeat_interleave(group, dim=1)
    meta = AttentionMeta(slots=slots, block_size=block_size,
                         decodes=Decodes(b * q, q, tables, mask[:, None]))
    return model.logits(model(ids, positions, caches, meta))


def _bucket(n: int, sizes: list[int]) -> int:
    return next(s for s in sizes if s >= n)


class DecodeGraphs:
    """Captured decode steps. ``scratch`` is the first slot of the scratch block. With
    ``capture=False`` the same padded steps run eagerly (tests check the padding on a CPU)."""

    def __init__(self, model: LlamaModel, caches: Caches, block_size: int, max_seqs: int,
                 max_queries: int, max_blocks: int, scratch: int, group: int,
                 capture: bool = True):
        self.model, self.caches = model, caches
        self.block_size, self.group, self.scratch = block_size, group, scratch
        dev = next(model.parameters()).device
        self.batch_sizes = sorted({s for s in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
                                   if s < max_seqs} | {max_seqs})
        self.widths = sorted({min(max_blocks, 1 << i) for i in range(2, 20)
                              if (1 << (i - 1)) < max_blocks})
        rows = max_seqs * max_queries
        self.ids = torch.zeros(rows, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        self.slots = torch.full((rows,), scratch, dtype=torch.long, device=dev)
        self.tables = torch.zeros((max_seqs, max_blocks), dtype=torch.long, device=dev)
        self.last = torch.zeros((max_seqs, max_queries), dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int, int], tuple[Any, torch.Tensor]] = {}
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def _step(self, b: int, q: int, w: int) -> torch.Tensor:
        return decode_logits(self.model, self.caches, self.ids[:b * q], self.positions[:b * q],
                             self.slots[:b * q], self.tables[:b, :w], self.last[:b, :q],
                             self.block_size, self.group)

    def _capture(self, b: int, q: int, w: int) -> tuple[Any, torch.Tensor]:
        self.slots[:b * q] = self.scratch  # warm-up and capture write only the scratch block
        self.last[:b, :q] = 0
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated upstream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture (kernel selection, caches)
            for _ in range(2):
                self._step(b, q, w)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # No garbage collection inside the capture: collecting an engine's old graphs there
        # resets them mid-capture ("operation not permitted when stream is capturing"), seen
        # with seeded-sampling reproducibility failing on an H200. (A gc.collect() before
        # each capture, as vLLM does once, took the engine tests there from 10-37 s past 120 s.)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                out = self._step(b, q, w)
        finally:
            if collecting:
                gc.enable()
        return graph, out

    def run(self, ids: list[list[int]], starts: list[int], slots: list[list[int]],
            seats: torch.Tensor, tables: torch.Tensor, width: int) -> tuple[torch.Tensor, int]:
        """Replay the graph for these sequences: row j of sequence i is token ``ids[i][j]``
        at position ``starts[i] + j`` into cache slot ``slots[i][j]``; ``tables`` is the
        runner's table tensor, rows ``seats``, ``width`` blocks used. Returns the logits
        [B' * Q', vocab] of the padded batch and Q' (sequence i's row j is i * Q' + j)."""
        n = len(ids)
        b = _bucket(n, self.batch_sizes)
        q = max(len(x) for x in ids)
        q = q if q == 1 else self.last.shape[1]
        w = _bucket(width, self.widths)
        flat_ids = [0] * (b * q)
        flat_pos = [0] * (b * q)
        flat_slots = [self.scratch] * (b * q)
        last = [0] * (b * q)
        for i, (tok, start, sl) in enumerate(zip(ids, starts, slots, strict=True)):
            k = len(tok)
            base = i * q
            flat_ids[base:base + k] = tok
            flat_pos[base:base + q] = [start + min(j, k - 1) for j in range(q)]
            flat_slots[base:base + k] = sl
            last[base:base + q] = flat_pos[base:base + q]
        key = (b, q, w)
        if self.capture and key not in self.graphs:
            self.graphs[key] = self._capture(b, q, w)
        dev = self.ids.device
        self.ids[:b * q].copy_(torch.tensor(flat_ids), non_blocking=True)
        self.positions[:b * q].copy_(torch.tensor(flat_pos), non_blocking=True)
        self.slots[:b * q].copy_(torch.tensor(flat_slots), non_blocking=True)
        self.last[:b, :q].copy_(torch.tensor(last).view(b, q), non_blocking=True)
        self.tables[:n, :w].copy_(tables.index_select(0, seats.to(dev))[:, :w])
        self.tables[n:b, :w] = 0
        if not self.capture:
            return self._step(b, q, w), q
        graph, out = self.graphs[key]
        graph.replay()
        return out, q
