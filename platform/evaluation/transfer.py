"""SentEval transfer tasks: logistic regression on frozen sentence embeddings (AugCSE, Tables 6-9;
SimCSE's appendix). MR, CR, SUBJ, MPQA: 10-fold cross-validation (SentEval's ``kfold: 10``);
SST2: the given train/dev/test splits (regularisation chosen on dev); TREC and MRPC: the given
train/test splits (regularisation chosen by 5-fold CV on train). MRPC pairs are represented as
[|u - v| ; u * v], as in SentEval. Classifier: scikit-learn ``LogisticRegression``; the L2 strength
C is chosen from {2^-2, ..., 2^4} (SentEval tunes its logistic regression's L2 penalty the same
way, with its own PyTorch implementation). Accuracy x100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from platform.evaluation.clustering import load_labelled
from platform.data import data_dir
from platform.errors import DataError

TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
C_GRID = [2.0**k for k in range(-2, 5)]

Embed = Callable[[list[str]], np.ndarray]


def _lines(path: Path, encoding: str = "utf-8") -> list[str]:
    if not path.is_file():
        raise DataError(f"missing {path} (SentEval layout under $PLATFORM_DATA_DIR/downstream)")
    return [line.rstrip("\n") for line in path.read_text(encoding=encoding, errors="replace").lstrip("\ufeff").splitlines() if line.strip()]


def _sst(root: Path, split: str):
    rows = [line.rsplit("\t", 1) for line in _lines(root / "SST" / "binary" / f"sentiment-{split}")]
    return [r[0].strip() for r in rows], np.array([int(r[1]) for r in rows])


def _trec(root: Path, name: str):
    texts, labels = [], []
    for line in _lines(root / "TREC" / name, encoding="latin-1"):
        label, _, text = line.partition(" ")
        texts.append(text)
        labels.append(label.split(":")[0])
    return texts, labels


def _mrpc(root: Path, split: str):
    rows = [line.split("\t") for line in _lines(root / "MRPC" / f"msr_paraphrase_{split}.txt")[1:]]
    return [r[3] for r in rows], [r[4] for r in rows], np.array([int(r[0]) for r in rows])


def _fit(x_train, y_train, c: float):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=2000).fit(x_train, y_train)


def _choose_c(x, y, folds: int = 5, seed: int = 0) -> float:
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.linear_model import LogisticRegression

    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    scores = [cross_val_score(LogisticRegression(C=c, max_iter=2000), x, y, cv=cv).mean() for c in C_GRID]
    return C_GRID[int(np.argmax(scores))]


def kfold_accuracy(x: np.ndarray, y: np.ndarray, folds: int = 10, seed: int = 0) -> float:
    """Outer k-fold test accuracy; inside each fold C is chosen by 5-fold CV on the training part."""
    from sklearn.model_selection import StratifiedKFold

    accs = []
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        c = _choose_c(x[train], y[train], seed=seed)
        accs.append(_fit(x[train], y[train], c).score(x[test], y[test]))
    return 100.0 * float(np.mean(accs))


def evaluate_transfer(task: str, embed: Embed, root: Path | None = None, limit: int | None = None) -> float:
    """Accuracy x100 of one task; ``limit`` evaluates a class-balanced slice (tests, smoke runs)."""
    root = data_dir(root) / "downstream"
    if task in ("MR", "CR", "SUBJ", "MPQA"):
        texts, labels = load_labelled(task, root.parent)
        if limit:
            idx = np.random.default_rng(0).permutation(len(texts))[:limit]
            texts, labels = [texts[i] for i in idx], labels[idx]
        return kfold_accuracy(embed(texts), labels)
    if task == "SST2":
        (xtr, ytr), (xdv, ydv), (xte, yte) = (_sst(root, s) for s in ("train", "dev", "test"))
        if limit:
            xtr, ytr = xtr[:limit], ytr[:limit]
        etr, edv, ete = embed(xtr), embed(xdv), embed(xte)
        c = max(C_GRID, key=lambda c: _fit(etr, ytr, c).score(edv, ydv))
        return 100.0 * _fit(etr, ytr, c).score(ete, yte)
    if task == "TREC":
        (xtr, ltr), (xte, lte) = _trec(root, "train_5500.label"), _trec(root, "TREC_10.label")
        classes = sorted(set(ltr))
        ytr, yte = np.array([classes.index(c) for c in ltr]), np.array([classes.index(c) for c in lte])
        if limit:
            xtr, ytr = xtr[:limit], ytr[:limit]
        etr, ete = embed(xtr), embed(xte)
        return 100.0 * _fit(etr, ytr, _choose_c(etr, ytr)).score(ete, yte)
    if task == "MRPC":
        (a_tr, b_tr, ytr), (a_te, b_te, yte) = _mrpc(root, "train"), _mrpc(root, "test")
        if limit:
            a_tr, b_tr, ytr = a_tr[:limit], b_tr[:limit], ytr[:limit]

        def features(a, b):
            u, v = embed(a), embed(b)
            return np.c_[np.abs(u - v), u * v]

        ftr, fte = features(a_tr, b_tr), features(a_te, b_te)
        return 100.0 * _fit(ftr, ytr, _choose_c(ftr, ytr)).score(fte, yte)
    raise DataError(f"unknown transfer task {task!r}; choose from {', '.join(TRANSFER_TASKS)}")
