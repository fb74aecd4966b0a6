"""How sure a comparison of STS scores is, from the test sets and from the seeds (scipy.stats).

- **One run, its test pairs** (``task_interval``): a task's Spearman x100 with a percentile
  bootstrap confidence interval over its sentence pairs (Efron and Tibshirani, 1993, Ch. 13), the
  pairs resampled with their gold scores (``scipy.stats.bootstrap``, paired).
- **Two checkpoints, the same pairs** (``paired_pairs``): the difference of their Spearman on each
  resample of the pairs, both scored on the same resample (a paired bootstrap, as Koehn, 2004, does
  for MT metrics): its interval, and a two-sided p-value from the bootstrap distribution shifted to
  the null (Efron and Tibshirani, 1993, Sec. 16.4): the share of resampled differences at least as
  far from the observed one as the observed one is from 0.
- **Two configurations, their seeds** (``across_seeds``): with the same seeds, the per-seed
  differences, their mean, a bootstrap interval of the mean, and the exact paired permutation
  (sign-flip) p-value over all 2^N sign assignments (``scipy.stats.permutation_test``); with other
  seeds, Welch's unpaired t-test (``scipy.stats.ttest_ind``, unequal variances) and an unpaired
  bootstrap interval of the difference of means, and the result says it is unpaired.
- **Several tasks** (``holm``): Holm's (1979) step-down correction of the tasks' p-values, which
  scipy lacks (its ``false_discovery_control`` controls the false discovery rate, not the
  family-wise error).

Every resampling draws from ``numpy.random.default_rng(seed)``: the same inputs and seed give the
same interval. No Ray or MLflow.
"""

from __future__ import annotations

import dataclasses

import numpy as np

LEVEL = 0.95
RESAMPLES = 1000
ALPHA = 0.05


