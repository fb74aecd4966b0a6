"""Reference numbers of SentEval's own classifier engine, for ``tests/platform/evaluation/test_transfer.py``.

It also records the order in which SentEval's task classes hand each task's sentences to the
encoder (its folds are drawn over that order).

The cases are small synthetic embedding sets (seeded, so the test rebuilds the same arrays) for
each of SentEval's three protocols. ``record`` runs SentEval's ``InnerKFoldClassifier``,
``KFoldClassifier`` and ``SplitClassifier`` on them, unchanged, in the "test" setting SimCSE and
AugCSE use (PyTorch logistic regression) and with ``usepytorch: False`` (scikit-learn), and writes
what they return::

    git clone https://github.com/facebookresearch/SentEval /tmp/SentEval
    python -m tests.senteval_reference record /tmp/SentEval tests/fixtures/senteval_reference.json \
        $PLATFORM_DATA_DIR/downstream

SentEval is written for a GPU and Python < 3.11; the run keeps its code as it is and only maps its
CUDA calls to the CPU (``.cuda()`` returns the tensor, ``torch.device('cuda')`` is the CPU) and
restores ``inspect.getargspec``. Everything runs on one thread, as the project's engine does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).parent / "fixtures" / "senteval_reference.json"
TEST_SETTING = {"nhid": 0, "optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4}


def _blobs(rng: np.random.RandomState, n: int, d: int, classes: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes whose means overlap, so the L2 grid and early stopping matter. The sets are
    small to keep the test fast: SentEval's PyTorch classifier then takes only a few Adam steps
    (lr 1e-3) between its early-stopping checks and stops near its initialisation, which every fit
    shares (seed 1111), so its accuracies here sit near or below chance while scikit-learn's do not.
    What the test checks is that the project's engine returns SentEval's numbers exactly."""
    y = np.arange(n) % classes
    means = rng.normal(size=(classes, d)) * spread
    x = (means[y] + rng.normal(size=(n, d))).astype(np.float32)
    return x, y.astype(np.int64)


def cases() -> dict[str, dict]:
    """name -> protocol and arrays (the same on every call)."""
    rng = np.random.RandomState(7)
    x, y = _blobs(rng, 160, 12, 2, 0.45)
    x6, y6 = _blobs(rng, 240, 10, 6, 0.7)
    split = _blobs(rng, 320, 12, 2, 0.35)
    return {
        "inner_kfold": {"nclasses": 2, "x": x, "y": y},
        "kfold": {"nclasses": 6, "train": (x6[:180], y6[:180]), "test": (x6[180:], y6[180:])},
        "split": {"nclasses": 2, "train": (split[0][:200], split[1][:200]), "dev": (split[0][200:260], split[1][200:260]),
                  "test": (split[0][260:], split[1][260:])},
    }


def _senteval_on_cpu(senteval_dir: str):
    import inspect
    import types

    import torch

    torch.set_num_threads(1)
    if not hasattr(inspect, "getargspec"):
        inspect.getargspec = inspect.getfullargspec
    torch.nn.Module.cuda = lambda self, device=None: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    sys.path.insert(0, senteval_dir)
    import senteval.tools.classifier as classifier
    import senteval.tools.validation as validation

    class CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    proxy = CpuTorch("torch")
    proxy.device = lambda *args, **kwargs: torch.device("cpu")
    proxy.cuda = types.SimpleNamespace(FloatTensor=torch.FloatTensor, manual_seed=lambda seed: None)
    classifier.torch = proxy
    return validation


def text_digest(texts) -> str:
    import hashlib

    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def senteval_order(downstream: str) -> dict[str, str]:
    """task -> digest of the sentences in the order SentEval's task class hands them to the
    batcher (it sorts each set before encoding; its folds are drawn over that order)."""
    import senteval

    tasks = {"MR": (senteval.binary.MREval, "MR"), "CR": (senteval.binary.CREval, "CR"),
             "SUBJ": (senteval.binary.SUBJEval, "SUBJ"), "MPQA": (senteval.binary.MPQAEval, "MPQA"),
             "SST2": (senteval.sst.SSTEval, "SST/binary"), "TREC": (senteval.trec.TRECEval, "TREC"),
             "MRPC": (senteval.mrpc.MRPCEval, "MRPC")}
    digests = {}
    for name, (task_class, folder) in tasks.items():
        seen: list[str] = []

        def batcher(params, batch, seen=seen):
            seen.extend(" ".join(tokens) for tokens in batch)
            return np.zeros((len(batch), 1), dtype=np.float32)

        params = type("Params", (), {"batch_size": 128, "usepytorch": False, "classifier": TEST_SETTING,
                                     "nhid": 0, "kfold": 2})()
        task_class(str(Path(downstream) / folder)).run(params, batcher)
        digests[name] = text_digest(seen)
        print(name, len(seen), flush=True)
    return digests


def record(senteval_dir: str, out: str, downstream: str) -> None:
    validation = _senteval_on_cpu(senteval_dir)
    results = {"order": senteval_order(downstream)}
    for usepytorch, name in ((True, "pytorch"), (False, "sklearn")):
        for case, data in cases().items():
            config = {"nclasses": data["nclasses"], "seed": 1111, "usepytorch": usepytorch,
                      "classifier": TEST_SETTING, "nhid": 0, "kfold": 10}
            if case == "inner_kfold":
                dev, test = validation.InnerKFoldClassifier(data["x"], data["y"], config).run()
            elif case == "kfold":
                (xtr, ytr), (xte, yte) = data["train"], data["test"]
                dev, test, _ = validation.KFoldClassifier({"X": xtr, "y": ytr}, {"X": xte, "y": yte}, config).run()
            else:
                X = {"train": data["train"][0], "valid": data["dev"][0], "test": data["test"][0]}
                Y = {"train": data["train"][1], "valid": data["dev"][1], "test": data["test"][1]}
                dev, test = validation.SplitClassifier(X, Y, config).run()
            results[f"{name}/{case}"] = {"dev": float(dev), "test": float(test)}
            print(name, case, dev, test, flush=True)
    Path(out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "record":
        raise SystemExit("usage: python -m tests.senteval_reference record SENTEVAL_DIR OUT.json DOWNSTREAM_DIR")
    record(sys.argv[2], sys.argv[3], sys.argv[4])
