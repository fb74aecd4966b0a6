"""ESimCSE's and mined negatives' costs: mining once per corpus, and the queue's step.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run esimcse [--sizes 2000,8000,16000] [--ray] [--batch 64] [--steps 6, 0: mining only]

- mining: ``negatives=mined``'s statistics (``methods.mined.mine``: the teacher's embeddings, then
  sentence-transformers' rule; the packaged MiniLM as teacher, the defaults' range and margin) over
  the first n sentences of the corpus (its three files), for each size: seconds, sentences per
  second, per core. In one process, or with ``--ray`` as a run on Ray makes them (the embeddings
  by a pool of Ray Data actors on a local Ray of this machine's cores: the pool's overhead here;
  on a cluster the pool grows with its nodes). Encoding grows with n, the similarity search with
  n^2: the rate per sentence falls as the corpus grows.
- step: ESimCSE's step (repetition positives, the queue of 160 full, the momentum copy's forward
  and update) beside SimCSE's, same model (the packaged MiniLM) and batch, length 32, interleaved,
  median after one warm-up. Expected ~1.45: the pass's rows are 9 tokens wider (up to 9 repeated
  sub-words at length 32: 41/32 = 1.28, as in the authors' code, which pads each pair to the
  batch's longest positive), plus the momentum copy's forward without gradient over the B anchors
  (1/6 of SimCSE's forward and backward over 2B rows); target <= 1.5.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch

from benchmarks.harness import Bench, Case
from methods.encoder import Encoder
from methods.mined import MinedParams, mine
from methods.recipe import Recipe
from methods.teachers import embed_here
from platform.data import data_dir, read_corpus
from platform.data.pipeline import StepInputs


def corpus(n: int) -> list[str]:
    out: list[str] = []
    for f in sorted((data_dir() / "corpus").glob("*.txt.gz")):
        out.extend(read_corpus(f))
        if len(out) >= n:
            break
    return out[:n]


def bench_mining(sizes: list[int], on_ray: bool, bench: Bench) -> None:
    cores = torch.get_num_threads()
    embed = embed_here
    if on_ray:
        from platform.data import pipeline
        from platform.run.ray_env import init_ray

        init_ray(num_cpus=os.cpu_count())
        embed = functools.partial(pipeline.embed, use_ray=True)
    print(f"| sentences | seconds | sentences/s | per core ({cores} threads) |\n|---|---|---|---|")
    for n in sizes:
        sentences = corpus(n)
        t = time.perf_counter()
        mine(sentences, MinedParams(), embed)
        took = time.perf_counter() - t
        bench.figure(f"mining_s_{n}", took)
        print(f"| {len(sentences):,} | {took:.1f} | {len(sentences) / took:,.0f} | "
              f"{bench.figure(f'mining_per_core_{n}', len(sentences) / took / cores):,.0f} |", flush=True)


def bench_step(batch: int, steps: int, bench: Bench) -> None:
    sentences = corpus(batch * (steps + 1))
    torch.manual_seed(0)
    methods = {"simcse": Recipe.named("simcse"), "esimcse": Recipe.named("esimcse")}
    models, optimizers, inputs = {}, {}, {}
    for name, method in methods.items():
        models[name] = method.build(Encoder.from_pretrained("minilm"))
        optimizers[name] = torch.optim.AdamW(method.param_groups(models[name], 1e-5))
        inputs[name] = StepInputs(method, "minilm", 32)
    state = models["esimcse"].states["momentum_queue"]
    state.push(torch.randn(state.queue.shape))  # the queue full, as from the third step of batch 64 on
    times: dict[str, list[float]] = {name: [] for name in methods}
    for s in range(steps + 1):
        rows = sentences[s * batch : (s + 1) * batch]
        for name, method in methods.items():
            batch_in = inputs[name].nest(inputs[name].collate(inputs[name].arrays({"sentence": rows, "row": list(range(len(rows)))})))
            t = time.perf_counter()
            loss, _ = method.loss(models[name], batch_in, s)
            loss.backward()
            optimizers[name].step()
            method.after_step(models[name])
            optimizers[name].zero_grad(set_to_none=True)
            if s:
                times[name].append(time.perf_counter() - t)
    a, b = (statistics.median(times[n]) for n in ("simcse", "esimcse"))
    print(f"step (minilm, batch {batch}, len 32, CPU, {os.cpu_count()} cores): SimCSE {bench.figure('step_ms_simcse', a * 1e3):.0f} ms, "
          f"ESimCSE {bench.figure('step_ms_esimcse', b * 1e3):.0f} ms", flush=True)
    bench.ratio("step ESimCSE / SimCSE", b / a, "<= 1.5")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="2000,8000,16000")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--ray", action="store_true", help="the teacher's embeddings by Ray Data's actors, as a run on Ray")


def run(args: argparse.Namespace, bench: Bench) -> None:
    bench_mining([int(n) for n in args.sizes.split(",")], args.ray, bench)
    if args.steps:
        bench_step(args.batch, args.steps, bench)


CASE = Case("esimcse", "Mined negatives' cost per sentence and core against the corpus size, and ESimCSE's step "
            "(repetition, the momentum copy, a full queue) beside SimCSE's", arguments, run,
            smoke=["--sizes", "200", "--batch", "16", "--steps", "2"],
            meaning="Mining is paid once per corpus and setting (cached); the step's extra is the momentum copy's "
                    "forward without gradient and the longer positives.")
