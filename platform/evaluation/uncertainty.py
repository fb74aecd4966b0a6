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
  differences, their mean, its t-interval and the paired t-test's p (``scipy.stats.ttest_rel``);
  with other seeds, Welch's interval and test (``scipy.stats.ttest_ind``, unequal variances), and
  the result says it is unpaired. A t-interval covers at its level with 3 seeds, where a percentile
  bootstrap over 3 seeds covers about 75 %.
- **Two recipes, their seeds and the test pairs** (``two_level``): the variance of Δ in a crossed
  seeds x pairs design, in components (Searle, Casella and McCulloch, 1992, Ch. 3): the seeds'
  variance of each side's mean, plus the pairs' variance of the seeds' mean difference over
  bootstrap draws of the test pairs (the same draw for both sides; the pairs that STS-B's test split
  shares with STS12-16 drawn jointly, STS12-16 within their subsets: ``PairDesign``), less what that
  term counts again of each seed's own pair noise. Resampling seeds and pairs both would count it
  twice (it covered 0 in every simulation). The interval is Δ ± t·SE, Welch's degrees of freedom
  over the seeds, with the seeds' share of that variance.
- **A published number** (``reproduction_interval``): the prediction interval of one more run, or of
  the best of k runs for a paper that reports its best seed; ``summary_p`` for a paper's mean ± sd.
- **Several tasks** (``holm``): Holm's (1979) step-down correction of the tasks' p-values, which
  scipy lacks (its ``false_discovery_control`` controls the false discovery rate, not the
  family-wise error).

Every resampling draws from ``numpy.random.default_rng(seed)``: the same inputs and seed give the
same interval. No Ray or MLflow.
"""

from __future__ import annotations

import dataclasses
import functools

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
    seed_share: float | None = None  # of a two-level bootstrap's variance, the share the seeds alone give

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high


class ResampledSpearman:
    """Spearman x100 of columns against ``gold`` on bootstrap resamples given as index arrays
    (what ``scipy.stats.bootstrap`` draws when its data is ``arange(n)``), without sorting each
    resample: a resample is its multiplicities ``m`` (how often each pair was drawn), an element's
    rank in it is the count of drawn values below it plus half its tie group's (ties averaged, as
    ``scipy.stats.rankdata``), and the Pearson correlation of those ranks is weighted by ``m``
    (the ranks' mean is ``(size + 1) / 2`` on each resample). Equal to ``spearman`` on the resampled
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
        rx = self._ranks(m, self._groups(np.asarray(sims, float))) - self._centre(m)
        ry = self.ranks_gold(m) if ry is None else ry
        return 100 * (m * rx * ry).sum(1) / np.sqrt((m * rx * rx).sum(1) * (m * ry * ry).sum(1))

    def ranks_gold(self, m: np.ndarray) -> np.ndarray:
        return self._ranks(m, self.gold) - self._centre(m)

    @staticmethod
    def _centre(m: np.ndarray) -> np.ndarray:
        """The ranks' mean on each resample, (size + 1) / 2: a resample drawn jointly with another
        task's (``PairDesign``) need not hold as many pairs as the task has."""
        return (m.sum(1, keepdims=True) + 1) / 2


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


def across_seeds(a: dict[int, float], b: dict[int, float], level: float = LEVEL) -> Interval:
    """A minus B from their seeds' scores (``seed -> score``): a t-interval and a t-test's p (Student,
    1908; Welch, 1947), which can reject with 3 seeds where the exact sign flip cannot (its smallest
    two-sided p is 2/2^N: 6 seeds for p < .05). Paired by seed when both ran the same seeds (a seed
    fixes the data order and the initialisation on both sides): the mean of the differences d,
    d̄ ± t_{N-1} s_d / √N (``scipy.stats.ttest_rel``); else unpaired: Welch's interval and test
    (``scipy.stats.ttest_ind``, unequal variances). No resampling: no seed."""
    from scipy.stats import ttest_ind, ttest_rel

    if set(a) == set(b) and len(a) >= 2:
        x, y = (np.array([side[s] for s in sorted(a)], float) for side in (a, b))
        d = x - y
        method = "paired by seed (each seed fixes data order and initialisation on both sides): t-test"
        if np.ptp(d) == 0:  # every seed the same difference: no spread to test it against
            return Interval(float(d[0]), float(d[0]), float(d[0]), len(d), 1.0 if d[0] == 0 else 0.0, method, level)
        res = ttest_rel(x, y)
        ci = res.confidence_interval(level)
        return Interval(float(d.mean()), float(ci.low), float(ci.high), len(d), float(res.pvalue), method, level)
    x, y = np.array(list(a.values()), float), np.array(list(b.values()), float)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"an unpaired comparison needs at least 2 seeds on each side, got {len(x)} and {len(y)}")
    res = ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(level)
    low, high = (float(v) if np.isfinite(v) else float(x.mean() - y.mean()) for v in (ci.low, ci.high))
    return Interval(float(x.mean() - y.mean()), low, high, len(x) + len(y), float(res.pvalue),
                    "unpaired (other seeds): Welch's t-test", level)


