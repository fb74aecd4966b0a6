"""Clustering evaluation (VaSCL, Zhang et al., Table 4 protocol): K-means on frozen sentence
embeddings with as many clusters as labels, accuracy under the best one-to-one matching of
clusters to labels (Hungarian algorithm), mean and standard deviation over 10 seeds.

The paper's eight short-text sets (AgNews, SearchSnippets, StackOverflow, Biomedical,
GoogleNews-TS/-T/-S, Tweet; ``python -m platform.data fetch clustering`` puts them in
``<data>/clustering/<name>.tsv``) are embedded as the authors' ``DownstreamEval/clustering``
code does: the mean of the last layer over the attention mask, each text truncated to 64 tokens,
an empty text read as "." (their ``fillna``), whatever the model's own pooler.

Offline, the labelled SentEval sets in the data directory stand in, embedded with the model's
pooler and no truncation: TREC (question types, 6 coarse classes; train + test = 5,952
questions) by default; MR, CR, SUBJ, MPQA (2 classes) too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from platform.data import data_dir
from platform.errors import DataError
from platform.evaluation.transfer import BINARY  # the SentEval files of the binary sets

SENTEVAL_SETS = ("TREC", "MR", "CR", "SUBJ", "MPQA")
# VaSCL's Table 4 sets: their sizes and classes (Zhang et al., Table 4; SCCL's Table 1).
PAPER_SETS = {"AgNews": (8000, 4), "SearchSnippets": (12340, 8), "StackOverflow": (20000, 20),
              "Biomedical": (20000, 20), "GoogleNews-TS": (11109, 152), "GoogleNews-T": (11108, 152),
              "GoogleNews-S": (11108, 152), "Tweet": (2472, 89)}
CLUSTER_SETS = (*SENTEVAL_SETS, *PAPER_SETS)


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How a set's texts are embedded: ``pooler`` (None: the model's) and truncation (None: none)."""

    pooler: str | None = None
    max_len: int | None = None

    def describe(self) -> str:
        if self.pooler is None:
            return "the model's pooler, no truncation"
        return f"VaSCL authors' protocol: mean pooling, {self.max_len} tokens"


# The VaSCL authors' clustering_eval.py: masked mean of the last layer, max_length=64, truncation.
AUTHORS_PROTOCOL = Protocol(pooler="avg", max_len=64)


def protocol(name: str) -> Protocol:
    return AUTHORS_PROTOCOL if name in PAPER_SETS else Protocol()


def embed(encoder, texts: list[str], name: str, batch_size: int = 128) -> np.ndarray:
    """The embeddings of a set's texts under its protocol."""
    p = protocol(name)
    return encoder.encode(texts, batch_size=batch_size, pooler=p.pooler, max_len=p.max_len).numpy()


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"missing {path} (SentEval layout under $PLATFORM_DATA_DIR/downstream)")
    return [line.strip() for line in path.read_bytes().decode("latin-1").splitlines() if line.strip()]


def load_labelled(name: str, root: Path | None = None) -> tuple[list[str], np.ndarray]:
    """Texts and integer labels (0..K-1) of a clustering set."""
    if name in PAPER_SETS:
        return _load_paper_set(name, data_dir(root) / "clustering" / f"{name}.tsv")
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


def _load_paper_set(name: str, path: Path) -> tuple[list[str], np.ndarray]:
    """``label<TAB>text`` per line, as the public copy has them (some with CRLF or a trailing tab)."""
    if not path.is_file():
        raise DataError(f"missing {path}: python -m platform.data fetch clustering")
    texts, labels = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab or not label.strip().lstrip("-").isdigit():
            raise DataError(f"{path}:{number}: expected 'label<TAB>text' with an integer label, got {line[:60]!r}")
        texts.append(text.strip() or ".")
        labels.append(int(label))
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return texts, np.array([index[c] for c in labels])


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
    """Mean and standard deviation of the matched accuracy (x100) over K-means seeds 0..seeds-1
    (the authors' ``random_state=trial``)."""
    from sklearn.cluster import KMeans

    n_clusters = int(labels.max()) + 1
    accs = [
        cluster_accuracy(KMeans(n_clusters=n_clusters, n_init=n_init, random_state=s).fit_predict(embeddings), labels)
        for s in range(seeds)
    ]
    # The standard deviation over seeds with n - 1, as the authors' pandas ``agg("std")`` reports it.
    return {"accuracy": 100.0 * float(np.mean(accs)), "std": 100.0 * float(np.std(accs, ddof=1)) if seeds > 1 else 0.0}
