"""A compact Llama forward pass over a paged KV cache (tensors only, no scheduling).

The batch is flat: the new tokens of every scheduled sequence, concatenated. Each layer
writes the new keys and values into their cache slots, then each sequence attends over its
own cached context (gathered through its block table) with a causal offset, so prefill
chunks, whole prompts and decode steps share one code path. Weights are Hugging Face
``LlamaForCausalLM`` names (SmolLM2 is a Llama).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AttentionMeta", "LlamaConfig", "LlamaModel"]


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
class AttentionMeta:
    """Where the step's tokens sit in the flat batch and in the cache (built once a step).

    ``slots``: [T] cache slot of every new token. Decoding sequences (one new token each) are
    attended together: ``decode_rows`` [Nd] their rows in the batch, ``decode_slots``
    [Nd, L] their context's cache slots padded to the longest, ``decode_mask``
    [Nd, 1, 1, L] True on real slots. Prefill chunks go one by one: ``prefills`` holds
    (first row, row count, context slots [ctx], causal mask [n, ctx]).
    """

    slots: torch.Tensor
    decode_rows: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]] = field(default_factory=list)


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
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        t = x.shape[0]
        q = rotate(self.q_proj(x).view(t, self.h, self.d), cos, sin)
        k = rotate(self.k_proj(x).view(t, self.kvh, self.d), cos, sin)
        v = self.v_proj(x).view(t, self.kvh, self.d)
        k_cache.index_copy_(0, meta.slots, k)
        v_cache.index_copy_(0, meta.slots, v)
        out = torch.empty_like(q)
        if meta.decode_rows is not None:
            qd = q[meta.decode_rows].unsqueeze(2)  # [Nd, H, 1, D]
            kd = k_cache[meta.decode_slots].transpose(1, 2)  # [Nd, KVH, L, D]
            vd = v_cache[meta.decode_slots].transpose(1, 2)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask,
                                                enable_gqa=True)
            out[meta.decode_rows] = od.squeeze(2)
        for start, n, slots, mask in meta.prefills:
            qi = q[start:start + n].transpose(0, 1)  # [H, n, D]
            ki = k_cache[slots].transpose(0, 1)  # [KVH, ctx, D]
            vi = v_cache[slots].transpose(0, 1)
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)
            out[start:start + n] = o.transpose(0, 1)
        projected: torch.Tensor = self.o_proj(out.reshape(t, self.h * self.d))
        return projected


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return down


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
                caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMeta) -> torch.Tensor:
        x = self.embed_tokens(ids)
        cos, sin = self.rope(positions, x.dtype)
        # nn.ModuleList is not generic: its items type as Module; these are DecoderLayers.
        layers = cast(Iterable[DecoderLayer], self.layers)
        for layer, (k_cache, v_cache) in zip(layers, caches, strict=True):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, k_cache, v_cache, meta)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden: torch.Tensor = self.norm(x)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()
