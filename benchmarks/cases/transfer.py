"""Transfer evaluation (SentEval protocol) of the packaged backbone, classifier time side by side on
the same cached embeddings: the PyTorch protocol's batched engine (the default), scikit-learn's, and
optionally the serial PyTorch engine (one fit at a time, ``--serial``), with each protocol's scores
beside the numbers SentEval's own engine gives on these embeddings.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run transfer \\
        [--tasks MR CR ...] [--jobs 2] [--serial TASK ...]

Embeddings come from the platform's embedding store (``$PLATFORM_CACHE_DIR/embeddings``), so only
the first run encodes. SentEval's numbers (``SENTEVAL``): the serial engine, which returns SentEval's
numbers exactly (tests/platform/evaluation/test_transfer.py), on the packaged backbone's embeddings.
"""

from __future__ import annotations

import argparse
import os
import time


from methods.encoder import Encoder
from platform.evaluation import classifier
from platform.evaluation.embedding_cache import EmbeddingStore
from platform.evaluation.transfer import TRANSFER_TASKS, task_features, task_sentences
from benchmarks.common import model_source
from benchmarks.harness import Bench, Case

SENTEVAL = {"MR": 76.34, "CR": 82.15, "SUBJ": 91.98, "MPQA": 87.50, "SST2": 81.27, "TREC": 90.00, "MRPC": 72.35}


def score(features, kind: str, engine: str, jobs: int):
    cfg = classifier.ClassifierConfig(kind=kind, engine=engine)
    p = features.parts
    if features.protocol == "inner_kfold":
        return classifier.inner_kfold(*p["all"], features.nclasses, cfg, jobs=jobs)
    if features.protocol == "kfold":
        return classifier.kfold(p["train"], p["test"], features.nclasses, cfg, jobs=jobs)
    return classifier.split(p["train"], p["dev"], p["test"], features.nclasses, cfg, jobs=jobs)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--pooler", default="avg")
    p.add_argument("--tasks", nargs="+", default=list(TRANSFER_TASKS))
    p.add_argument("--jobs", type=int, default=2, help="processes for scikit-learn and the serial engine")
    p.add_argument("--serial", nargs="*", default=[], help="tasks to also time with the serial PyTorch engine")


def run(args: argparse.Namespace, bench: Bench) -> None:
    store = EmbeddingStore(Encoder.from_pretrained(model_source(args.model), pooler=args.pooler), args.pooler)
    t = time.perf_counter()
    store.embed([s for task in args.tasks for s in task_sentences(task)])
    print(f"cpus={os.cpu_count()} model={args.model} pooler={args.pooler}; encoded {store.encoded} sentences "
          f"in {time.perf_counter() - t:.0f} s (the rest from the store)")
    runs = [("pytorch", "batched"), ("sklearn", "-")] + [("pytorch", "serial")] * bool(args.serial)
    print("| task | " + " | ".join(f"{k} {e} (s)" for k, e in runs) + " | "
          + " | ".join(f"{k} {e} test" for k, e in runs) + " | SentEval |")
    print("|---|" + "---|" * (2 * len(runs) + 1))
    totals = [0.0] * len(runs)
    for task in args.tasks:
        features = task_features(task, store.embed)
        times, tests = [], []
        for i, (kind, engine) in enumerate(runs):
            if engine == "serial" and task not in args.serial:
                times.append(None)
                tests.append(None)
                continue
            t = time.perf_counter()
            tests.append(score(features, kind, engine, args.jobs).test)
            times.append(time.perf_counter() - t)
            totals[i] += times[-1]
        print(f"| {task} | " + " | ".join("-" if s is None else f"{s:.1f}" for s in times) + " | "
              + " | ".join("-" if a is None else f"{a:.2f}" for a in tests) + f" | {SENTEVAL.get(task, '-')} |",
              flush=True)
    print("| all | " + " | ".join(f"{s:.1f}" for s in totals) + " |" + " |" * (len(runs) + 1))
    if totals[0]:
        bench.ratio("classifier time, scikit-learn / batched PyTorch", totals[1] / totals[0], "> 1")


CASE = Case("transfer", "SentEval's transfer tasks on a backbone's cached embeddings: the classifier's time with "
            "the batched PyTorch engine, scikit-learn's and the serial one, with each one's test scores",
            arguments, run, smoke=["--model", "tiny", "--tasks", "MRPC"],
            meaning="The batched engine fits every fold and regularisation value as one program; its scores "
                    "match SentEval's own engine on the same embeddings (tests/platform/evaluation/test_transfer.py).")
