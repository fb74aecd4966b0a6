"""Several recipes at once, from their seeds' scores (numpy and scipy; no Ray or MLflow): which is
better than which and how sure, for a paper that compares many methods.

- **Almost Stochastic Order** (``aso``, ``aso_matrix``; Dror, Shlomov and Reichart, 2019, Eq. 4-5 and
  Sec. 3, after del Barrio et al., 2018): the violation ratio ε_W2 of two score distributions (the
  share of their squared quantile distance where A's quantile function lies below B's), and its
  upper bound ε_min at a confidence level from a bootstrap of σ. ε_min < 0.5: A is almost
  stochastically better than B. Written against ``deepsig`` 1.2.8's ``aso``/``multi_aso`` (its
  empirical quantile function, integration grid and Bonferroni adjustment of the confidence level
  over the k(k−1)/2 comparisons), with our own seeded generator.
- **Effect size** (``cohens_d``): the difference of means over the pooled seed standard deviation.
- **Rank intervals** (``rank_intervals``): each recipe's rank by mean score, with the interval of its
  rank over bootstrap resamples of every recipe's seeds.
"""

from __future__ import annotations

import numpy as np

DT = 0.005  # the integration step over quantile levels t in (0, 1), deepsig's default


def _quantiles(scores: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The empirical quantile function F⁻¹(t) = the ⌈n t⌉-th smallest score (deepsig's), for each row
    of ``scores`` (resamples x n) at levels ``t``."""
    ordered = np.sort(scores, axis=-1)
    n = ordered.shape[-1]
    index = np.clip(np.ceil(n * t).astype(int) - 1, 0, n - 1)
    return ordered[..., index]


def violation_ratio(a: np.ndarray, b: np.ndarray, dt: float = DT) -> np.ndarray:
    """ε_W2(F, G) (Dror et al., 2019, Eq. 4-5): ∫_{F⁻¹(t) < G⁻¹(t)} (F⁻¹(t) − G⁻¹(t))² dt over
    ∫ (F⁻¹(t) − G⁻¹(t))² dt, F the scores of A and G of B, rows of ``a`` and ``b`` vectorised. Equal
    distributions give 0.5. (As deepsig, the violation integral leaves out the first grid point.)"""
    t = np.arange(dt, 1, dt)
    f, g = _quantiles(np.atleast_2d(a), t), _quantiles(np.atleast_2d(b), t)
    diff = g - f
    total = (diff ** 2 * dt).sum(axis=-1)
    violated = np.where(f >= g, 0.0, diff)[..., 1:]
    ratio = np.divide((violated ** 2 * dt).sum(axis=-1), total, out=np.full(total.shape, 0.5), where=total > 0)
    return ratio if np.ndim(a) > 1 else ratio[0]


def aso(a: list[float], b: list[float], confidence: float = 0.95, comparisons: int = 1, resamples: int = 1000,
        seed: int = 0, dt: float = DT) -> tuple[float, float]:
    """(ε_min of A over B, ε_min of B over A): the violation ratio minus its one-sided bound,
    ε_W2 − σ̂ / c · Φ⁻¹(1 − γ) with c = √(n m / (n + m)) and σ̂ the standard deviation of c (ε*_W2 − ε_W2)
    over bootstrap resamples of both sides; γ Bonferroni-adjusted for ``comparisons``; clipped to [0, 1]."""
    from scipy.stats import norm

    x, y = np.asarray(a, float), np.asarray(b, float)
    if comparisons > 1:
        confidence += (1 - confidence) / comparisons
    ratio = float(violation_ratio(x, y, dt))
    rng = np.random.default_rng(seed)
    samples = violation_ratio(rng.choice(x, size=(resamples, len(x))), rng.choice(y, size=(resamples, len(y))), dt)
    const = np.sqrt(len(x) * len(y) / (len(x) + len(y)))
    bound = np.std(const * (samples - ratio)) / const * norm.ppf(1 - confidence)
    return float(np.clip(ratio - bound, 0, 1)), float(np.clip(1 - ratio - bound, 0, 1))


def aso_matrix(scores: dict[str, list[float]], confidence: float = 0.95, resamples: int = 1000,
               seed: int = 0) -> np.ndarray:
    """ε_min for every ordered pair (row over column; the diagonal 1), the confidence level
    Bonferroni-adjusted over the k(k−1)/2 pairs, as deepsig's ``multi_aso``."""
    names = list(scores)
    k = len(names)
    out = np.eye(k)
    for i in range(k):
        for j in range(i + 1, k):
            out[i, j], out[j, i] = aso(scores[names[i]], scores[names[j]], confidence, k * (k - 1) // 2, resamples,
                                       seed + i * k + j)
    return out


def cohens_d(a: list[float], b: list[float]) -> float:
    """(mean A − mean B) / s_pooled, s_pooled² = ((n−1) s_A² + (m−1) s_B²) / (n + m − 2) (Cohen, 1988)."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    pooled = np.sqrt(((len(x) - 1) * x.var(ddof=1) + (len(y) - 1) * y.var(ddof=1)) / (len(x) + len(y) - 2))
    return float((x.mean() - y.mean()) / pooled) if pooled > 0 else float("inf") * np.sign(x.mean() - y.mean())


def rank_intervals(scores: dict[str, list[float]], resamples: int = 2000, seed: int = 0,
                   level: float = 0.95) -> dict[str, tuple[int, int, int]]:
    """Each recipe's (rank by mean, lowest, highest rank in the central ``level`` of bootstrap
    resamples of each recipe's seeds); rank 1 is the best."""
    rng = np.random.default_rng(seed)
    names = list(scores)
    means = np.array([np.mean(scores[n]) for n in names])
    draws = np.stack([rng.choice(np.asarray(scores[n], float), size=(resamples, len(scores[n]))).mean(axis=1)
                      for n in names], axis=1)
    ranks = (-draws).argsort(axis=1).argsort(axis=1) + 1
    observed = (-means).argsort().argsort() + 1
    tail = (1 - level) / 2
    return {n: (int(observed[i]), int(np.floor(np.quantile(ranks[:, i], tail))),
                int(np.ceil(np.quantile(ranks[:, i], 1 - tail)))) for i, n in enumerate(names)}
