"""The engine on a tiny random Llama: exact against transformers, batching, prefix cache,
cancellation, stop strings, max_tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from local_engine.engine import Engine, PromptTooLong
from local_engine.scheduler import Scheduled
from local_engine.sequence import SamplingParams, Sequence

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 96, (n,), generator=g).tolist()


def run(engine: Engine) -> None:
    while engine.has_work():
        engine.step()


def record_logits(engine: Engine) -> list[tuple[list[int], torch.Tensor]]:
    """(the tokens a row of logits was computed from, the row) for every step's rows."""
    seen: list[tuple[list[int], torch.Tensor]] = []
    forward = engine.runner.forward

    def recording(batch: list[Scheduled]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        logits, spans = forward(batch)
        for sc, (first, count) in zip(batch, spans, strict=True):
            context = sc.seq.tokens(0, sc.start + sc.num_new - len(sc.draft))
            for j in range(count):  # row j of a verified draft also saw draft[:j]
                seen.append((context + sc.draft[:j], logits[first + j].clone()))
        return logits, spans

    engine.runner.forward = recording  # type: ignore[method-assign]
    return seen


def alone(make_engine: Callable[..., Engine], ids: list[int],
          params: SamplingParams = GREEDY) -> list[int]:
    engine = make_engine()
    seq = engine.add(ids, params)
    run(engine)
    return seq.output_ids


def test_batched_logits_match_transformers(make_engine: Callable[..., Engine],
                                           hf_model: LlamaForCausalLM,
                                           logits_atol: float) -> None:
    # Small token budget: prompts are prefilled in chunks while others decode in the same step.
    engine = make_engine(max_batch_tokens=16)
    seen = record_logits(engine)
    for i, n in enumerate((3, 17, 30, 9, 41)):
        engine.add(prompt(i, n), GREEDY)
    run(engine)
    assert len(seen) > 40
    with torch.inference_mode():
        for ids, row in seen:
            expected = hf_model(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(row.cpu(), expected, atol=logits_atol, rtol=0)


def test_requests_join_and_leave_mid_batch(make_engine: Callable[..., Engine]) -> None:
    prompts = [prompt(10 + i, 5 + 7 * i) for i in range(4)]
    lengths = [3, 12, 6, 9]
    expected = [alone(make_engine, p, SamplingParams(temperature=0, max_tokens=m,
                                                     ignore_eos=True))
                for p, m in zip(prompts, lengths, strict=True)]
    engine = make_engine(max_batch_tokens=8)
    seqs = [engine.add(prompts[0], SamplingParams(temperature=0, max_tokens=lengths[0],
                                                  ignore_eos=True))]
    batch_sizes = []
    for p, m in zip(prompts[1:], lengths[1:], strict=True):  # one joins every other step
        engine.step()
        engine.step()
        batch_sizes.append(len(engine.scheduler.running))
        seqs.append(engine.add(p, SamplingParams(temperature=0, max_tokens=m,
                                                 ignore_eos=True)))
    while engine.has_work():
        engine.step()
        batch_sizes.append(len(engine.scheduler.running))
    assert [s.output_ids for s in seqs] == expected
    assert [s.finish_reason for s in seqs] == ["length"] * 4
    assert max(batch_sizes) >= 3  # they did share steps
    assert engine.blocks.num_used == 0


def test_short_request_is_not_held_behind_a_long_prompt(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_batch_tokens=16)
    long = engine.add(prompt(1, 200), GREEDY)
    engine.step()
    short = engine.add(prompt(2, 4), GREEDY)
    engine.step()
    assert short.first_token_at is not None  # sampled in its first step
    assert long.first_token_at is None  # still prefilling, chunk by chunk


def test_a_long_prompt_is_not_starved_by_a_stream_of_short_ones(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_batch_tokens=16)
    long = engine.add(prompt(1, 120), GREEDY)
    steps = 0
    while long.first_token_at is None:
        engine.add(prompt(100 + steps, 16), SamplingParams(temperature=0, max_tokens=1))
        engine.step()  # each step a new short prompt could take the whole budget
        steps += 1
        assert steps < 200
    assert long.num_computed >= 120


def test_cancellation_frees_blocks_within_one_step(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    keep = engine.add(prompt(3, 10), GREEDY)
    gone = engine.add(prompt(4, 30), SamplingParams(temperature=0, max_tokens=200))
    engine.step()
    engine.step()
    used = engine.blocks.num_used
    held = len(gone.block_table)
    assert held > 0
    engine.abort(gone)
    assert engine.blocks.num_used == used - held
    assert gone.finish_reason == "abort"
    engine.step()
    assert gone not in engine.scheduler.running
    run(engine)
    assert keep.finish_reason == "length"
    assert engine.blocks.num_used == 0


def test_prefix_cache_hit_reuses_blocks_and_gives_identical_output(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    shared = prompt(5, 33)
    first = engine.add(shared + [7, 8], GREEDY)
    run(engine)
    cached_before = engine.blocks.num_free - len(engine.blocks.free)
    assert cached_before >= 8  # 33 tokens = 8 full blocks of 4, kept after release
    cached_blocks = set(engine.blocks.cached)
    second = engine.add(shared + [7, 8], GREEDY)
    engine.step()
    assert second.num_cached == 32
    assert set(second.block_table[:8]) <= cached_blocks
    run(engine)
    assert second.output_ids == first.output_ids
    fresh = make_engine()
    third = fresh.add(shared + [7, 8], GREEDY)
    run(fresh)
    assert third.num_cached == 0 and third.output_ids == first.output_ids
    assert engine.blocks.hit_rate > 0


def test_prefix_cache_evicts_least_recently_used(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(num_blocks=40)
    total = engine.blocks.num_blocks
    first = engine.add(prompt(6, 4 * (total - 4)), SamplingParams(temperature=0, max_tokens=1))
    run(engine)
    assert first.finish_reason == "length"
    other = engine.add(prompt(7, 4 * (total - 4)), SamplingParams(temperature=0, max_tokens=1))
    run(engine)  # needs blocks that only evicting the first prompt's cached ones frees
    assert other.finish_reason == "length"
    again = engine.add(prompt(6, 4 * (total - 4)), SamplingParams(temperature=0, max_tokens=1))
    run(engine)
    assert again.num_cached < 4 * (total - 4) - 4


def test_stop_strings_end_generation_and_are_not_returned(
        make_engine: Callable[..., Engine]) -> None:
    ids = prompt(8, 12)
    engine = make_engine()
    text = engine.decode(alone(make_engine, ids))
    stop = text[5:7]
    seq = engine.add(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                         stop=(stop, "never-seen")))
    streamed = ""
    while engine.has_work():
        for out in engine.step():
            streamed += out.text
    assert seq.finish_reason == "stop"
    assert streamed == text[:text.index(stop)]
    assert stop not in streamed


def test_max_tokens_and_eos(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    seq = engine.add(prompt(9, 6), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    run(engine)
    assert len(seq.output_ids) == 5 and seq.finish_reason == "length"
    out = alone(make_engine, prompt(9, 6))
    eos_engine = make_engine()
    eos_engine.eos = {out[2]}
    seq = eos_engine.add(prompt(9, 6), SamplingParams(temperature=0, max_tokens=12))
    run(eos_engine)
    assert seq.finish_reason == "stop" and seq.output_ids[-1] == out[2]


def test_seeded_sampling_is_reproducible(make_engine: Callable[..., Engine]) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=10, seed=42,
                            ignore_eos=True)
    ids = prompt(11, 8)
    assert alone(make_engine, ids, params) == alone(make_engine, ids, params)


def test_bad_prompts_are_rejected(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    with pytest.raises(ValueError):
        engine.add([], GREEDY)
    with pytest.raises(PromptTooLong):
        engine.add([5] * engine.max_model_len, GREEDY)


def test_preempted_sequences_recompute_and_finish(make_engine: Callable[..., Engine],
                                                  batch_invariant: bool) -> None:
    # KV for about 2 long sequences: the scheduler must preempt and recompute to finish all.
    engine = make_engine(num_blocks=60, max_num_seqs=8)
    seqs: list[Sequence] = [engine.add(prompt(20 + i, 60), SamplingParams(
        temperature=0, max_tokens=30, ignore_eos=True)) for i in range(3)]
    run(engine)
    assert engine.scheduler.num_preempted > 0
    assert all(s.finish_reason == "length" and len(s.output_ids) == 30 for s in seqs)
    assert not batch_invariant or seqs[2].output_ids == alone(make_engine, seqs[2].prompt_ids, SamplingParams(
        temperature=0, max_tokens=30, ignore_eos=True))
