"""Training-step throughput: the plain loop vs the same loop under Ray Train, side by side.

Same model, batch, corpus and steps; one worker each (all CPUs to it), evaluation excluded from
the timed part (the loop reports ``train_time_s``, the sum of its step times). The runs alternate
(plain, Ray, plain, Ray, ...) so machine noise hits both. Target: Ray / plain <= 1.10.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run ray-train-overhead [--steps 16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile


import torch

from platform.config import TrainConfig
from platform.data import read_corpus, resolve_corpus
from platform.run.loop import WorkerContext, train_loop_per_worker
from benchmarks.common import model_source
from benchmarks.harness import Bench, Case


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", default="minilm", help="a model name or path; tiny: the tests' random 2-layer BERT")


def run(args: argparse.Namespace, bench: Bench) -> None:
    cpus = os.cpu_count() or 1
    out = tempfile.mkdtemp()
    cfg = TrainConfig.build(
        "simcse", "local",
        {"model": model_source(args.model), "batch_size": args.batch_size, "max_steps": args.steps, "eval_steps": args.steps,
         "num_workers": 1, "cpus_per_worker": cpus, "output_dir": out, "final_eval": False,
         "data_pipeline": "local"},  # the batches read in the worker, as the plain loop reads them
    )
    cfg.corpus = str(resolve_corpus(cfg.corpus))
    sentences = read_corpus(cfg.corpus, limit=cfg.max_sentences)

    from platform.data.columns import CorpusData
    from platform.run.fit import fit
    from platform.run.ray_env import init_ray

    init_ray(num_cpus=cpus)
    plain, ray_times = [], []
    for r in range(args.repeats):
        torch.set_num_threads(cpus)
        plain_cfg = TrainConfig.from_flat({**cfg.flat(), "runtime": "process"})
        res = train_loop_per_worker(WorkerContext(cfg=plain_cfg, corpus=CorpusData({"sentence": sentences}, {}),
                                               run_dir=tempfile.mkdtemp()))
        plain.append(res["steps"] * args.batch_size / res["train_time_s"])
        result = fit(cfg, CorpusData({"sentence": sentences}, {}), None, storage_path=str(out), name=f"bench-{r}")
        metrics = result.metrics
        ray_times.append(metrics["step"] * args.batch_size / metrics["train_time_s"])
        print(f"repeat {r}: plain {plain[-1]:.1f} sent/s, Ray Train {ray_times[-1]:.1f} sent/s", flush=True)
    mp, mr = statistics.median(plain), statistics.median(ray_times)
    print(f"model={args.model} batch={args.batch_size} steps={args.steps} cpus={cpus} torch_threads={torch.get_num_threads()}")
    print(f"plain loop: {bench.figure('plain_sentences_per_s', mp):.1f} sentences/s   "
          f"Ray Train: {bench.figure('ray_train_sentences_per_s', mr):.1f} sentences/s")
    bench.ratio("step time, Ray Train / plain loop", mp / mr, "<= 1.10")


CASE = Case("ray-train-overhead", "the training loop's throughput under Ray Train beside the same loop in a plain "
            "process", arguments, run, smoke=["--steps", "2", "--repeats", "1", "--batch-size", "8", "--model", "tiny"],
            meaning="Ray Train's share of a step: what DDP through Ray, its reports and its data path cost "
                    "over the bare loop on the same CPUs.")