@dataclasses.dataclass
class PairDesign:
    """How the 7 tasks' test pairs are drawn together in one resample: each task's strata are
    resampled within themselves (STS12-16: a year's subsets, each its own sample of the "all"
    setting's concatenation), and a pair a task shares with an earlier task (STS-B's test split
    reuses STS12-16 pairs: 60 % of it) takes that pair's draw, so the average's interval sees the
    tasks' dependence instead of treating them as independent samples."""

    sizes: dict[str, int]
    strata: dict[str, list[np.ndarray]]  # per task: index arrays, each drawn within itself
    twins: dict[str, list[tuple[np.ndarray, str, np.ndarray]]]  # task: [(its shared pairs, an earlier task, their indices there)]

    @classmethod
    def of(cls, pairs: dict) -> "PairDesign":
        """From each task's pairs (``sent1``, ``sent2`` and, where it has subsets, ``subset``: a label
        per pair), in the order given: a pair of a later task equal to one of an earlier task (the
        same two sentences, in either order) is its twin."""
        sizes, strata, twins, seen = {}, {}, {}, {}
        for task, p in pairs.items():
            n = len(p.sent1)
            sizes[task] = n
            keys = [frozenset((a, b)) for a, b in zip(p.sent1, p.sent2)]
            shared = [(i, seen[k]) for i, k in enumerate(keys) if k in seen]
            own = np.setdiff1d(np.arange(n), np.array([i for i, _ in shared], dtype=int))
            subset = getattr(p, "subset", None)
            labels = np.asarray(subset)[own] if subset is not None else np.zeros(len(own), dtype=int)
            strata[task] = [own[labels == label] for label in dict.fromkeys(labels.tolist())]
            by_source: dict[str, list[tuple[int, int]]] = {}
            for i, (source, j) in shared:
                by_source.setdefault(source, []).append((i, j))
            twins[task] = [(np.array([i for i, _ in found]), source, np.array([j for _, j in found]))
                           for source, found in by_source.items()]
            for i, k in enumerate(keys):
                seen.setdefault(k, (task, i))
        return cls(sizes, {t: [s for s in st if len(s)] for t, st in strata.items()}, twins)

    def draw(self, rng: np.random.Generator, resamples: int) -> dict[str, np.ndarray]:
        """Each task's multiplicities ``[resamples, n]`` (how often each pair was drawn)."""
        out = {}
        for task, n in self.sizes.items():
            m = np.zeros((resamples, n), dtype=np.int64)
            for stratum in self.strata[task]:
                m[:, stratum] = rng.multinomial(len(stratum), np.full(len(stratum), 1 / len(stratum)), size=resamples)
            for mine, source, theirs in self.twins[task]:
                m[:, mine] = out[source][:, theirs]
            out[task] = m
        return out


