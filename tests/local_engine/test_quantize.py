"""Quantized weights and KV cache: close to the float computation, half the bytes or less,
more tokens in the same KV memory, and modes a device cannot run refused by name. (Every
engine test also runs in each mode: ENGINE_TEST_MODES, tests/local_engine/conftest.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from local_engine.engine import Engine, EngineConfig
from local_engine.kv_cache import KvCache
from local_engine.loader import from_hf_module
from local_engine.quantize import (
    INT8_KERNEL_ROWS,
    Fp8Linear,
    Int8Embedding,
    Int8Linear,
    check_supported,
    weight_bytes,
)
from local_engine.server import main

CPU = torch.device("cpu")


@pytest.mark.parametrize("rows", [1, INT8_KERNEL_ROWS, INT8_KERNEL_ROWS + 1, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_products_are_close_to_the_float_ones(rows: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g) * 0.2
    x = torch.randn(rows, 64, generator=g)
    layer = Int8Linear.from_float(w.to(dtype))
    assert layer.weight.dtype == torch.int8 and layer.scales.shape == (96,)
    got = layer(x.to(dtype)).float()
    want = F.linear(x, w)
    # per-channel INT8: each weight within half a step (max |row| / 254) of its value
    assert (got - want).abs().max() < 0.03 * want.abs().max()


def test_fp8_products_are_close_to_the_float_ones() -> None:
    # torch._scaled_mm has a CPU implementation too: the scales' layout is checked here,
    # the speed only on a GPU (bench/engine.py --quant)
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=g) * 0.2, torch.randn(5, 64, generator=g)
    layer = Fp8Linear(w.bfloat16())
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.scales.shape == (1, 96)
    got, want = layer(x.bfloat16()).float(), F.linear(x, w)
    assert (got - want).abs().max() < 0.08 * want.abs().max()  # e4m3: 3 mantissa bits


def test_a_tied_embedding_reads_the_heads_int8_rows() -> None:
    w = torch.randn(96, 64) * 0.2
    head = Int8Linear.from_float(w)
    ids = torch.tensor([3, 0, 95, 3])
    rows = Int8Embedding(head)(ids)
    torch.testing.assert_close(rows, w[ids], atol=0.2 / 127 * 4, rtol=0)


def test_int8_weights_take_about_half_the_bytes(hf_model: LlamaForCausalLM) -> None:
    plain = from_hf_module(hf_model, CPU, torch.bfloat16)
    int8 = from_hf_module(hf_model, CPU, torch.bfloat16, "int8")
    assert weight_bytes(int8) <= 0.55 * weight_bytes(plain)


def test_modes_the_device_cannot_run_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'fp8' needs a CUDA device"):
        check_supported("fp8", CPU)
    with pytest.raises(ValueError, match="'int8' is the CPU's"):
        check_supported("int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="expected one of none, int8, fp8"):
        check_supported("int4", CPU)
    check_supported("int8", CPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU refuses fp8")
def test_the_engine_refuses_fp8_weights_on_a_cpu_before_loading() -> None:
    with pytest.raises(SystemExit, match="fp8.*CUDA"):
        main(["--quantization", "fp8", "--model", "/nonexistent", "--no-embeddings"])


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantized_kv_reads_back_close_to_what_was_written(kv: str) -> None:
    cache = KvCache(8 * 4, kv_heads=2, head_dim=16, compute=torch.bfloat16, device=CPU,
                    kv_dtype=kv)
    k, v = (torch.randn(5, 2, 16).bfloat16() for _ in range(2))
    cache.write(torch.tensor([4, 5, 6, 7, 13]), k, v)  # block 1 whole, one slot of block 3
    keys, values = cache.read(torch.tensor([1, 3]), block_size=4)
    assert keys.dtype == torch.bfloat16 and keys.shape == (8, 2, 16)
    step = 1 / 127 if kv == "int8" else 1 / 16  # e4m3: 3 mantissa bits
    for got, want in ((keys, k), (values, v)):
        got = torch.cat([got[:4], got[5:6]]).float()
        bound = want.float().abs().amax(-1, keepdim=True) * step
        assert ((got - want.float()).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_a_quantized_kv_cache_holds_more_tokens_in_the_same_memory(
        hf_model: LlamaForCausalLM, kv: str, dtype: torch.dtype) -> None:
    model = from_hf_module(hf_model, CPU, dtype)
    plain = Engine(model, str, EngineConfig(kv_cache_mb=4, block_size=4))
    small = Engine(model, str, EngineConfig(kv_cache_mb=4, block_size=4, kv_cache_dtype=kv))
    ratio = small.blocks.num_blocks / plain.blocks.num_blocks
    # the tiny model's 16-wide heads: 16 + 2 bytes for 32 (bf16), 16 + 4 for 64 (fp32)
    assert ratio >= (1.75 if dtype == torch.bfloat16 else 3.15)
    allocated = sum(c.nbytes for c in small.runner.caches)
    assert allocated <= 4 * 2**20 + small.runner.kv_bytes_per_block(model, 4, dtype, kv)
