"""Weight quantization at load: INT8 weight-only on a CPU, FP8 on CUDA (per output channel).

``quantize(model, mode)`` swaps the model's projections, output head and input embedding
for quantized ones, in place, from the weights it was loaded with (the packaged GGUF's,
converted as before): nothing is cached on disk, quantizing SmolLM2-135M takes well under
a second.

- ``"int8"``: symmetric INT8 per output channel (one scale per row of ``weight``, the
  largest magnitude over 127), activations left in the compute dtype (weight-only, as
  gpt-fast's ``int8`` mode). Small products (decode steps, up to :data:`INT8_KERNEL_ROWS`
  rows) run PyTorch's own ``torch._weight_int8pack_mm``, which reads the INT8 weights
  directly; larger ones (prefill chunks) convert the weights to the compute dtype for a
  dense product, where the kernel, a row at a time, would be slower. The input embedding
  is INT8 too, per row (a tied one shares the head's matrix): a token's embedding is its
  row times its scale.
- ``"fp8"``: ``float8_e4m3fn`` weights with a scale per output channel, activations
  quantized per row at each call, products by ``torch._scaled_mm`` (W8A8 with dynamic
  activation scales, as vLLM's ``fp8`` on Hopper): CUDA devices of compute capability 8.9
  or more only. The embedding stays in the compute dtype (a lookup reads one row a token).

Neither mode is batch-invariant: the INT8 path's result for a row depends on which path the
product takes, so a greedy answer may differ with the load, as in bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["INT8_HEAD_KERNEL_ROWS", "INT8_KERNEL_ROWS", "QUANTIZATIONS", "Fp8Linear", "Int8Embedding", "Int8Linear",
           "Quantization", "check_supported", "quantize", "weight_bytes"]

Quantization = Literal["none", "int8", "fp8"]
QUANTIZATIONS: tuple[Quantization, ...] = ("none", "int8", "fp8")

INT8_KERNEL_ROWS = 16
"""Products of at most this many rows run ``torch._weight_int8pack_mm``; larger ones a
dense product of the dequantized weights. The kernel's cost grows with the rows (a row at
a time), the dense path's is mostly the conversion of the weights: measured on 2 cores of
an AMX CPU in bfloat16 for SmolLM2's projections, the kernel takes 0.25-0.4x a bfloat16
product's time at 1 row, about the same at 8, and passes the dense path at 16-24 rows.
The output head (49,152 rows to convert) switches at :data:`INT8_HEAD_KERNEL_ROWS`."""

INT8_HEAD_KERNEL_ROWS = 64

FP8_MAX = 448.0  # the largest float8_e4m3fn


def _int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [N, K] as INT8 [N, K] and fp32 scales [N]: row i is ``q[i] * scale[i]``."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """``x @ (weight * scales[:, None]).T`` for x [M, K] in the compute dtype; ``weight``
    INT8 [N, K], ``scales`` [N] in the compute dtype."""

    weight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor,
                 kernel_rows: int = INT8_KERNEL_ROWS):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.kernel_rows = kernel_rows

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Linear:
        q, scale = _int8_rows(weight)
        return cls(q, scale.to(weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.kernel_rows and x.dtype != torch.float32:
            # fp32 activations take the dense path: the kernel is not vectorised for them
            out: torch.Tensor = torch._weight_int8pack_mm(x, self.weight, self.scales)
            return out
        return F.linear(x, self.weight.to(x.dtype)).mul_(self.scales)


class Int8Embedding(nn.Module):
    """An embedding lookup from an INT8 matrix [V, H] with a scale per row [V] (the same
    tensors as a tied :class:`Int8Linear` head)."""

    def __init__(self, head: Int8Linear):
        super().__init__()
        self.head = head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.head.weight.index_select(0, ids).to(self.head.scales.dtype)
        return rows.mul_(self.head.scales.index_select(0, ids)[:, None])


class Fp8Linear(nn.Module):
    """A float8_e4m3fn product on CUDA: ``weight`` [N, K] float8 with ``scales`` [1, N]
    fp32; each call scales x's rows into float8 (amax / 448) and calls
    ``torch._scaled_mm`` with both scales (row-wise), output in x's dtype."""

    weight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
        self.register_buffer("weight", (w / scale[:, None]).to(torch.float8_e4m3fn))
        self.register_buffer("scales", scale[None, :].contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        sx = xf.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12) / FP8_MAX
        xq = (xf / sx).to(torch.float8_e4m3fn)
        out: torch.Tensor = torch._scaled_mm(xq, self.weight.t(), scale_a=sx,
                                             scale_b=self.scales, out_dtype=x.dtype)
        return out


def check_supported(mode: str, device: torch.device) -> None:
    """Raises ValueError when ``device`` cannot run ``mode``: INT8 on a CPU, FP8 on CUDA of
    compute capability 8.9 or more (Ada, Hopper and later: ``torch._scaled_mm``)."""
    if mode not in QUANTIZATIONS:
        raise ValueError(f"quantization {mode!r}: expected one of {', '.join(QUANTIZATIONS)}")
    if mode == "int8" and device.type != "cpu":
        raise ValueError("quantization 'int8' is the CPU's (weight-only INT8); on CUDA use "
                         "'fp8' or 'none'")
    if mode == "fp8":
        if device.type != "cuda":
            raise ValueError("quantization 'fp8' needs a CUDA device of compute capability "
                             "8.9 or more (torch._scaled_mm); on a CPU use 'int8'")
        if torch.cuda.get_device_capability(device) < (8, 9):
            cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
            raise ValueError(f"quantization 'fp8' needs compute capability 8.9 or more; "
                             f"this GPU has {cap}")


def _projections(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                yield module, name, child


def quantize(model: nn.Module, mode: str) -> None:
    """Quantize ``model`` (a :class:`~local_engine.model.LlamaModel`, loaded in its compute
    dtype on its device) in place. Raises ValueError (see :func:`check_supported`)."""
    device = next(model.parameters()).device
    check_supported(mode, device)
    if mode == "none":
        return
    embed = cast(nn.Embedding, model.embed_tokens)
    head = cast(nn.Linear, model.lm_head)
    tied = head.weight is embed.weight
    for parent, name, linear in _projections(model):
        new: nn.Module = (Int8Linear.from_float(linear.weight) if mode == "int8"
                          else Fp8Linear(linear.weight))
        setattr(parent, name, new)
    if mode == "int8":
        cast(Int8Linear, model.lm_head).kernel_rows = INT8_HEAD_KERNEL_ROWS
        # a lookup of one row a token: INT8 costs nothing there
        model.embed_tokens = Int8Embedding(cast(Int8Linear, model.lm_head) if tied
                                           else Int8Linear.from_float(embed.weight))


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, a tied matrix counted once."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())
