"""Selection: the budget, the units that fit it, and the order they are written in."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.compression.select import budget, choose, ends_first


@pytest.mark.parametrize(("tokens", "ratio", "fixed", "expected"), [
    (1000, 4.0, 0, 250), (1000, 2.0, 0, 500), (1001, 4.0, 0, 250), (1000, 4.0, 100, 150),
    (1000, 4.0, 300, 0), (1000, 1.0, 0, 1000), (1000, 0.5, 0, 2000),
])
def test_the_budget_is_the_context_over_the_ratio_less_the_fixed_text(tokens, ratio, fixed,
                                                                      expected):
    assert budget(tokens, ratio, fixed) == expected


@pytest.mark.parametrize("ratio", [0.0, -2.0, math.nan, math.inf])
def test_a_ratio_that_is_not_a_positive_number_is_refused(ratio):
    with pytest.raises(ValueError, match="target_ratio"):
        budget(1000, ratio)


@pytest.mark.parametrize(("costs", "scores", "limit", "kept"), [
    ([10, 10, 10], [0.1, 0.9, 0.5], 20, [1, 2]),
    ([10, 50, 10], [0.1, 0.9, 0.5], 25, [2, 0]),  # the best is too big: skipped
    ([10, 10, 10], [0.5, 0.5, 0.5], 20, [0, 1]),  # ties: context order
    ([10, 10], [0.1, 0.9], 5, []),
    ([10, 10], [0.1, 0.9], 100, [1, 0]),
])
def test_the_most_relevant_units_that_fit_are_kept(costs, scores, limit, kept):
    assert choose(costs, np.array(scores), limit) == kept


@pytest.mark.parametrize(("ranked", "laid_out"), [
    ([], []), ([7], [7]), ([1, 2], [1, 2]), ([1, 2, 3], [1, 3, 2]),
    (["a", "b", "c", "d", "e"], ["a", "c", "e", "d", "b"]),
])
def test_the_most_relevant_sit_at_both_ends(ranked, laid_out):
    assert ends_first(ranked) == laid_out
