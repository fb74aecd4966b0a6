"""Clustering evaluation (VaSCL, Zhang et al., Table 2 protocol): K-means on frozen sentence
embeddings with as many clusters as labels, accuracy under the best one-to-one matching of
clusters to labels (Hungarian algorithm), averaged over 10 seeds.

Offline it runs on the labelled SentEval sets in the data directory: TREC (question types, 6
coarse classes; train + test = 5,952 questions) by default; MR, CR, SUBJ, MPQA (2 classes) too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from platform.data import data_dir
from platform.errors import DataError
from platform.evaluation.transfer import BINARY  # the SentEval files of the binary sets

CLUSTER_SETS = ("TREC", "MR", "CR", "SUBJ", "MPQA")


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"missing {path} (SentEval layout under $PLATFORM_DATA_DIR/downstream)")
    return [line.strip() for line in path.read_bytes().decode("latin-1").splitlines() if line.strip()]


def load_labelled(name: str, root: Path | None = None) -> tuple[list[str], np.ndarray]:
    """Sentences and integer labels of a SentEval classification set."""
    base = data_dir(root) / "downstream"
    if name == "TREC":
        texts, labels = [], []
        for f in ("TREC/train_5500.label", "TREC/TREC_10.label"):
            for line in _lines(base / f):
                label, _, text = line.partition(" ")
                texts.append(text)
                labels.append(label.split(":")[0])  # coarse class
        classes = sorted(set(labels))
        return texts, np.array([classes.index(c) for c in labels])
    if name in BINARY:
        pos, neg = (_lines(base / f) for f in BINARY[name])
        return pos + neg, np.array([1] * len(pos) + [0] * len(neg))
    raise DataError(f"unknown clustering set {name!r}; choose from {', '.join(CLUSTER_SETS)}")


def cluster_accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the best one-to-one mapping of clusters to labels (Hungarian matching)."""
    k = int(max(predicted.max(), labels.max())) + 1
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (predicted, labels), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / len(labels))


# K-means restarts per run: the VaSCL authors' clustering evaluation uses scikit-learn's KMeans with
# its default of their time, 10 (the lowest inertia of 10 initialisations is kept).
N_INIT = 10


def kmeans_accuracy(embeddings: np.ndarray, labels: np.ndarray, seeds: int = 10, n_init: int = N_INIT) -> dict[str, float]:
    """Mean and standard deviation of the matched accuracy (x100) over K-means seeds."""
    from sklearn.cluster import KMeans

    n_clusters = int(labels.max()) + 1
    accs = [
        cluster_accuracy(KMeans(n_clusters=n_clusters, n_init=n_init, random_state=s).fit_predict(embeddings), labels)
        for s in range(seeds)
    ]
    return {"accuracy": 100.0 * float(np.mean(accs)), "std": 100.0 * float(np.std(accs))}
