"""The engine's compute dtype: "auto" is bfloat16 where the device computes it natively."""

from __future__ import annotations

import pytest
import torch

from local_engine.loader import engine_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [
    (True, False, torch.bfloat16), (False, True, torch.bfloat16),
    (False, False, torch.float32)])
def test_auto_is_bfloat16_only_on_a_cpu_that_computes_it_natively(
        monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool,
        expected: torch.dtype) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert engine_dtype("auto", CPU) is expected
    assert engine_dtype("auto", torch.device("cuda")) is torch.bfloat16


def test_named_dtypes_are_kept_and_others_refused() -> None:
    assert engine_dtype("float32", CPU) is torch.float32
    assert engine_dtype("bfloat16", CPU) is torch.bfloat16
    with pytest.raises(ValueError, match="float16.*auto, float32, bfloat16"):
        engine_dtype("float16", CPU)
