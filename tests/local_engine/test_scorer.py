"""Prompt log-probabilities (the fine compression pass's scoring call) on the tiny random
Llama: exact against transformers, packed and chunked, and beside running decodes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, PromptTooLong
from local_engine.scorer import ScoreBatch
from local_engine.sequence import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 96, (n,), generator=g).tolist()


def reference(hf_model: LlamaForCausalLM, ids: list[int]) -> np.ndarray:
    """log p(t_i | t_<i) from transformers, NaN first."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])
    return np.concatenate([[np.nan], logprobs[:, 0].numpy()]).astype(np.float32)


@pytest.mark.parametrize("chunk", [5, 16, 512])
def test_logprobs_match_transformers_packed_and_chunked(
        make_engine: Callable[..., Engine], hf_model: LlamaForCausalLM,
        logits_atol: float, chunk: int) -> None:
    engine = make_engine()
    seqs = [prompt(i, n) for i, n in enumerate((1, 2, 9, 23, 4, 40))]
    batch = ScoreBatch(engine.model, seqs, chunk_tokens=chunk, block_size=4,
                       kv_cache_dtype=engine.config.kv_cache_dtype)
    steps = 1
    while not batch.advance():
        steps += 1
    assert steps == -(-batch.tokens // chunk)  # every chunk full but the last
    for ids, got in zip(seqs, batch.logprobs, strict=True):
        want = reference(hf_model, ids)
        assert got.shape == (len(ids),) and np.isnan(got[0])
        np.testing.assert_allclose(got[1:], want[1:], atol=2 * logits_atol, rtol=0)


def test_scoring_beside_decodes_changes_no_output(make_engine: Callable[..., Engine]) -> None:
    alone_engine = make_engine()
    seq = alone_engine.add(prompt(7, 20), GREEDY)
    while alone_engine.has_work():
        alone_engine.step()

    events: list[str] = []

    async def together() -> tuple[list[int], list[np.ndarray]]:
        engine = AsyncEngine(make_engine(max_batch_tokens=8)).start()
        try:
            async def generate() -> list[int]:
                out: list[int] = []
                async for o in engine.generate(prompt(7, 20), GREEDY):
                    events.append("token")
                    out = o.seq.output_ids
                return out

            async def score() -> list[np.ndarray]:
                scored = await engine.score([prompt(1, 60), [5]])  # 8 chunks of 8 tokens
                events.append("scored")
                return scored
            return await asyncio.gather(generate(), score())
        finally:
            engine.close()

    output, scored = asyncio.run(together())
    assert output == seq.output_ids
    assert [len(s) for s in scored] == [60, 1]
    # one chunk a step: the decode got its first tokens while the scoring went on
    assert events.index("scored") > events.index("token")


def test_bad_score_calls_are_refused(make_engine: Callable[..., Engine]) -> None:
    async def call(seqs: list[list[int]], **kwargs: int) -> None:
        engine = AsyncEngine(make_engine(), **kwargs).start()  # type: ignore[arg-type]
        try:
            await engine.score(seqs)
        finally:
            engine.close()

    with pytest.raises(ValueError, match="at least one token"):
        asyncio.run(call([[3], []]))
    with pytest.raises(PromptTooLong, match="at most 10 a call"):
        asyncio.run(call([prompt(0, 6), prompt(1, 6)], max_score_tokens=10))
    with pytest.raises(PromptTooLong, match="512 a text"):
        asyncio.run(call([prompt(0, 600)], max_score_tokens=10_000))
