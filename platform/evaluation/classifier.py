"""SentEval's classifiers and validation protocols for the transfer tasks (Conneau & Kiela, 2018,
``senteval/tools``), as SimCSE (Appendix B) and AugCSE (Sec. 4.3) run them in SentEval's "test"
setting: ``usepytorch``, ``kfold: 10``, classifier ``{nhid: 0, optim: adam, batch_size: 64,
tenacity: 5, epoch_size: 4}``, seed 1111.

Classifiers
- ``pytorch`` (the default): SentEval's ``MLP`` with ``nhid = 0``, i.e. one linear layer trained
  with cross-entropy (mean over the batch) and Adam (PyTorch's defaults, lr 1e-3) whose weight decay
  is the L2 value; the layer is initialised right after ``torch.manual_seed(seed)`` and every fit
  re-seeds NumPy with ``seed``. Training runs ``epoch_size`` passes (a fresh NumPy permutation each,
  batches of 64) between evaluations on the validation data; the best model so far is kept, and
  training stops once the validation accuracy has failed to improve ``tenacity + 1`` times in
  total (SentEval never resets that count) or after ``max_epoch`` (200) passes. Without given
  validation data, the first 5% of a permutation is held out.
- ``sklearn``: ``LogisticRegression(C, random_state=seed)`` with scikit-learn's defaults.

Protocols (``senteval/tools/validation.py``); a score is ``round(100 * accuracy, 2)``
- inner k-fold (MR, CR, SUBJ, MPQA): outer ``StratifiedKFold(k, shuffle, random_state=1111)``; in
  each outer fold every L2 value is scored by the mean accuracy of an inner ``StratifiedKFold``
  (same seed) on the outer training part, the best value (first on ties) is refitted on the whole
  training part and tested on the outer fold; the result is the mean of the fold scores.
- k-fold (TREC, MRPC): every L2 value is scored by ``StratifiedKFold(k, shuffle, random_state=seed)``
  on the training set; the best is refitted on it and tested on the test set.
- split (SST2): every L2 value is trained on train and scored on dev; the best is refitted and
  tested on test.

Grids: ``pytorch``: weight decay 10^-5 ... 10^-2; ``sklearn``: C in 2^-2 ... 2^3 (inner k-fold,
split) and 2^-1 ... 2^5 (k-fold).

Engines for the PyTorch classifier: ``batched`` (the default, ``platform.evaluation.classifier_fits``) runs
all fits of a grid as one tensor program; ``serial`` runs them one at a time, as SentEval does, and
is the reference the batched engine is tested against. Every fit is independent and seeds itself,
so serial and scikit-learn fits run in parallel processes (``jobs``) with results identical to
running them one after another; each fit uses one thread.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import numpy as np
from platform.evaluation import classifier_fits

CLASSIFIERS = ("pytorch", "sklearn")
SEED = 1111


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    """SentEval's ``params['classifier']`` of the "test" setting, plus which implementation."""

    kind: str = "pytorch"
    engine: str = "batched"  # pytorch only: "batched" (platform.evaluation.classifier_fits) or "serial" (one fit at a time)
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    seed: int = SEED

    def grid(self, protocol: str) -> list[float]:
        if self.kind == "pytorch":
            return [10.0**t for t in range(-5, -1)]
        return [2.0**t for t in (range(-1, 6) if protocol == "kfold" else range(-2, 4))]


# ------------------------------------------------------------------------------------------------
# One fit


def _one_thread():
    import torch

    torch.set_num_threads(1)
    return torch


def _predict(model, x, batch_size: int):
    """Predicted classes, computed in batches as SentEval's ``score`` does."""
    import torch

    model.eval()
    with torch.no_grad():
        return torch.cat([model(x[i:i + batch_size]).max(1)[1] for i in range(0, len(x), batch_size)])


def _score(model, x, y, batch_size: int) -> float:
    return _predict(model, x, batch_size).long().eq(y).sum().item() / len(x)


def _tensors(x, y):
    import torch

    return torch.from_numpy(np.asarray(x)).float(), torch.from_numpy(np.asarray(y)).long()


