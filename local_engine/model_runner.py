"""Tensors only: the model, its paged KV cache, and one forward step over a scheduled batch.

The step is lean on purpose (gpt-fast's habit: the hot path is a few tensor ops): every
running sequence's block table is a row of one tensor, kept across steps and grown by the
blocks added since the last one, so a step copies a handful of ints per sequence, never a
token list or a whole table; cache slots, attention masks and the sampled tokens are
computed for the whole batch at once.
"""

from __future__ import annotations

import torch

from local_engine.cuda_graphs import DecodeGraphs
from local_engine.grammar import Constrained, constrain
from local_engine.kv_cache import KvCache, kv_bytes_per_token
from local_engine.model import KV_CHUNK, AttentionMeta, Decodes, LlamaModel, prefill_mask
from local_engine.sampling import sample
from local_engine.scheduler import Scheduled
from local_engine.speculative import verify

__all__ = ["ModelRunner", "StepInputs"]


class StepInputs:
    """One step's tensors: ``ids`` [T] and ``positions`` [T] of the new tokens (decodes
    first, then prefill chunks), ``meta``, and ``logit_rows`` [R]: the rows whose next-token
    logits are needed (all rows of a decode or a verified draft, a prefill's last row when it
    ends the prompt). ``spans[i]``: item i's (first, count) among those R rows."""

    __slots__ = ("ids", "logit_rows", "meta", "positions", "spans")

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta,
                 logit_rows: torch.Tensor, spans: list[tuple[int, int]]):
        self.ids = ids
        self.positions = positions
        self.meta = meta
        self.logit_rows = logit_rows
        self.spans = spans


