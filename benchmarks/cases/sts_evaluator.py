"""Evaluator speed: the 7 STS tasks with the packaged backbone, sentences per second.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run sts-evaluator [--model minilm] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import os
import time


import torch

from methods.encoder import Encoder
from platform.evaluation.sts import STSEvaluator, format_table, with_mean
from benchmarks.common import model_source
from benchmarks.harness import Bench, Case


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--pooler", default="avg")
    p.add_argument("--batch-size", type=int, default=128)


def run(args: argparse.Namespace, bench: Bench) -> None:
    t0 = time.perf_counter()
    ev = STSEvaluator(batch_size=args.batch_size)
    t_load = time.perf_counter() - t0
    enc = Encoder.from_pretrained(model_source(args.model), pooler=args.pooler)
    pairs = sum(len(x) for x in ev.pairs)
    t1 = time.perf_counter()
    scores = with_mean(ev(enc))
    t_enc = time.perf_counter() - t1
    print(format_table(scores))
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} model={args.model} batch={args.batch_size}")
    print(f"data load {t_load:.1f}s; {pairs} pairs = {2 * pairs} sentences, {len(ev.sentences)} distinct encoded")
    print(f"encode+score {t_enc:.1f}s: {len(ev.sentences) / t_enc:.0f} distinct sentences/s, "
          f"{2 * pairs / t_enc:.0f} task sentences/s (whole 7-task evaluation)")
    bench.figure("distinct_sentences_per_s", len(ev.sentences) / t_enc)
    bench.figure("seven_tasks_s", t_enc)


CASE = Case("sts-evaluator", "the 7-task STS evaluation (SentEval's protocol) of a backbone: sentences per second",
            arguments, run, smoke=["--model", "tiny"],
            meaning="Every run ends with these 7 tasks on its best checkpoint and on its backbone.")