def fit_pytorch(x, y, nclasses: int, l2: float, cfg: ClassifierConfig, validation=None, split: float = 0.05):
    """SentEval's ``MLP(nhid=0).fit``: returns the best model on the validation data."""
    torch = _one_thread()
    from torch import nn

    rng = np.random.RandomState(cfg.seed)  # SentEval: np.random.seed(seed) in the constructor
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = nn.Sequential(nn.Linear(x.shape[1], nclasses))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.param_groups[0]["weight_decay"] = l2
    if validation is None:
        order = rng.permutation(len(x))
        cut = int(split * len(x))
        (x, y), validation = (x[order[cut:]], y[order[cut:]]), (x[order[:cut]], y[order[:cut]])
    tx, ty = _tensors(x, y)
    vx, vy = _tensors(*validation)

    epochs, best_acc, best, misses = 0, -1.0, model, 0
    while epochs <= cfg.max_epoch:
        model.train()
        for _ in range(cfg.epoch_size):
            order = rng.permutation(len(tx))
            for i in range(0, len(tx), cfg.batch_size):
                idx = torch.from_numpy(order[i:i + cfg.batch_size]).long()
                loss = loss_fn(model(tx[idx]), ty[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        epochs += cfg.epoch_size
        acc = _score(model, vx, vy, cfg.batch_size)
        if acc > best_acc:
            best_acc, best = acc, copy.deepcopy(model)
        else:  # SentEval counts misses over the whole fit, never resetting
            if misses >= cfg.tenacity:
                break
            misses += 1
    return best


def fit_and_score(x, y, train, test, nclasses: int, l2: float, cfg: ClassifierConfig, validation=None) -> tuple:
    """Fit on rows ``train``; (accuracy, predictions) on rows ``test``. ``validation``: the rows
    early stopping watches (SentEval's scans pass the test rows, its split refit the dev rows);
    ``None``: 5% of the training rows are held out (its final k-fold fits)."""
    xte, yte = x[test], y[test]
    if cfg.kind == "sklearn":
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=l2, random_state=cfg.seed).fit(x[train], y[train])
        return model.score(xte, yte), model.predict(xte)
    val = None if validation is None else (x[validation], y[validation])
    model = fit_pytorch(x[train], y[train], nclasses, l2, cfg, validation=val)
    tx, ty = _tensors(xte, yte)
    pred = _predict(model, tx, cfg.batch_size)
    return pred.long().eq(ty).sum().item() / len(tx), pred.numpy()


# ------------------------------------------------------------------------------------------------
# The protocols


def _parallel(calls: list[tuple], jobs: int) -> list:
    """``fit_and_score`` over ``calls`` in ``jobs`` processes (1: here), results in call order.
    Each fit seeds its own generators, so the order the processes run them in does not matter.
    The PyTorch classifier's batched engine runs all of them as one program instead."""
    x, y, _, _, nclasses, _, cfg = calls[0][:7]
    if cfg.kind == "pytorch" and cfg.engine == "batched":
        fits = [classifier_fits.Probe(c[2], c[3], c[5], c[7] if len(c) > 7 else None) for c in calls]
        return classifier_fits.fit_and_score(x, y, nclasses, fits, cfg)
    if jobs <= 1 or len(calls) == 1:
        import torch

        threads = torch.get_num_threads()
        try:
            return [fit_and_score(*c) for c in calls]
        finally:
            torch.set_num_threads(threads)
    from joblib import Parallel, delayed

    return Parallel(n_jobs=jobs, backend="loky")(delayed(fit_and_score)(*c) for c in calls)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _pct(accs) -> float:
    return round(100 * float(np.mean(accs)), 2)


@dataclasses.dataclass
class TransferScore:
    dev: float  # the validation score of the chosen L2 value (mean over folds for inner k-fold)
    test: float
    predictions: np.ndarray | None = None


def inner_kfold(x, y, nclasses: int, cfg: ClassifierConfig, k: int = 10, jobs: int = 1) -> TransferScore:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA)."""
    from sklearn.model_selection import StratifiedKFold

    regs = cfg.grid("inner")
    outer = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x, y))
    inner = StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED)
    calls, shape = [], []
    for train, _ in outer:
        folds = list(inner.split(x[train], y[train]))
        shape.append(len(folds))
        calls += [(x, y, train[a], train[b], nclasses, reg, cfg, train[b]) for reg in regs for a, b in folds]
    scans = iter(_parallel(calls, jobs))
    chosen, devs = [], []
    for n in shape:
        scores = [_pct([next(scans)[0] for _ in range(n)]) for _ in regs]
        chosen.append(regs[int(np.argmax(scores))])
        devs.append(max(scores))
    tests = _parallel([(x, y, train, test, nclasses, reg, cfg) for (train, test), reg in zip(outer, chosen)], jobs)
    return TransferScore(round(float(np.mean(devs)), 2), round(float(np.mean([round(100 * a, 2) for a, _ in tests])), 2))


def kfold(train: tuple, test: tuple, nclasses: int, cfg: ClassifierConfig, k: int = 10, jobs: int = 1) -> TransferScore:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): L2 chosen by k-fold CV on train."""
    from sklearn.model_selection import StratifiedKFold

    regs = cfg.grid("kfold")
    x, y, rows_tr, rows_te = _stack(train, test)
    folds = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=cfg.seed).split(train[0], train[1]))
    scans = iter(_parallel([(x, y, a, b, nclasses, reg, cfg, b) for reg in regs for a, b in folds], jobs))
    scores = [_pct([next(scans)[0] for _ in folds]) for _ in regs]
    reg = regs[int(np.argmax(scores))]
    acc, pred = _parallel([(x, y, rows_tr, rows_te, nclasses, reg, cfg)], 1)[0]
    return TransferScore(max(scores), round(100 * acc, 2), pred)


def split(train: tuple, dev: tuple, test: tuple, nclasses: int, cfg: ClassifierConfig, jobs: int = 1) -> TransferScore:
    """SentEval's ``SplitClassifier`` (SST2): L2 chosen on dev; the refit also stops early on dev."""
    regs = cfg.grid("split")
    x, y, rows_tr, rows_dv, rows_te = _stack(train, dev, test)
    scans = _parallel([(x, y, rows_tr, rows_dv, nclasses, reg, cfg, rows_dv) for reg in regs], jobs)
    scores = [round(100 * a, 2) for a, _ in scans]
    reg = regs[int(np.argmax(scores))]
    acc, pred = _parallel([(x, y, rows_tr, rows_te, nclasses, reg, cfg, rows_dv)], 1)[0]
    return TransferScore(max(scores), round(100 * acc, 2), pred)


def _stack(*parts: tuple) -> tuple:
    """The (x, y) parts as one matrix and the row indices of each part."""
    x = np.concatenate([np.asarray(p[0]) for p in parts])
    y = np.concatenate([np.asarray(p[1]) for p in parts])
    bounds = np.cumsum([0] + [len(p[0]) for p in parts])
    return (x, y, *[np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])])
