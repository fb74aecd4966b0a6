"""Transfer evaluation (SentEval protocol) of the packaged backbone: encoding once, then each
classifier with its grid's fits in 1 process and in N processes, side by side; the scores must be
identical whatever the number of processes.

    PLATFORM_DATA_DIR=../shared/data python benchmarks/transfer_speed.py \\
        [--tasks MR CR ...] [--classifiers pytorch sklearn] [--jobs 1 2] [--cache /tmp/transfer-features]

Embeddings are cached in ``--cache`` (one .npz per task), so a second run times the classifiers only.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "platform" in sys.modules and not hasattr(sys.modules["platform"], "__path__"):
    del sys.modules["platform"]

from methods.encoder import Encoder  # noqa: E402
from platform.evaluation.transfer import TRANSFER_TASKS, score_task, task_features  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="minilm")
    p.add_argument("--pooler", default="avg")
    p.add_argument("--tasks", nargs="+", default=list(TRANSFER_TASKS))
    p.add_argument("--classifiers", nargs="+", default=["pytorch", "sklearn"])
    p.add_argument("--jobs", nargs="+", type=int, default=[1, 2])
    p.add_argument("--cache", default="/tmp/transfer-features")
    args = p.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    encoder = None
    features, encode_s = {}, 0.0
    for task in args.tasks:
        path = cache / f"{args.model}-{args.pooler}-{task}.pkl"
        if not path.is_file():
            encoder = encoder or Encoder.from_pretrained(args.model, pooler=args.pooler)
            t = time.perf_counter()
            feats = task_features(task, lambda xs, enc=encoder: enc.encode(xs, batch_size=128).numpy())
            encode_s += time.perf_counter() - t
            path.write_bytes(pickle.dumps(feats))
        features[task] = pickle.loads(path.read_bytes())
    print(f"cpus={os.cpu_count()} model={args.model} pooler={args.pooler}; encoding (this run) {encode_s:.0f} s")
    print("| classifier | task | " + " | ".join(f"{j} process(es)" for j in args.jobs) + " | speed-up | dev | test |")
    print("|---|---|" + "---|" * (len(args.jobs) + 3))
    for kind in args.classifiers:
        totals = [0.0] * len(args.jobs)
        for task in args.tasks:
            times, results = [], []
            for i, jobs in enumerate(args.jobs):
                t = time.perf_counter()
                results.append(score_task(features[task], kind, jobs))
                times.append(time.perf_counter() - t)
                totals[i] += times[-1]
            same = all((r.dev, r.test) == (results[0].dev, results[0].test) for r in results)
            assert same, f"{kind} {task}: the scores depend on the number of processes: {results}"
            print(f"| {kind} | {task} | " + " | ".join(f"{t:.1f} s" for t in times)
                  + f" | {times[0] / times[-1]:.2f}x | {results[0].dev:.2f} | {results[0].test:.2f} |", flush=True)
        print(f"| {kind} | all | " + " | ".join(f"{t:.1f} s" for t in totals) + f" | {totals[0] / totals[-1]:.2f}x | | |",
              flush=True)


if __name__ == "__main__":
    main()
