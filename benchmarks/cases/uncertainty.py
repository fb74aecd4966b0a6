"""The paired bootstrap of two checkpoints on the 7 STS tasks, from their embeddings: seconds.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run uncertainty [--resamples 1000]

The two encoders (the packaged MiniLM with two poolers: two real, correlated scorers) embed the
tasks once, outside the timing; what is timed is ``platform.compare``'s statistics on those
similarities: each task's paired bootstrap (``uncertainty.paired_pairs``) and the average's.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from benchmarks.common import model_source
from benchmarks.harness import Bench, Case
from methods.encoder import Encoder
from platform.data import SHORT_NAMES, STS_TASKS
from platform.evaluation import uncertainty
from platform.evaluation.sts import STSEvaluator


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--resamples", type=int, default=1000)


def run(args: argparse.Namespace, bench: Bench) -> None:
    ev = STSEvaluator(STS_TASKS)
    sims = {}
    for pooler in ("avg", "cls_before_pooler"):
        emb = ev.encode(Encoder.from_pretrained(model_source(args.model), pooler=pooler))
        sims[pooler] = {t: F.cosine_similarity(emb[i1].double(), emb[i2].double(), dim=-1).numpy()
                        for t, (i1, i2) in zip(ev.tasks, ev.index)}
    t0 = time.perf_counter()
    found = {t: uncertainty.paired_pairs(sims["cls_before_pooler"][t], sims["avg"][t], p.scores, seed=i,
                                         resamples=args.resamples)
             for i, (t, p) in enumerate(zip(ev.tasks, ev.pairs))}
    seconds = time.perf_counter() - t0
    print("| task | pairs | delta (cls - avg) | 95 % CI | p |")
    print("|---|---|---|---|---|")
    for t, iv in found.items():
        print(f"| {SHORT_NAMES[t]} | {iv.n} | {iv.estimate:+.2f} | [{iv.low:+.2f}, {iv.high:+.2f}] | {iv.p:.3f} |")
    pairs = sum(iv.n for iv in found.values())
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} model={args.model} "
          f"resamples={args.resamples}: {pairs} pairs, {seconds:.2f} s for the 7 tasks' paired bootstraps")
    bench.figure("seven_task_paired_bootstrap_s", seconds)
    bench.figure("pairs", pairs)


CASE = Case("uncertainty", "platform.compare's paired bootstrap of two checkpoints over the 7 STS tasks' pairs: seconds",
            arguments, run, smoke=["--model", "tiny", "--resamples", "100"],
            meaning="What a comparison of two single checkpoints costs beyond embedding them (the target: a few "
                    "seconds on 2 cores for 1,000 resamples).")