class ModelRunner:
    """KV cache: per layer, keys and values of shape [num_blocks * block_size, kv_heads,
    head_dim] (a block is ``block_size`` consecutive slots), stored as ``kv_cache_dtype``
    says (:class:`~local_engine.kv_cache.KvCache`). ``tables`` [max_num_seqs,
    max_blocks]: row ``seq.seat`` holds that sequence's block ids."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int,
                 max_num_seqs: int = 32, max_model_len: int = 2048, max_draft: int = 0,
                 cuda_graphs: bool = True, kv_cache_dtype: str = "auto"):
        self.model = model
        self.block_size = block_size
        cfg = model.cfg
        param = next(model.parameters())
        # one more block than the block manager hands out: scratch for padding rows
        self.caches = [KvCache((num_blocks + 1) * block_size, cfg.num_key_value_heads,
                               cfg.head_dim, param.dtype, param.device, kv_cache_dtype)
                       for _ in range(cfg.num_hidden_layers)]
        self.device = param.device
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        cuda = self.device.type == "cuda"
        # On a CPU contexts are read in whole chunks of the attention's value product
        # (local_engine.model.invariant_attention): the blocks past a context are masked.
        self.chunk_blocks = 1 if cuda else -(-KV_CHUNK // block_size)
        # +1: a verify step may reserve a block past the last position it keeps.
        max_blocks = self._width(-(-max_model_len // block_size) + 1)
        self._host = torch.zeros((max_num_seqs, max_blocks), dtype=torch.long,
                                 pin_memory=cuda)
        self._host_np = self._host.numpy()
        self.tables = self._host.to(self.device) if cuda else self._host
        self._dirty = False
        self._arange = torch.arange(max_blocks * block_size, device=self.device)
        self.graphs: DecodeGraphs | None = None
        if cuda and cuda_graphs:  # never on a CPU: nothing to gain there, and eager is exact
            self.graphs = DecodeGraphs(model, self.caches, block_size, max_num_seqs,
                                       1 + max_draft, max_blocks, num_blocks * block_size,
                                       self.group)

    def _width(self, blocks: int) -> int:
        """``blocks`` rounded up to whole attention chunks."""
        return -(-blocks // self.chunk_blocks) * self.chunk_blocks

    @staticmethod
    def kv_bytes_per_block(model: LlamaModel, block_size: int, dtype: torch.dtype,
                           kv_cache_dtype: str = "auto") -> int:
        """A block's bytes over every layer, keys, values and their scales."""
        cfg = model.cfg
        return block_size * kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                               cfg.head_dim, dtype, kv_cache_dtype)

    def _sync_tables(self, batch: list[Scheduled]) -> None:
        """Copy the block ids each sequence gained since the last step into its row."""
        for sc in batch:
            seq = sc.seq
            n, table = seq.num_synced_blocks, seq.block_table
            if n < len(table):
                self._host_np[seq.seat, n:len(table)] = table[n:]
                seq.num_synced_blocks = len(table)
                self._dirty = True
        if self._dirty and self.tables is not self._host:
            self.tables.copy_(self._host, non_blocking=True)
        self._dirty = False

    def prepare(self, batch: list[Scheduled]) -> StepInputs:
        """The step's input tensors. Decodes (with their drafts) go first in the flat batch,
        in one padded attention group; prefill chunks follow."""
        self._sync_tables(batch)
        bs, dev = self.block_size, self.device
        ids: list[int] = []
        positions: list[int] = []
        seats: list[int] = []
        decodes = [i for i, sc in enumerate(batch) if sc.decodes]
        prefills = [i for i, sc in enumerate(batch) if not sc.decodes]
        spans: list[tuple[int, int]] = [(0, 0)] * len(batch)
        logit_rows: list[int] = []
        for i in decodes:
            sc = batch[i]
            n = sc.num_new
            spans[i] = (len(logit_rows), n)
            logit_rows.extend(range(len(ids), len(ids) + n))
            ids.append(sc.seq.last_token)
            ids.extend(sc.draft)
            positions.extend(range(sc.start, sc.start + n))
            seats.extend([sc.seq.seat] * n)
        meta = AttentionMeta(slots=torch.empty(0), block_size=bs)
        if decodes:
            meta.decodes = self._decodes([batch[i] for i in decodes], len(ids))
        for i in prefills:
            sc = batch[i]
            start, n, end = sc.start, sc.num_new, sc.start + sc.num_new
            row = len(ids)
            ids.extend(sc.seq.tokens(start, end))
            positions.extend(range(start, end))
            seats.extend([sc.seq.seat] * n)
            blocks = self.tables[sc.seq.seat, :self._width(-(-end // bs))]
            mask = prefill_mask(start, end, len(blocks) * bs, self.group, dev)
            meta.prefills.append((row, n, blocks, mask))
            if sc.samples:
                spans[i] = (len(logit_rows), 1)
                logit_rows.append(row + n - 1)
        pos = torch.tensor(positions, device=dev)
        seat = torch.tensor(seats, device=dev)
        meta.slots = self.tables[seat, pos // bs] * bs + pos % bs
        return StepInputs(torch.tensor(ids, device=dev), pos, meta,
                          torch.tensor(logit_rows, device=dev, dtype=torch.long), spans)

    def _decodes(self, items: list[Scheduled], rows: int) -> Decodes:
        bs, dev = self.block_size, self.device
        counts = [sc.num_new for sc in items]
        q = max(counts)
        width = self._width(max(-(-(sc.start + sc.num_new) // bs) for sc in items))
        seats = torch.tensor([sc.seq.seat for sc in items], device=dev)
        tables = self.tables.index_select(0, seats)[:, :width]
        starts = torch.tensor([sc.start for sc in items], device=dev)
        # the last position each (padded) query sees: its own, a pad repeats the last real
        last = starts[:, None] + torch.arange(q, device=dev)[None, :]
        gather = scatter = None
        if q > 1 and min(counts) < q:
            n = torch.tensor(counts, device=dev)
            last = torch.minimum(last, (starts + n - 1)[:, None])
            first = torch.tensor([0] + counts[:-1], device=dev).cumsum(0)
            offsets = torch.minimum(torch.arange(q, device=dev)[None, :], (n - 1)[:, None])
            gather = (first[:, None] + offsets).flatten()
            src = [b * q + j for b, c in enumerate(counts) for j in range(c)]
            scatter = (torch.tensor(src, device=dev), torch.arange(rows, device=dev))
        mask = self._arange[:width * bs][None, None, :] <= last[:, :, None]  # [B, Q, L]
        if q > 1:  # one row per (query, head of the group), as the attention lays them out
            mask = mask.repeat_interleave(self.group, dim=1)
        return Decodes(rows, q, tables, mask[:, None], gather, scatter)

    @torch.inference_mode()
    def forward(self, batch: list[Scheduled]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Run one step; returns logits [R, vocab] (float32) of the rows that predict a next
        token, and each item's (first, count) among them."""
        if self.graphs is not None and all(sc.decodes for sc in batch):
            return self._replay(batch)
        inputs = self.prepare(batch)
        hidden = self.model(inputs.ids, inputs.positions, self.caches, inputs.meta)
        logits = self.model.logits(hidden.index_select(0, inputs.logit_rows))
        return logits, inputs.spans

    def _replay(self, batch: list[Scheduled]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """A decode-only step through a captured CUDA graph (see local_engine.cuda_graphs)."""
        assert self.graphs is not None
        self._sync_tables(batch)
        bs = self.block_size
        ids, starts, slots = [], [], []
        width = 0
        for sc in batch:
            table = sc.seq.block_table
            ids.append([sc.seq.last_token, *sc.draft])
            starts.append(sc.start)
            slots.append([table[p // bs] * bs + p % bs
                          for p in range(sc.start, sc.start + sc.num_new)])
            width = max(width, -(-(sc.start + sc.num_new) // bs))
        seats = torch.tensor([sc.seq.seat for sc in batch])
        logits, q = self.graphs.run(ids, starts, slots, seats, self.tables, width)
        return logits, [(i * q, sc.num_new) for i, sc in enumerate(batch)]

    @torch.inference_mode()
    def step(self, batch: list[Scheduled]) -> list[list[int]]:
        """One step; each item's new tokens: none for a prefill chunk short of the end, one
        for a plain decode, the accepted drafts and one more for a verified draft. Rows of
        sequences with a grammar are masked first (:func:`local_engine.grammar.constrain`)."""
        logits, spans = self.forward(batch)
        constrain(logits, [Constrained(sc.seq.matcher, spans[i][0], sc.draft)
                           for i, sc in enumerate(batch)
                           if sc.seq.matcher is not None and spans[i][1]])
        plain = [i for i, sc in enumerate(batch) if spans[i][1] and not sc.draft]
        drafted = [i for i, sc in enumerate(batch) if sc.draft]
        tokens: list[list[int]] = [[] for _ in batch]
        if plain:
            rows = [spans[i][0] + spans[i][1] - 1 for i in plain]
            chosen = sample(logits[rows], [batch[i].seq.params for i in plain],
                            [batch[i].seq.generator for i in plain]).tolist()
            for i, tok in zip(plain, chosen, strict=True):
                tokens[i] = [tok]
        if drafted:
            new = verify(logits, [spans[i] for i in drafted], [batch[i].draft for i in drafted],
                         [batch[i].seq.params for i in drafted],
                         [batch[i].seq.generator for i in drafted])
            for i, toks in zip(drafted, new, strict=True):
                tokens[i] = toks
        return tokens