def two_level(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]], gold: dict[str, np.ndarray],
              design: PairDesign, seed: int, resamples: int = RESAMPLES, level: float = LEVEL) -> dict[str, Interval]:
    """B minus A, per task and for the average of the tasks, from each seed's cosine similarities on
    the test pairs (``a``, ``b``: one ``{task: similarities}`` per seed). The estimate is the seeds'
    mean Spearman x100 of B less A's on all pairs. SE² = s_A²/n_A + s_B²/n_B (the seeds) + V_pairs,
    V_pairs the variance over ``resamples`` draws of the pairs (``design``, one draw for both sides)
    of the seeds' mean difference, less Σ_side mean_s Var(ρ_s − ρ̄)/(k − 1) (each seed's own pair
    noise, which the seeds' term holds already), floored at 0. The interval Δ ± t_ν·SE, ν
    Welch-Satterthwaite's over the seeds; p the matching two-sided t. ``seed_share``: the seeds'
    terms over SE². ``tests/platform/evaluation/test_calibration.py`` checks a draw against a direct
    computation and the coverage by simulation."""
    from scipy.stats import t as student

    rng = np.random.default_rng(seed)
    m = design.draw(rng, resamples)
    drawn, full = {}, {}
    for task, g in gold.items():
        rho = ResampledSpearman(g)
        drawn[task] = tuple(np.stack([rho(np.asarray(s[task], float), m[task]) for s in side]) for side in (a, b))
        full[task] = tuple(np.array([100 * spearman(np.asarray(s[task], float), np.asarray(g, float)) for s in side])
                           for side in (a, b))
    tasks = list(gold)
    drawn["avg"] = tuple(np.mean([drawn[t][k] for t in tasks], axis=0) for k in (0, 1))
    full["avg"] = tuple(np.mean([full[t][k] for t in tasks], axis=0) for k in (0, 1))
    draws = {}
    for key, (ra, rb) in drawn.items():
        d = rb.mean(0) - ra.mean(0)
        # The pairs' variance of the seeds' mean difference holds each seed's own pair noise again,
        # which the seeds' variance already counts: that part (the seeds' deviations' pair variance
        # over k - 1) is taken out, leaving the recipes' own pair effects.
        within = sum((r - r.mean(0)).var(axis=1, ddof=1).mean() / (len(r) - 1) for r in (ra, rb))
        draws[key] = (d, max(float(d.var(ddof=1)) - float(within), 0.0))
    out = {}
    for key, (d, vp) in draws.items():
        fa, fb = full[key]
        estimate = float(fb.mean() - fa.mean())
        va, vb = fa.var(ddof=1) / len(fa), fb.var(ddof=1) / len(fb)
        se = float(np.sqrt(va + vb + vp))
        seeds = va ** 2 / (len(fa) - 1) + vb ** 2 / (len(fb) - 1)
        df = (va + vb + vp) ** 2 / seeds if seeds > 0 else np.inf  # the pairs' part known from many resamples
        q = float(student.ppf((1 + level) / 2, df))
        p = float(2 * student.sf(abs(estimate) / se, df)) if se > 0 else float(estimate == 0)
        n = sum(design.sizes.values()) if key == "avg" else design.sizes[key]
        out[key] = Interval(estimate, estimate - q * se, estimate + q * se, n, p,
                            f"seeds ({len(b)} and {len(a)}) and the pairs, two levels", level, d,
                            seed_share=min(1.0, float((va + vb) / se ** 2)) if se > 0 else None)
    return out


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with ``n`` paired seeds: 2 / 2^n."""
    return 2.0 / 2 ** n


def seeds_needed(sd: float, delta: float, alpha: float = ALPHA, power: float = 0.8) -> int:
    """Seeds per recipe for a two-sided two-sample t-test at ``alpha`` to detect a difference ``delta``
    with ``power`` when each side's seeds have standard deviation ``sd``: the smallest n whose power,
    from the noncentral t (noncentrality δ / (σ √(2/n)), 2n − 2 degrees of freedom), reaches it."""
    from scipy.stats import nct, t

    for n in range(2, 10_000):
        df = 2 * n - 2
        crit = t.ppf(1 - alpha / 2, df)
        shift = delta / (sd * np.sqrt(2 / n))
        if nct.sf(crit, df, shift) + nct.cdf(-crit, df, shift) >= power:
            return n
    raise ValueError(f"more than 10,000 seeds for a difference of {delta} with sd {sd}")


def reproduction_interval(values: list[float], best_of: int = 1, seed: int = 0, level: float = LEVEL,
                          draws: int = 200_000) -> Interval:
    """Where a faithful reproduction's published number falls, predicted from our seeds' scores
    x_1..x_N (mean x̄, sd s): the ``level`` prediction interval of one more run, x̄ ± t_{N-1} s √(1 + 1/N)
    (the normal-theory prediction interval; Geisser, 1993, Sec. 2.1), or, for a paper that reports the
    best of ``best_of`` = k runs, of the largest of k more runs: (M_k − x̄) / s is pivotal for normal
    seeds (its law depends on N and k only), its quantiles from ``draws`` seeded draws. With fewer
    than 3 seeds: no interval ("cannot check")."""
    from scipy.stats import t

    x = np.asarray(values, float)
    n = len(x)
    if n < 3:
        return Interval(float(x.mean()) if n else float("nan"), float("nan"), float("nan"), n,
                        method=f"cannot check: {n} seed(s), 3 needed", level=level)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    tail = (1 - level) / 2
    if best_of <= 1:
        half = float(t.ppf(1 - tail, n - 1) * sd * np.sqrt(1 + 1 / n))
        return Interval(mean, mean - half, mean + half, n, method="prediction interval of one run", level=level)
    low, high = _best_of_pivot(n, best_of, tail, seed, draws)
    return Interval(mean, mean + sd * float(low), mean + sd * float(high), n,
                    method=f"prediction interval of the best of {best_of} runs", level=level)


@functools.lru_cache(maxsize=64)
def _best_of_pivot(n: int, k: int, tail: float, seed: int, draws: int) -> tuple[float, float]:
    """The ``tail`` and ``1 - tail`` quantiles of (M_k − x̄) / s for N = ``n`` normal seeds."""
    rng = np.random.default_rng(seed)
    ours = rng.standard_normal((draws, n))
    pivot = (rng.standard_normal((draws, k)).max(axis=1) - ours.mean(axis=1)) / ours.std(axis=1, ddof=1)
    low, high = np.quantile(pivot, [tail, 1 - tail])
    return float(low), float(high)


def summary_p(values: list[float], mean: float, sd: float, n: int) -> float:
    """Welch's p for our seeds against a paper's mean ± sd over ``n`` seeds (``scipy.stats.
    ttest_ind_from_stats``): small where the two sets of runs differ."""
    from scipy.stats import ttest_ind_from_stats

    x = np.asarray(values, float)
    return float(ttest_ind_from_stats(x.mean(), x.std(ddof=1), len(x), mean, sd, n, equal_var=False).pvalue)


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's (1979) step-down adjusted p-values: the k-th smallest of m multiplied by m - k + 1,
    kept monotone, capped at 1. Significant at ``ALPHA`` after correction where the adjusted p < ALPHA.
    A p that is missing (NaN, None) stays NaN and does not count among the m."""
    finite = {name: p for name, p in pvalues.items() if p is not None and np.isfinite(p)}
    order = sorted(finite, key=finite.get)
    adjusted, running = {}, 0.0
    for k, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * finite[name]))
        adjusted[name] = running
    return {name: adjusted.get(name, float("nan")) for name in pvalues}
