"""The cost of shuffling every epoch in the Ray Data pipeline, on 1M sentences.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run shuffle [--n 1000000] [--repeats 2]

Side by side in one local Ray (all CPUs), per recipe (SimCSE: rows only; UNA: the per-epoch
negatives too), one epoch consumed as a training worker consumes it (``iter_batches`` of 64):

- before: the corpus in order in blocks, a local shuffle buffer of 4 batches (no permutation);
- now: ``epoch_datasets``, a uniform permutation of row numbers in blocks, each block's task
  gathering its rows from the corpus table in the object store.

Prints sentences/s for each and the time to build the epoch's dataset on the driver. A training
step consumes 64 sentences; the pipeline must stay well ahead of the step rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from methods.recipe import Recipe
from methods.una import fit_tfidf
from platform.data import data_dir, read_corpus
from benchmarks.harness import Bench, Case


def consume(ds, batch: int = 64, shuffle: bool = False) -> int:
    kwargs = {"local_shuffle_buffer_size": 4 * batch, "local_shuffle_seed": 0} if shuffle else {}
    n = 0
    for b in ds.iter_batches(batch_size=batch, drop_last=True, batch_format="numpy", **kwargs):
        n += len(b["sentence"])
    return n


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=2)


def run(args: argparse.Namespace, bench: Bench) -> None:
    sents: list[str] = []
    for f in sorted((data_dir() / "corpus").glob("*.txt.gz")):
        sents.extend(read_corpus(f))
    sents = (sents * (args.n // len(sents) + 1))[: args.n]
    columns = {"sentence": sents}
    from platform.data.pipeline import augment_dataset, epoch_datasets
    from platform.run.ray_env import init_ray

    init_ray()
    print(f"cpus={os.cpu_count()} sentences={len(sents):,}", flush=True)
    recipes = {"simcse": (Recipe.named("simcse"), {}), "una": (Recipe.named("una", r=min(2000, len(sents) // 3)),
                                                               {"una": fit_tfidf(sents[:200_000])})}
    for name, (recipe, states) in recipes.items():
        consume(augment_dataset(recipe, {"sentence": sents[:20_000]}, states))  # warm the worker processes
        before, now, build = [], [], []
        for _ in range(args.repeats):  # interleaved: drifts of the machine hit both
            t0 = time.perf_counter()
            n = consume(augment_dataset(recipe, columns, states), shuffle=True)
            before.append(n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            ds = epoch_datasets(recipe, columns, states, epochs=1, seed=0)["train_0"]
            t1 = time.perf_counter()
            n = consume(ds)
            now.append(n / (time.perf_counter() - t0))
            build.append(t1 - t0)
        b, w = statistics.median(before), statistics.median(now)
        print(f"{name}: before (corpus order + 4-batch buffer) {b:,.0f} sentences/s; now (uniform permutation) "
              f"{w:,.0f} sentences/s = {w / b:.2f}x; building the epoch's dataset {statistics.median(build):.2f} s; "
              f"{w / 64:,.0f} batches of 64 per second", flush=True)
        bench.ratio(f"{name}: sentences/s, uniform permutation / corpus order", w / b, ">= 0.9")


CASE = Case("shuffle", "what a uniform per-epoch permutation costs the Ray Data pipeline beside the corpus in order "
            "with a local shuffle buffer, per recipe", arguments, run, smoke=["--n", "6000", "--repeats", "1"],
            meaning="Every epoch reads the corpus in a new order from the seed; the ratio says what that costs "
                    "a training worker's batches.")