def ranks(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``scipy.stats.rankdata(x, axis=axis)`` (ties get their average rank), from one sort per row:
    rankdata sorts again for its ties and costs 5x more on a bootstrap's resamples, where every
    resampled pair appears several times."""
    x = np.moveaxis(np.asarray(x, float), axis, -1)
    n = x.shape[-1]
    order = np.argsort(x, axis=-1, kind="stable")
    s = np.take_along_axis(x, order, -1)
    first = np.ones(s.shape, bool)
    first[..., 1:] = s[..., 1:] != s[..., :-1]
    last = np.ones(s.shape, bool)
    last[..., :-1] = first[..., 1:]
    pos = np.broadcast_to(np.arange(n), s.shape)
    start = np.maximum.accumulate(np.where(first, pos, 0), axis=-1)
    end = np.flip(np.minimum.accumulate(np.flip(np.where(last, pos, n - 1), -1), axis=-1), -1)
    out = np.empty(s.shape)
    np.put_along_axis(out, order, (start + end) / 2 + 1, -1)
    return np.moveaxis(out, -1, axis)


def spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman's rho along ``axis`` (ranks with ties averaged, then Pearson), vectorised over the
    other axes: ``scipy.stats.spearmanr``'s value for each row."""
    rx, ry = ranks(x, axis), ranks(y, axis)
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    return (rx * ry).sum(axis=axis) / np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate with its ``level`` confidence interval; ``p`` (against no difference) and ``n``
    (the pairs or seeds it rests on) where they apply."""

    estimate: float
    low: float
    high: float
    n: int
    p: float | None = None
    method: str = ""
    level: float = LEVEL
    draws: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)  # the bootstrap's, where kept

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high


class ResampledSpearman:
    """Spearman x100 of columns against ``gold`` on bootstrap resamples given as index arrays
    (what ``scipy.stats.bootstrap`` draws when its data is ``arange(n)``), without sorting each
    resample: a resample is its multiplicities ``m`` (how often each pair was drawn), an element's
    rank in it is the count of drawn values below it plus half its tie group's (ties averaged, as
    ``scipy.stats.rankdata``), and the Pearson correlation of those ranks is weighted by ``m``
    (the ranks' mean is ``(n + 1) / 2`` on every resample). Equal to ``spearman`` on the resampled
    values (``tests/platform/test_uncertainty.py``), at a fraction of the cost."""

    def __init__(self, gold: np.ndarray):
        self.n = len(gold)
        self.gold = self._groups(np.asarray(gold, float))

    @staticmethod
    def _groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        values, group = np.unique(x, return_inverse=True)
        return group, np.argsort(group, kind="stable"), len(values)

    def _ranks(self, m: np.ndarray, groups: tuple[np.ndarray, np.ndarray, int]) -> np.ndarray:
        group, _, k = groups
        rows = m.shape[0]
        sizes = np.bincount((group[None, :] + k * np.arange(rows)[:, None]).ravel(), weights=m.ravel(),
                            minlength=rows * k).reshape(rows, k)
        before = np.cumsum(sizes, axis=1) - sizes
        return (before + (sizes + 1) / 2)[:, group]

    def multiplicities(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_2d(idx)
        rows = idx.shape[0]
        return np.bincount((idx + self.n * np.arange(rows)[:, None]).ravel(), minlength=rows * self.n).reshape(rows, self.n)

    def __call__(self, sims: np.ndarray, m: np.ndarray, ry: np.ndarray | None = None) -> np.ndarray:
        """``(rows,)``: Spearman x100 of ``sims`` against the gold scores on each resample ``m``
        (``ry``: the gold's centred ranks on them, ``ranks_gold(m)``, when already made)."""
        rx = self._ranks(m, self._groups(np.asarray(sims, float))) - (self.n + 1) / 2
        ry = self.ranks_gold(m) if ry is None else ry
        return 100 * (m * rx * ry).sum(1) / np.sqrt((m * rx * rx).sum(1) * (m * ry * ry).sum(1))

    def ranks_gold(self, m: np.ndarray) -> np.ndarray:
        return self._ranks(m, self.gold) - (self.n + 1) / 2


def _bootstrap(statistic, n: int, seed: int, resamples: int, level: float):
    """``scipy.stats.bootstrap`` over the pair indices ``arange(n)``: the statistic gets index arrays."""
    from scipy.stats import bootstrap

    return bootstrap((np.arange(n),), statistic, vectorized=True, n_resamples=resamples, confidence_level=level,
                     method="percentile", rng=np.random.default_rng(seed))


def task_interval(sims: np.ndarray, gold: np.ndarray, seed: int, resamples: int = RESAMPLES,
                  level: float = LEVEL) -> Interval:
    """One task's Spearman x100 and its percentile bootstrap interval over the pairs."""
    rho = ResampledSpearman(gold)
    res = _bootstrap(lambda idx, axis=-1: rho(sims, rho.multiplicities(idx)), len(gold), seed, resamples, level)
    return Interval(float(100 * spearman(np.asarray(sims, float), np.asarray(gold, float))),
                    float(res.confidence_interval.low), float(res.confidence_interval.high), len(gold),
                    method="bootstrap over pairs", level=level)


def paired_pairs(sims_a: np.ndarray, sims_b: np.ndarray, gold: np.ndarray, seed: int, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Interval:
    """Spearman x100 of A minus B on the same pairs, its paired bootstrap interval and p-value."""
    rho = ResampledSpearman(gold)

    def delta(idx, axis=-1):
        m = rho.multiplicities(idx)
        ry = rho.ranks_gold(m)
        return rho(sims_a, m, ry) - rho(sims_b, m, ry)

    a, b, g = (np.asarray(x, float) for x in (sims_a, sims_b, gold))
    observed = float(100 * (spearman(a, g) - spearman(b, g)))
    res = _bootstrap(delta, len(gold), seed, resamples, level)
    shifted = np.abs(res.bootstrap_distribution - observed) >= abs(observed)
    p = float((shifted.sum() + 1) / (len(shifted) + 1))  # the resamples and the observed one
    return Interval(observed, float(res.confidence_interval.low), float(res.confidence_interval.high), len(gold), p,
                    "paired bootstrap over pairs", level, res.bootstrap_distribution)


def across_seeds(a: dict[int, float], b: dict[int, float], seed: int, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Interval:
    """A minus B from their seeds' scores (``seed -> score``): paired by seed when both ran the
    same seeds (sign-flip permutation p, exact), else unpaired (Welch)."""
    from scipy.stats import bootstrap, permutation_test, ttest_ind

    rng = np.random.default_rng(seed)
    if set(a) == set(b) and len(a) >= 2:
        d = np.array([a[s] - b[s] for s in sorted(a)])
        exact = 2 ** len(d) <= 100_000
        p = permutation_test((d,), np.mean, permutation_type="samples", vectorized=False, alternative="two-sided",
                             n_resamples=np.inf if exact else 100_000, rng=rng).pvalue
        low, high = _interval(bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=level,
                                        method="percentile", rng=rng), d.mean())
        return Interval(float(d.mean()), low, high, len(d), float(p),
                        f"paired by seed: {'exact ' if exact else ''}sign-flip permutation", level)
    x, y = np.array(list(a.values()), float), np.array(list(b.values()), float)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"an unpaired comparison needs at least 2 seeds on each side, got {len(x)} and {len(y)}")
    p = ttest_ind(x, y, equal_var=False).pvalue
    low, high = _interval(bootstrap((x, y), lambda u, v, axis=-1: u.mean(axis) - v.mean(axis), vectorized=True,
                                    n_resamples=resamples, confidence_level=level, method="percentile", rng=rng),
                          x.mean() - y.mean())
    return Interval(float(x.mean() - y.mean()), low, high, len(x) + len(y), float(p),
                    "unpaired (other seeds): Welch's t-test", level)


def mean_interval(values: list[float], seed: int, resamples: int = RESAMPLES, level: float = LEVEL) -> Interval:
    """The mean of a configuration's seeds' scores and its bootstrap interval: what a published
    number is checked against (``platform.report --against published``)."""
    from scipy.stats import bootstrap

    x = np.asarray(values, float)
    if len(x) < 2:
        return Interval(float(x.mean()), float("nan"), float("nan"), len(x), method="one seed: no interval", level=level)
    low, high = _interval(bootstrap((x,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
                                    rng=np.random.default_rng(seed)), x.mean())
    return Interval(float(x.mean()), low, high, len(x), method="bootstrap over seeds", level=level)


def _interval(res, centre: float) -> tuple[float, float]:
    """The bootstrap's interval; a degenerate one (every resample equal) is the point itself."""
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (low, high) if np.isfinite(low) and np.isfinite(high) else (float(centre), float(centre))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's (1979) step-down adjusted p-values: the k-th smallest of m multiplied by m - k + 1,
    kept monotone, capped at 1. Significant at ``ALPHA`` after correction where the adjusted p < ALPHA."""
    order = sorted(pvalues, key=pvalues.get)
    adjusted, running = {}, 0.0
    for k, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * pvalues[name]))
        adjusted[name] = running
    return {name: adjusted[name] for name in pvalues}
