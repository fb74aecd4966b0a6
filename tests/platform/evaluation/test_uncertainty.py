"""The statistics behind every comparison (``platform.evaluation.uncertainty``): the fast
resampled Spearman equals scipy's on the resampled values, the bootstrap interval covers the true
value at about its nominal rate, the sign-flip p-value is exact, Holm's correction, and the same
seed gives the same interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr, ttest_ind

from platform.evaluation import uncertainty
from platform.evaluation.uncertainty import ResampledSpearman, across_seeds, holm, paired_pairs, ranks, task_interval


def test_ranks_and_the_resampled_spearman_are_scipys():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 12, size=(40, 90)).astype(float)  # many ties
    np.testing.assert_allclose(ranks(x), rankdata(x, axis=-1))
    np.testing.assert_allclose(ranks(x, axis=0), rankdata(x, axis=0))
    gold = rng.integers(0, 6, size=200) / 1.0
    sims = (gold + rng.normal(size=200)).round(1)
    rho = ResampledSpearman(gold)
    idx = rng.integers(0, 200, size=(30, 200))
    expected = [100 * spearmanr(sims[i], gold[i]).statistic for i in idx]
    np.testing.assert_allclose(rho(sims, rho.multiplicities(idx)), expected, rtol=1e-10)


def _bivariate(rng, n: int, r: float):
    x = rng.normal(size=n)
    return x, r * x + math.sqrt(1 - r * r) * rng.normal(size=n)


def test_the_bootstrap_interval_covers_the_true_spearman_at_about_its_rate():
    """Normal pairs with correlation r have Spearman 6/pi asin(r/2) (Pearson, 1907): 200 samples
    of 150 pairs, each with its 95 % interval; about 95 % of them hold it."""
    r, truth = 0.6, 100 * 6 / math.pi * math.asin(0.3)
    rng = np.random.default_rng(7)
    covered = sum(task_interval(*_bivariate(rng, 150, r)[::-1], seed=i, resamples=400).covers(truth) for i in range(200))
    assert 0.89 <= covered / 200 <= 0.99, covered


def test_the_paired_bootstrap_rejects_at_about_its_rate_under_the_null_and_sees_a_real_difference():
    """Two scorers of the same quality on the same pairs: p < 0.05 in about 5 % of 150 samples;
    a better scorer is told apart."""
    rng = np.random.default_rng(11)
    rejected = 0
    for i in range(150):
        gold = rng.normal(size=120)
        a, b = gold + rng.normal(size=120), gold + rng.normal(size=120)
        rejected += paired_pairs(a, b, gold, seed=i, resamples=400).p < 0.05
    assert rejected / 150 <= 0.11, rejected
    gold = rng.normal(size=600)
    better = paired_pairs(gold + 0.5 * rng.normal(size=600), gold + 1.5 * rng.normal(size=600), gold, seed=0)
    assert better.p < 0.01 and better.low > 0


def test_the_same_seeds_are_compared_paired_with_a_t_test():
    """Differences 1, 2, 3, 4, -0.5: their mean, its t-interval and the paired t-test's p, as scipy's."""
    from scipy.stats import ttest_rel

    a = {s: 70 + d for s, d in zip(range(5), [1, 2, 3, 4, -0.5])}
    b = {s: 70.0 + 0.1 * s for s in range(5)}
    iv = across_seeds(a, b)
    x, y = [a[s] for s in range(5)], [b[s] for s in range(5)]
    ci = ttest_rel(x, y).confidence_interval(0.95)
    assert iv.p == pytest.approx(ttest_rel(x, y).pvalue) and (iv.low, iv.high) == pytest.approx((ci.low, ci.high))
    assert iv.estimate == pytest.approx(1.9 - 0.2) and iv.method.startswith("paired by seed") and iv.n == 5


def test_other_seeds_are_compared_unpaired_with_welch():
    a, b = {1: 75.0, 2: 76.1, 3: 75.4}, {4: 74.0, 5: 74.9, 6: 73.8}
    iv = across_seeds(a, b)
    assert "unpaired" in iv.method and "Welch" in iv.method
    assert iv.p == pytest.approx(ttest_ind(list(a.values()), list(b.values()), equal_var=False).pvalue)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        across_seeds({1: 75.0}, {2: 74.0, 3: 73.0})


def test_holm_adjusts_step_down():
    # Sorted 0.01, 0.03, 0.04 times 3, 2, 1: 0.03, 0.06, then max(0.06, 0.04) = 0.06.
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.9, "b": 0.6}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_the_same_seed_gives_the_same_interval():
    rng = np.random.default_rng(3)
    gold = rng.normal(size=300)
    a, b = gold + rng.normal(size=300), gold + rng.normal(size=300)
    first, again, other = (paired_pairs(a, b, gold, seed=s) for s in (5, 5, 6))
    assert (first.low, first.high, first.p) == (again.low, again.high, again.p)
    assert (first.low, first.high) != (other.low, other.high)
    assert uncertainty.reproduction_interval([75.0, 75.2, 75.1], best_of=5, seed=1) == \
        uncertainty.reproduction_interval([75.0, 75.2, 75.1], best_of=5, seed=1)
