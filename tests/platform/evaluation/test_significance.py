"""Several recipes at once (``platform.evaluation.significance`` and ``report --significance``):
Almost Stochastic Order against a direct computation and against deepsig's ``multi_aso``, Cohen's d,
rank intervals, and the report's section."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from platform.evaluation import significance

SCORES = {"simcse": [75.8, 76.3, 76.1, 75.5, 76.0], "una": [76.9, 77.2, 76.4, 77.5, 76.8],
          "san": [76.2, 75.9, 76.8, 76.5, 76.1], "vascl": [74.9, 75.6, 75.2, 75.0, 75.8]}
# deepsig 1.2.8: multi_aso(SCORES, confidence_level=0.95, num_bootstrap_iterations=5000, seed=0), by hand
# in a separate environment (deepsig is not in the lock): rows over columns.
DEEPSIG = np.array([[1.0, 0.9995, 1.0, 0.0318],
                    [0.0073, 1.0, 0.0557, 0.0],
                    [0.1941, 1.0, 1.0, 0.0],
                    [1.0, 1.0, 1.0, 1.0]])


def slow_violation_ratio(a, b, dt=significance.DT):
    """ε_W2 (Dror et al., 2019, Eq. 4-5) by a loop over the grid, the quantile function written out."""
    def quantile(scores, t):
        ordered = sorted(scores)
        k = int(np.ceil(len(ordered) * t))
        return ordered[min(max(k - 1, 0), len(ordered) - 1)]

    total = violated = 0.0
    for i, t in enumerate(np.arange(dt, 1, dt)):
        f, g = quantile(a, t), quantile(b, t)
        total += (g - f) ** 2 * dt
        if f < g and i > 0:
            violated += (g - f) ** 2 * dt
    return violated / total


def test_the_violation_ratio_equals_a_direct_computation():
    for a, b in [(SCORES["una"], SCORES["simcse"]), (SCORES["san"], SCORES["una"]), (SCORES["vascl"], SCORES["san"])]:
        assert significance.violation_ratio(np.array(a), np.array(b)) == pytest.approx(slow_violation_ratio(a, b))
    assert significance.violation_ratio(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.5  # equal: no order


def test_the_aso_matrix_equals_deepsigs_multi_aso():
    ours = significance.aso_matrix(SCORES, resamples=5000, seed=0)
    assert np.abs(ours - DEEPSIG).max() < 0.02, ours


def test_cohens_d_and_rank_intervals():
    a, b = SCORES["una"], SCORES["simcse"]
    pooled = np.sqrt(((len(a) - 1) * np.var(a, ddof=1) + (len(b) - 1) * np.var(b, ddof=1)) / (len(a) + len(b) - 2))
    assert significance.cohens_d(a, b) == pytest.approx((np.mean(a) - np.mean(b)) / pooled)
    ranks = significance.rank_intervals(SCORES, seed=0)
    assert {n: r[0] for n, r in ranks.items()} == {"una": 1, "san": 2, "simcse": 3, "vascl": 4}
    assert all(lo <= rank <= hi for rank, lo, hi in ranks.values())
    close = significance.rank_intervals({"a": [76.0, 76.5, 75.5], "b": [76.1, 75.6, 76.6]}, seed=0)
    assert close["a"][1:] == (1, 2) and close["b"][1:] == (1, 2)  # indistinguishable: either rank


def test_the_report_section_names_every_pair_and_the_seeds_a_claim_needs():
    from platform.report import significance_section

    rows = [{"recipe": n, "backbone": "bert-base-uncased", "seed averages": dict(enumerate(v))}
            for n, v in {"simcse": [75.5, 76.0, 76.5], "una": [76.5, 77.0, 77.5], "san": [76.0, 76.5, 77.0]}.items()]
    rows.append({"recipe": "vascl", "backbone": "roberta-base", "seed averages": {1: 75.0}})
    text = "\n".join(significance_section(pd.DataFrame(rows)))
    assert "| ε_min | simcse | una | san |" in text and "| simcse − una |" in text and "| una − san |" in text
    assert "Holm over every pair" in text and "Cohen's d" in text and "Ranks by mean" in text
    assert "with σ = 0.50" in text and "needs 17 seeds per recipe" in text
    assert "roberta-base: fewer than two recipes with 3 or more seeds" in text
