"""A tiny randomly initialised Llama, built in the test run (no download), and engines on it.

``ENGINE_TEST_DEVICE=cuda`` (and optionally ``ENGINE_TEST_DTYPE=bfloat16``) runs these
engines on a GPU; the default is the CPU in float32. ``ENGINE_TEST_MODES`` (a comma list of
:data:`MODES` names, or ``all``: those the device runs) runs every engine test once per
quantization mode; the default is ``default`` alone (unquantized), to keep ``make test``
short: CI runs the others as a step of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import llguidance
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from local_engine.engine import Engine, EngineConfig
from local_engine.grammar import GrammarCompiler
from local_engine.loader import from_hf_module

VOCAB = 96
DEVICE = torch.device(os.environ.get("ENGINE_TEST_DEVICE", "cpu"))
DTYPE = getattr(torch, os.environ.get("ENGINE_TEST_DTYPE", "float32"))


@dataclass(frozen=True)
class Mode:
    """An engine mode the tests run in: weight quantization, KV cache dtype, the compute
    dtype it forces (None: DTYPE; INT8 weights compute in bfloat16, where the CPU's INT8
    kernel runs), whether greedy outputs stay batch-invariant on a CPU, and the tolerance
    of its logits against transformers' unquantized ones (None: the dtype's)."""

    name: str
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    dtype: torch.dtype | None = None
    batch_invariant: bool = True
    atol: float | None = None
    device: str | None = None  # the only device that runs it


MODES = {m.name: m for m in (
    Mode("default"),
    Mode("int8", quantization="int8", dtype=torch.bfloat16, batch_invariant=False,
         atol=0.25, device="cpu"),
    Mode("kv-int8", kv_cache_dtype="int8", atol=0.1),
    Mode("kv-fp8", kv_cache_dtype="fp8", atol=0.25),
    Mode("fp8", quantization="fp8", kv_cache_dtype="fp8", dtype=torch.bfloat16,
         batch_invariant=False, atol=0.5, device="cuda"),
)}
_wanted = os.environ.get("ENGINE_TEST_MODES", "default")
ENGINE_MODES = ([m for m in MODES.values() if m.device in (None, DEVICE.type)]
                if _wanted == "all" else [MODES[name] for name in _wanted.split(",")])


def decode(ids: list[int]) -> str:
    """Token i is one character, so stop strings and text are easy to reason about."""
    return "".join(chr(32 + i % 95) for i in ids)


@pytest.fixture(scope="session")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = HFLlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512, rope_theta=10000.0, eos_token_id=1,
                        bos_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():  # larger weights: sharper distributions, fewer argmax ties
        p.data.normal_(0, 0.2)
    return model


@pytest.fixture(params=ENGINE_MODES, ids=[m.name for m in ENGINE_MODES])
def engine_mode(request: pytest.FixtureRequest) -> Mode:
    mode: Mode = request.param
    return mode


@pytest.fixture()
def engine_dtype(engine_mode: Mode) -> torch.dtype:
    return engine_mode.dtype or DTYPE


@pytest.fixture()
def logits_atol(engine_mode: Mode, engine_dtype: torch.dtype) -> float:
    """How far the engine's logits may be from transformers' unquantized ones."""
    dtype_atol = 1e-4 if engine_dtype == torch.float32 else 0.1  # bf16 keeps ~3 digits
    return max(dtype_atol, engine_mode.atol or 0.0)


@pytest.fixture()
def batch_invariant(engine_mode: Mode) -> bool:
    """Whether the mode's greedy outputs are the same whatever the batch (on a CPU): not
    with INT8 weights, whose products take the INT8 kernel or a dense path by their rows
    (local_engine.quantize); tests comparing outputs across batches check them only here."""
    return engine_mode.batch_invariant


@pytest.fixture()
def engine_device() -> torch.device:
    return DEVICE


@pytest.fixture()
def make_engine(hf_model: LlamaForCausalLM, engine_mode: Mode,
                engine_dtype: torch.dtype) -> Callable[..., Engine]:
    """Engines in the test's mode; ``dtype`` overrides the mode's compute dtype except for
    INT8 weights, which compute in bfloat16 (their CPU kernel's dtype)."""

    def make(dtype: torch.dtype = engine_dtype, **kwargs: object) -> Engine:
        if engine_mode.dtype is not None:
            dtype = engine_mode.dtype
        model = from_hf_module(hf_model, DEVICE, dtype, engine_mode.quantization)
        config = EngineConfig(**{"kv_cache_mb": 1, "block_size": 4,  # type: ignore[arg-type]
                                 "kv_cache_dtype": engine_mode.kv_cache_dtype, **kwargs})
        return Engine(model, decode, config, eos_token_ids=(1,))

    return make


@pytest.fixture(scope="session")
def char_grammars() -> GrammarCompiler:
    """A grammar compiler for :func:`decode`'s vocabulary (token i is ``chr(32 + i % 95)``;
    token 1 is the tiny model's EOS, so ``!`` is never text)."""
    vocab = {("Ġ" if i == 0 else chr(32 + i)): i for i in range(95)}  # byte-level: Ġ is " "
    vocab["<pad>"] = 95
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return GrammarCompiler(llguidance.LLTokenizer(tokenizer.to_str(), n_vocab=VOCAB,
                                                  eos_token=1))
