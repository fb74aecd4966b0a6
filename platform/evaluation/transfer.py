"""SentEval transfer tasks: a classifier on frozen sentence embeddings (SimCSE, Appendix B; AugCSE,
Sec. 4.3), run as SentEval runs them so the numbers compare with the papers' tables.

Data, as SentEval's task classes read it: every line of MR, CR, SUBJ, MPQA (latin-1, empty lines
kept: CR has 3,775 sentences) and TREC (latin-1, the 6 coarse classes), SST2 and MRPC (utf-8) is
split on white space and re-joined with single spaces (what SimCSE's batcher encodes), and each
set is sorted by (number of tokens, label) (MRPC: tokens of A, of B, label). The order matters:
SentEval's folds are drawn over it. Labels: MR, CR, MPQA positive = 1, SUBJ objective = 1; TREC
ABBR, DESC, ENTY, HUM, LOC, NUM = 0..5. MRPC pairs are [|u - v| ; u * v].

Protocols and classifiers: ``platform.evaluation.classifier`` (inner 10-fold for MR, CR, SUBJ,
MPQA; 10-fold on train for TREC and MRPC; train/dev/test for SST2). The score is the test accuracy
x100 (SentEval's ``acc``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np

from platform.data import data_dir
from platform.errors import DataError
from platform.evaluation.classifier import ClassifierConfig, TransferScore, default_jobs, inner_kfold, kfold, split

TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
BINARY = {
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")

Embed = Callable[[list[str]], np.ndarray]


def _read(path: Path, encoding: str) -> list[str]:
    if not path.is_file():
        raise DataError(f"missing {path} (SentEval layout under $PLATFORM_DATA_DIR/downstream)")
    return path.read_bytes().decode(encoding).splitlines()


def binary_task(task: str, root: Path) -> tuple[list[str], np.ndarray]:
    """Sentences and labels of MR, CR, SUBJ or MPQA in SentEval's order."""
    pos, neg = ([line.split() for line in _read(root / f, "latin-1")] for f in BINARY[task])
    rows = sorted(zip(pos + neg, [1] * len(pos) + [0] * len(neg)), key=lambda r: (len(r[0]), r[1]))
    return [" ".join(t) for t, _ in rows], np.array([label for _, label in rows], dtype=np.int64)


def sst2(root: Path, part: str) -> tuple[list[str], np.ndarray]:
    rows = []
    for line in _read(root / "SST" / "binary" / f"sentiment-{part}", "utf-8"):
        text, label = line.strip().split("\t")
        rows.append((text.split(), int(label)))
    rows.sort(key=lambda r: (len(r[0]), r[1]))
    return [" ".join(t) for t, _ in rows], np.array([label for _, label in rows], dtype=np.int64)


def trec(root: Path, name: str) -> tuple[list[str], np.ndarray]:
    rows = []
    for line in _read(root / "TREC" / name, "latin-1"):
        target, sample = line.strip().split(":", 1)
        if target not in TREC_CLASSES:
            raise DataError(f"{root / 'TREC' / name}: unknown class {target!r}")
        rows.append((sample.split(" ", 1)[1].split(), TREC_CLASSES.index(target)))
    rows.sort(key=lambda r: (len(r[0]), r[1]))
    return [" ".join(t) for t, _ in rows], np.array([label for _, label in rows], dtype=np.int64)


def mrpc(root: Path, part: str) -> tuple[list[str], list[str], np.ndarray]:
    rows = []
    for line in _read(root / "MRPC" / f"msr_paraphrase_{part}.txt", "utf-8")[1:]:  # the header
        fields = line.strip().split("\t")
        rows.append((fields[3].split(), fields[4].split(), int(fields[0])))
    rows.sort(key=lambda r: (len(r[0]), len(r[1]), r[2]))
    return [" ".join(a) for a, _, _ in rows], [" ".join(b) for _, b, _ in rows], np.array([r[2] for r in rows])


