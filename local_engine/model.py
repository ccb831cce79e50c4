"""A compact Llama forward pass over a paged KV cache (tensors only, no scheduling).

The batch is flat: the new tokens of every scheduled sequence, concatenated. Each layer
writes the new keys and values into their cache slots, then attends: decoding sequences
(one new token each, or their last token and the draft tokens to verify) as one padded
batch, prefill chunks one by one with a causal offset. Contexts are read through block
tables, a block at a time. Weights are Hugging Face ``LlamaForCausalLM`` names (SmolLM2 is
a Llama).

On a CPU in fp32 the forward pass is batch-invariant: a token's logits are bit-identical
whether it is decoded alone, beside other sequences, as one of a draft's verified positions,
or recomputed in a prefill chunk after a preemption. So greedy outputs do not depend on the
load. Two things make it so (the idea: He et al., "Defeating Nondeterminism in LLM
Inference", Thinking Machines Lab 2025): a projection of a single row is computed as two
rows (oneDNN's one-row kernel sums in another order than its many-row one), and attention is
:func:`invariant_attention`, whose per-row sums do not depend on the other rows or on how
far the keys are padded. In bf16 the attention still is, but oneDNN's bf16 matrix products
are not at every shape: on an AMX CPU SmolLM2's down projection (1536 -> 576) and output
head give a row other bits in a call of 64 rows than alone (the tiny test model's shapes
do not show it). Fixed blocks of 16-64 rows per call fix that at 1.5-2.3x the prefill time,
so they are not used. On CUDA, attention is PyTorch's SDPA as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.kv_cache import KvCache

__all__ = ["KV_CHUNK", "AttentionMeta", "Decodes", "LlamaConfig", "LlamaModel",
           "invariant_attention", "prefill_mask"]

KV_CHUNK = 256
"""Keys per chunk of :func:`invariant_attention`'s value product (tokens). Contexts padded
to a multiple of it (with masked keys) attend without a copy."""


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        rope = cfg.get("rope_parameters") or {}
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
        )


@dataclass
class Decodes:
    """The step's decoding sequences, attended as one padded batch of ``B`` sequences with
    ``Q`` queries each: one for a plain decode, ``1 + k`` when ``k`` draft tokens are verified
    (a sequence with fewer is padded). Their new tokens are rows ``[0, rows)`` of the flat
    batch, in order. ``tables`` [B, W] block ids of their contexts (W blocks cover the longest);
    ``mask`` [B, 1, Q * G, W * block_size] True where a query sees a key (causal from the
    sequence's first new position; ``G`` query heads share a key-value head, see
    :meth:`Attention.forward`). ``gather`` [B * Q] the flat row of each padded query and
    ``scatter`` ([R] padded indices, [R] flat rows) put real answers back, or both None
    when every sequence has exactly ``Q`` new tokens."""

    rows: int
    q: int
    tables: torch.Tensor
    mask: torch.Tensor
    gather: torch.Tensor | None = None
    scatter: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class AttentionMeta:
    """Where the step's tokens sit in the flat batch and in the paged cache (built once a
    step). ``slots``: [T] cache slot of every new token. ``decodes``: see :class:`Decodes`.
    Prefill chunks follow, one by one: ``prefills`` holds (first row, row count n, block ids
    [nb] of the context, causal mask [n * G, nb * block_size], a row per (query, head of
    the group) as :meth:`Attention.forward` lays them out)."""

    slots: torch.Tensor
    block_size: int
    decodes: Decodes | None = None
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]] = field(default_factory=list)


def prefill_mask(start: int, end: int, keys: int, group: int,
                 device: torch.device) -> torch.Tensor:
    """The causal mask of a prefill chunk at positions [start, end) over ``keys`` keys:
    [(end - start) * group, keys], True where a query sees a key (query j, at position
    start + j, sees keys up to it), one row per (query, head of its group) as
    :meth:`Attention.forward` lays them out."""
    last = torch.arange(start, end, device=device).repeat_interleave(group)
    return torch.arange(keys, device=device)[None, :] <= last[:, None]


def project(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for x [T, in]; on a CPU one row of an ``nn.Linear`` is computed as two
    identical rows, so that its result equals the one it gets inside any larger batch
    (oneDNN's one-row kernel sums in another order; measured for the 1536-wide down
    projection in bf16). A quantized layer (local_engine.quantize) is called as it is."""
    if not isinstance(layer, nn.Linear):
        out: torch.Tensor = layer(x)
        return out
    if x.shape[0] == 1 and not x.is_cuda:
        return F.linear(x.expand(2, -1), layer.weight)[:1]
    return F.linear(x, layer.weight)


