"""Sampling on the CPU (one uniform per row, inverse CDF): the target distribution, never a
token the nucleus cut, and a seeded row that does not depend on its batch."""

from __future__ import annotations

import torch

from local_engine.sampling import categorical, sample, target_probs
from local_engine.sequence import SamplingParams


def test_draws_follow_the_target_distribution_and_respect_top_p() -> None:
    torch.manual_seed(0)
    vocab, draws = 8, 20_000
    logits = torch.randn(1, vocab) * 1.5
    params = SamplingParams(temperature=0.8, top_p=0.9)
    p = target_probs(logits, torch.tensor([0.8]), torch.tensor([0.9]))[0]
    assert (p == 0).any()  # the nucleus cut some tokens
    out = sample(logits.repeat(draws, 1), [params] * draws, [None] * draws)
    freq = torch.bincount(out, minlength=vocab).double() / draws
    assert float((freq - p).abs().sum() / 2) < 0.02  # total variation
    assert not freq[p == 0].any()


def test_edge_rows_never_pick_a_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
    for _ in range(200):
        assert categorical(probs, [None] * 3).tolist() == [1, 3, 0]


def test_a_seeded_row_is_reproducible_whatever_its_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 50)
    seeded = SamplingParams(temperature=1.0, seed=7)
    other = SamplingParams(temperature=1.0)

    def draw(rows: int) -> int:
        generators = [None] * rows
        generators[0] = torch.Generator().manual_seed(7)
        return int(sample(logits[:rows], [seeded] + [other] * (rows - 1), generators)[0])

    assert len({draw(1), draw(2), draw(3)}) == 1
