"""UNA speed: TF-IDF fit, negative generation per core, Ray Data scaling, step time.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run una [--parts tfidf,negatives,raydata,step]

- tfidf: Step 1 on the 163k-sentence corpus (the three files of $PLATFORM_DATA_DIR/corpus) and on
  that corpus repeated to 1M sentences (``--tfidf-n``). Target: <= 60 s for 1M on 2 cores.
- negatives: Steps 2-3 in one process (one core), sentences/s. Target >= 50k.
- raydata: the same generation as a Ray Data map_batches stage with 1 CPU vs 2 CPUs (each in a fresh
  local Ray), same input (the corpus repeated to 1.6M sentences). Target >= 1.8x. Reported for the
  map stage and with the driver's conversion of the Python input into Arrow blocks included.
- step: training step time UNA (alpha = 1: every batch carries its B negatives) vs SimCSE, same
  model and batch, interleaved. Expected overhead: the extra B rows of the forward pass (3B vs 2B).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.harness import ROOT, Bench, Case
from methods.ingredients import Draws
from methods.recipe import Recipe
from methods.una import UNAParams, fit_tfidf, make_negatives
from platform.data import data_dir, read_corpus


def corpus() -> list[str]:
    out: list[str] = []
    for f in sorted((data_dir() / "corpus").glob("*.txt.gz")):
        out.extend(read_corpus(f))
    return out


def bench_tfidf(sentences, big: int, bench: Bench):
    for n, sents in [(len(sentences), sentences), (big, (sentences * (big // len(sentences) + 1))[:big])]:
        t = time.perf_counter()
        table = fit_tfidf(sents)
        print(f"tfidf: {n:,} sentences, vocabulary {table.size:,}: {bench.figure(f'tfidf_s_{n}', time.perf_counter() - t):.1f} s",
              flush=True)


def bench_negatives(sentences, table, bench: Bench):
    rates = []
    for epoch in range(3):
        t = time.perf_counter()
        for i in range(0, len(sentences), 4096):
            make_negatives(sentences[i : i + 4096], table, UNAParams(), Draws(0, epoch), np.arange(i, i + len(sentences[i : i + 4096])))
        rates.append(len(sentences) / (time.perf_counter() - t))
    print(f"negatives (1 process, batches of 4096, {len(sentences):,} sentences): "
          f"median {bench.figure('negatives_per_s', statistics.median(rates)):,.0f} sentences/s (runs: {', '.join(f'{r:,.0f}' for r in rates)})", flush=True)


def bench_raydata(n_cpus: int, n: int) -> tuple[float, float]:
    """Run in a fresh process so each measurement gets its own local Ray of n_cpus."""
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
sys.modules.pop('platform', None)
import platform
from methods.recipe import Recipe
from platform.data.columns import corpus_statistics
from platform.data.pipeline import augment_dataset
from platform.data import data_dir, read_corpus
from platform.run.ray_env import init_ray
sents = []
for f in sorted((data_dir() / 'corpus').glob('*.txt.gz')):
    sents.extend(read_corpus(f))
sents = (sents * ({n} // len(sents) + 1))[:{n}]
method = Recipe.named('una')
state = corpus_statistics(method, {{'sentence': sents}})
init_ray(num_cpus={n_cpus})
augment_dataset(method, {{'sentence': sents[:20000]}}, state).materialize()  # warm the workers
t0 = time.perf_counter()
ds = augment_dataset(method, {{'sentence': sents}}, state)  # the driver: Python strings -> Arrow blocks
t1 = time.perf_counter()
ds.materialize()
t2 = time.perf_counter()
print('RATE', {n} / (t2 - t1), {n} / (t2 - t0))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=os.environ)
    rate = [line for line in out.stdout.splitlines() if line.startswith("RATE")]
    if not rate:
        raise SystemExit(out.stderr[-3000:])
    stage, end_to_end = map(float, rate[0].split()[1:])
    return stage, end_to_end


def bench_step(bench: Bench, steps: int = 8, batch: int = 32):
    import torch

    from methods.encoder import Encoder
    sents = corpus()[:2000]
    una = Recipe.named("una", alpha=1, r=2000)
    table = fit_tfidf(sents)
    torch.manual_seed(0)
    enc = Encoder.from_pretrained("minilm")
    times = {"simcse": [], "una": []}
    methods = {"simcse": Recipe.named("simcse"), "una": una}
    models = {k: m.build(enc) for k, m in methods.items()}
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    for step in range(steps):
        chunk = sents[step * batch : (step + 1) * batch]
        negs = make_negatives(chunk, table, una.negatives[0].params, Draws(0, step), np.arange(len(chunk)))
        for name in ("simcse", "una"):
            t = time.perf_counter()
            tokens = {"sentence": enc.tokenize(chunk, max_len=32)}
            if name == "una":
                tokens["una_negative"] = enc.tokenize(negs, max_len=32)
            loss, _ = methods[name].loss(models[name], tokens, step)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step > 0:  # the first step warms up
                times[name].append(time.perf_counter() - t)
    s, u = statistics.median(times["simcse"]), statistics.median(times["una"])
    print(f"step (minilm, batch {batch}, len 32, CPU): SimCSE {s * 1e3:.0f} ms, UNA alpha=1 {u * 1e3:.0f} ms", flush=True)
    bench.ratio("step UNA / SimCSE", u / s, "~1.50: forward rows 3B vs 2B")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="tfidf,negatives,raydata,step")
    p.add_argument("--raydata-n", type=int, default=1_600_000)
    p.add_argument("--repeats", type=int, default=2, help="Ray Data 1-vs-2 CPU pairs")
    p.add_argument("--limit", type=int, default=None, help="the corpus's first N sentences (default: all)")
    p.add_argument("--tfidf-n", type=int, default=1_000_000, help="the repeated corpus TF-IDF is also fitted on")
    p.add_argument("--step-steps", type=int, default=8)


def run(args: argparse.Namespace, bench: Bench) -> None:
    parts = args.parts.split(",")
    print(f"cpus={os.cpu_count()}", flush=True)
    sentences = corpus()[: args.limit]
    if "tfidf" in parts:
        bench_tfidf(sentences, args.tfidf_n, bench)
    if "negatives" in parts:
        bench_negatives(sentences, fit_tfidf(sentences), bench)
    if "raydata" in parts:
        for _ in range(args.repeats):  # interleaved, so that drifts of the machine hit both
            (one, one_all), (two, two_all) = bench_raydata(1, args.raydata_n), bench_raydata(2, args.raydata_n)
            print(f"ray data ({args.raydata_n:,} sentences): map stage 1 CPU {one:,.0f}/s, 2 CPUs {two:,.0f}/s, "
                  f"speed-up {two / one:.2f}x; with the driver's conversion of the Python input: "
                  f"{one_all:,.0f}/s vs {two_all:,.0f}/s = {two_all / one_all:.2f}x", flush=True)
            bench.ratio("Ray Data map stage, 2 CPUs / 1", two / one, ">= 1.8")
    if "step" in parts:
        bench_step(bench, args.step_steps)


CASE = Case("una", "UNA's costs: TF-IDF fit (163k and 1M sentences), negatives per core, Ray Data's scaling "
            "from 1 to 2 CPUs, the training step beside SimCSE's", arguments, run,
            smoke=["--limit", "3000", "--tfidf-n", "6000", "--raydata-n", "4000", "--repeats", "1", "--step-steps", "3"],
            meaning="TF-IDF's fit is the driver's one-off cost before training; the negatives per core and Ray "
                    "Data's speed-up say how generation scales with CPUs; the step ratio is what alpha=1 costs.")