def invariant_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        visible: torch.Tensor, chunk: int = KV_CHUNK) -> torch.Tensor:
    """Softmax attention whose every output row is bit-identical however rows are batched.

    q [B, KVH, R, D]; k, v [B, KVH, L, D]; visible [B, 1, R or 1, L] bool, True where a
    query row sees a key (every row must see one). Returns [B, KVH, R, D] in q's dtype.

    Scores are one batched matmul (its rows do not depend on the other rows), scaled and
    masked in q's dtype, then a softmax in float32, as in Hugging Face's eager attention.
    The value product runs over fixed chunks of ``chunk`` keys (a matmul whose reduction
    length never changes) and the chunks' results are summed in float32; masked keys
    weigh exactly 0, so padding the context with more masked chunks leaves every sum as
    it was. L is padded to a multiple of ``chunk`` here when it is not (a copy: callers
    on the hot path pass padded contexts). PyTorch's SDPA on a CPU is not invariant in
    bf16: its result for a row changes with the number of query rows in its block."""
    b, kvh, r, d = q.shape
    if r == 1:  # one query row is computed as two, as in project()
        return invariant_attention(q.expand(b, kvh, 2, d), k, v,
                                   visible.expand(*visible.shape[:2], 2, -1), chunk)[:, :, :1]
    pad = -k.shape[2] % chunk
    if pad:
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        visible = F.pad(visible, (0, pad))
    scores = torch.matmul(q, k.transpose(2, 3)).mul_(d ** -0.5)
    scores.masked_fill_(visible.logical_not(), float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    c = k.shape[2] // chunk
    per_chunk = torch.matmul(p.view(b, kvh, r, c, chunk).transpose(2, 3),
                             v.view(b, kvh, c, chunk, d))  # [B, KVH, C, R, D]
    return per_chunk.sum(2, dtype=torch.float32).to(q.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           visible: torch.Tensor) -> torch.Tensor:
    """:func:`invariant_attention` on a CPU, SDPA on CUDA; shapes as there."""
    if q.is_cuda:
        out: torch.Tensor = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return out
    return invariant_attention(q, k, v, visible)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split layout as in HF Llama. x: [T, H, D]; cos/sin: [T, D]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d, h, kvh = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.h, self.kvh, self.d = h, kvh, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KvCache, meta: AttentionMeta) -> torch.Tensor:
        """x: [T, hidden]. Keys and values are read a whole block at a time
        (:meth:`KvCache.read`, an ``index_select`` of block rows: a memcpy each, several
        times faster on a CPU than gathering slot by slot)."""
        t, h, kvh, d = x.shape[0], self.h, self.kvh, self.d
        q = rotate(project(self.q_proj, x).view(t, h, d), cos, sin)
        k = rotate(project(self.k_proj, x).view(t, kvh, d), cos, sin)
        v = project(self.v_proj, x).view(t, kvh, d)
        cache.write(meta.slots, k, v)
        out = torch.empty_like(q)
        dec = meta.decodes
        if dec is not None:
            qd = q[:dec.rows] if dec.gather is None else q.index_select(0, dec.gather)
            od = self._attend_grouped(qd, dec.tables.shape[0], dec.tables.flatten(),
                                      cache, meta.block_size, dec.mask)
            if dec.scatter is None:
                out[:dec.rows] = od
            else:
                src, dst = dec.scatter
                out.index_copy_(0, dst, od.index_select(0, src))
        for start, n, blocks, mask in meta.prefills:  # each a group of one sequence
            out[start:start + n] = self._attend_grouped(q[start:start + n], 1, blocks, cache,
                                                        meta.block_size, mask[None, None])
        return project(self.o_proj, out.reshape(t, h * d))

    def _attend_grouped(self, q: torch.Tensor, b: int, blocks: torch.Tensor, cache: KvCache,
                        block_size: int, visible: torch.Tensor) -> torch.Tensor:
        """Attention of ``b`` sequences with Q queries each: q [B * Q, H, D], their contexts'
        block ids ``blocks`` [B * W], ``visible`` as :func:`attend` takes it; returns
        [B * Q, H, D]. Query heads are grouped under their key-value head: [B, KVH, Q * G, D]
        against keys [B, KVH, L, D], so no key or value is repeated G times (GQA, Ainslie et
        al. 2023); head i uses key-value head i // G as in Hugging Face Llama."""
        h, kvh, d = self.h, self.kvh, self.d
        g = h // kvh
        grouped = q.view(b, -1, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, -1, d)
        keys, values = cache.read(blocks, block_size)
        k = keys.view(b, -1, kvh, d).transpose(1, 2)
        v = values.view(b, -1, kvh, d).transpose(1, 2)
        o = attend(grouped, k, v, visible)
        return o.view(b, kvh, -1, g, d).permute(0, 2, 1, 3, 4).reshape(-1, h, d)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(self.down_proj,
                       F.silu(project(self.gate_proj, x)) * project(self.up_proj, x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    """``forward(ids [T], positions [T], caches, meta) -> hidden [T, hidden]``;
    ``logits(hidden) -> [N, vocab]``."""

    inv_freq: torch.Tensor  # a registered buffer; declared so that its type is known

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", self.inv_freq_for(None), persistent=False)

    def inv_freq_for(self, device: torch.device | None) -> torch.Tensor:
        """Rotary frequencies [head_dim / 2] (RoFormer, Su et al. 2021), in fp32."""
        d = self.cfg.head_dim
        steps = torch.arange(0, d, 2, device=device, dtype=torch.float32)
        return 1.0 / self.cfg.rope_theta ** (steps / d)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor,
                caches: list[KvCache], meta: AttentionMeta) -> torch.Tensor:
        x = self.embed_tokens(ids)
        cos, sin = self.rope(positions, x.dtype)
        # nn.ModuleList is not generic: its items type as Module; these are DecoderLayers.
        layers = cast(Iterable[DecoderLayer], self.layers)
        for layer, cache in zip(layers, caches, strict=True):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, cache, meta)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden: torch.Tensor = self.norm(x)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return project(self.lm_head, hidden).float()
