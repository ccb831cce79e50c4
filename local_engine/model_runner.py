"""Tensors only: the model, its paged KV cache, and one forward step over a scheduled batch."""

from __future__ import annotations

import torch

from local_engine.model import AttentionMeta, LlamaModel
from local_engine.sampling import sample
from local_engine.scheduler import Scheduled

__all__ = ["ModelRunner"]


class ModelRunner:
    """KV cache: per layer, keys and values of shape [num_blocks * block_size, kv_heads,
    head_dim] (a block is ``block_size`` consecutive slots)."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int):
        self.model = model
        self.block_size = block_size
        cfg = model.cfg
        param = next(model.parameters())
        shape = (num_blocks * block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.caches = [(torch.zeros(shape, dtype=param.dtype, device=param.device),
                        torch.zeros(shape, dtype=param.dtype, device=param.device))
                       for _ in range(cfg.num_hidden_layers)]
        self.device = param.device
        self._offsets = torch.arange(block_size, device=self.device)

    @staticmethod
    def kv_bytes_per_block(model: LlamaModel, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
        return per_token * block_size * torch.finfo(dtype).bits // 8

    @torch.inference_mode()
    def forward(self, batch: list[Scheduled]) -> torch.Tensor:
        """Run one step; returns logits [len(batch), vocab] at each sequence's last new token."""
        ids: list[int] = []
        positions: list[int] = []
        new_slots: list[torch.Tensor] = []
        last: list[int] = []
        dec_rows: list[int] = []
        dec_ctx: list[torch.Tensor] = []
        meta = AttentionMeta(slots=torch.empty(0))
        bs = self.block_size
        for sc in batch:
            seq, start, n = sc.seq, sc.start, sc.num_new
            end = start + n
            row = len(ids)
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            last.append(row + n - 1)
            blocks = torch.tensor(seq.block_table[:-(-end // bs)], device=self.device)
            ctx = (blocks[:, None] * bs + self._offsets).flatten()[:end]
            new_slots.append(ctx[start:])
            if n == 1:
                dec_rows.append(row)
                dec_ctx.append(ctx)
            else:  # query j sits at position start + j and sees keys up to it
                mask = (torch.arange(end, device=self.device)[None, :]
                        <= torch.arange(start, end, device=self.device)[:, None])
                meta.prefills.append((row, n, ctx, mask))
        meta.slots = torch.cat(new_slots)
        if dec_rows:
            lengths = torch.tensor([len(c) for c in dec_ctx], device=self.device)
            meta.decode_rows = torch.tensor(dec_rows, device=self.device)
            meta.decode_slots = torch.nn.utils.rnn.pad_sequence(dec_ctx, batch_first=True)
            width = meta.decode_slots.shape[1]
            meta.decode_mask = (torch.arange(width, device=self.device)[None, :]
                                < lengths[:, None])[:, None, None, :]
        hidden = self.model(torch.tensor(ids, device=self.device),
                            torch.tensor(positions, device=self.device), self.caches, meta)
        return self.model.logits(hidden[torch.tensor(last, device=self.device)])

    def step(self, batch: list[Scheduled]) -> list[int | None]:
        """One step; the next token of each sequence that samples in it, else None."""
        logits = self.forward(batch)
        rows = [i for i, sc in enumerate(batch) if sc.samples]
        tokens: list[int | None] = [None] * len(batch)
        if rows:
            chosen = sample(logits[rows], [batch[i].seq.params for i in rows],
                            [batch[i].seq.generator for i in rows])
            for i, tok in zip(rows, chosen, strict=True):
                tokens[i] = tok
        return tokens