def _slice(n: int, limit: int | None) -> np.ndarray:
    """A seeded subset of ``limit`` rows in their original order (tests, smoke runs)."""
    if not limit or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).permutation(n)[:limit])


@dataclasses.dataclass
class TaskFeatures:
    """A task's embedded data: ``parts`` maps ``all`` (inner k-fold), ``train``/``test`` (k-fold)
    or ``train``/``dev``/``test`` (split) to (features, labels)."""

    protocol: str
    nclasses: int
    parts: dict[str, tuple[np.ndarray, np.ndarray]]


def task_features(task: str, embed: Embed, root: Path | None = None, limit: int | None = None) -> TaskFeatures:
    """Embed one task's sentences. ``limit``: a seeded slice of the training data."""
    root = data_dir(root) / "downstream"
    if task in BINARY:
        texts, labels = binary_task(task, root)
        rows = _slice(len(texts), limit)
        return TaskFeatures("inner_kfold", 2, {"all": (embed([texts[i] for i in rows]), labels[rows])})
    if task == "SST2":
        (xtr, ytr), dev, test = (sst2(root, part) for part in ("train", "dev", "test"))
        rows = _slice(len(xtr), limit)
        return TaskFeatures("split", 2, {"train": (embed([xtr[i] for i in rows]), ytr[rows]),
                                         "dev": (embed(dev[0]), dev[1]), "test": (embed(test[0]), test[1])})
    if task == "TREC":
        (xtr, ytr), (xte, yte) = trec(root, "train_5500.label"), trec(root, "TREC_10.label")
        rows = _slice(len(xtr), limit)
        return TaskFeatures("kfold", 6, {"train": (embed([xtr[i] for i in rows]), ytr[rows]), "test": (embed(xte), yte)})
    if task == "MRPC":
        (a_tr, b_tr, ytr), (a_te, b_te, yte) = mrpc(root, "train"), mrpc(root, "test")
        rows = _slice(len(ytr), limit)

        def pairs(a, b):
            u, v = embed(a), embed(b)
            return np.c_[np.abs(u - v), u * v]

        return TaskFeatures("kfold", 2, {"train": (pairs([a_tr[i] for i in rows], [b_tr[i] for i in rows]), ytr[rows]),
                                         "test": (pairs(a_te, b_te), yte)})
    raise DataError(f"unknown transfer task {task!r}; choose from {', '.join(TRANSFER_TASKS)}")


def task_sentences(task: str, root: Path | None = None, limit: int | None = None) -> list[str]:
    """Every sentence ``task_features`` embeds for ``task``, in its order (to encode them ahead,
    once across tasks)."""
    seen: list[str] = []

    def record(texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return np.zeros((len(texts), 1), dtype=np.float32)

    task_features(task, record, root, limit)
    return seen


def score_task(features: TaskFeatures, classifier: str = "pytorch", jobs: int | None = None) -> TransferScore:
    """SentEval's protocol for the task; ``jobs`` processes fit a grid's classifiers in parallel
    (default: one per CPU; the result does not depend on it)."""
    cfg = ClassifierConfig(kind=classifier)
    jobs = jobs or default_jobs()
    p = features.parts
    if features.protocol == "inner_kfold":
        return inner_kfold(*p["all"], features.nclasses, cfg, jobs=jobs)
    if features.protocol == "kfold":
        return kfold(p["train"], p["test"], features.nclasses, cfg, jobs=jobs)
    return split(p["train"], p["dev"], p["test"], features.nclasses, cfg, jobs=jobs)


def evaluate_transfer(
    task: str, embed: Embed, root: Path | None = None, limit: int | None = None, classifier: str = "pytorch",
    jobs: int | None = None,
) -> float:
    """Test accuracy x100 of one task (SentEval's ``acc``)."""
    return score_task(task_features(task, embed, root, limit), classifier, jobs).test
