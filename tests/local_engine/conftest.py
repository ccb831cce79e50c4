"""A tiny randomly initialised Llama, built in the test run (no download), and engines on it.

``ENGINE_TEST_DEVICE=cuda`` (and optionally ``ENGINE_TEST_DTYPE=bfloat16``) runs these
engines on a GPU; the default is the CPU in float32.
"""

from __future__ import annotations

import os
from collections.abc import Callable

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


@pytest.fixture()
def engine_dtype() -> torch.dtype:
    return DTYPE


@pytest.fixture()
def engine_device() -> torch.device:
    return DEVICE


@pytest.fixture()
def make_engine(hf_model: LlamaForCausalLM) -> Callable[..., Engine]:
    def make(dtype: torch.dtype = DTYPE, **kwargs: object) -> Engine:
        model = from_hf_module(hf_model, DEVICE, dtype)
        config = EngineConfig(**{"kv_cache_mb": 1, "block_size": 4, **kwargs})  # type: ignore[arg-type]
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
