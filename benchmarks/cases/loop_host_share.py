"""The training loop's step against the device's own step on the same batches: the share of a step
the host spends (tokenising the batch, reading values back to Python) while the device waits.

    PLATFORM_DATA_DIR=../shared/data python -m benchmarks run loop-host-share [--model tiny|bert-base] \\
        [--method simcse] [--steps 200] [--batch-size 64]

``loop``: ``train_loop_per_worker`` as a run calls it (plain process runtime, paper profile's
settings but the model and step count), its ``train_time_s`` per step, with the first
``--warmup`` steps taken out by a second, shorter run. ``device``: the same recipe and optimizer on
the same batches tokenised beforehand, no value read back until the end. Random weights with the
packaged (uncased BERT) tokenizer: ``tiny`` is the tests' 2-layer 32-d BERT, ``bert-base`` is
BertConfig()'s 12 x 768. Runs without Ray or MLflow (the GPU machine has neither).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path


import torch

from methods.encoder import Encoder
from platform.config import TrainConfig
from platform.data import read_corpus, resolve_corpus
from platform.data.columns import prepare_corpus
from platform.run.loop import WorkerContext, local_batches, make_optimizer, train_loop_per_worker
from benchmarks.common import random_bert
from benchmarks.harness import Bench, Case


def loop_seconds(cfg: TrainConfig, corpus, steps: int) -> float:
    cfg = TrainConfig.from_flat({**cfg.flat(), "max_steps": steps, "eval_steps": steps})
    run_dir = tempfile.mkdtemp()  # a fresh run each time, never a resume of the last
    return train_loop_per_worker(WorkerContext(cfg=cfg, corpus=corpus, run_dir=run_dir))["train_time_s"]


def device_seconds(cfg: TrainConfig, corpus, steps: int, warmup: int) -> float:
    torch.manual_seed(0)
    recipe = cfg.build_recipe()
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    device = torch.device("cuda" if cfg.use_gpu and torch.cuda.is_available() else "cpu")
    model = recipe.build(encoder).to(device)
    optimizer, schedule = make_optimizer(cfg, recipe, model, steps + warmup)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and cfg.bf16
                else contextlib.nullcontext())
    batches = []
    for batch in local_batches(corpus.columns, cfg, 0, 1, 0):
        tokens = {c: encoder.tokenize([str(s) for s in batch[c]], max_len=cfg.max_len, device=device)
                  for c in recipe.text_columns}
        tokens.update(recipe.tensor_columns(batch, device))
        batches.append(tokens)
        if len(batches) == steps + warmup:
            break
    model.train()

    def step(tokens, i):
        with autocast:
            loss, _ = recipe.loss(model, tokens, i)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], cfg.max_grad_norm or 1e9)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)

    for i, tokens in enumerate(batches[:warmup]):
        step(tokens, i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i, tokens in enumerate(batches[warmup:], start=warmup):
        step(tokens, i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="tiny | bert-base (random weights) | a model path")
    p.add_argument("--method", default="simcse")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--tokenizer", default="minilm", help="the random models' tokenizer (an uncased BERT vocabulary)")
    p.add_argument("--corpus", default="wiki1m_for_simcse.first11914.txt.gz")


def run(args: argparse.Namespace, bench: Bench) -> None:
    out = Path(tempfile.mkdtemp())
    model = args.model if args.model not in ("tiny", "bert-base") else random_bert(out / "model", args.model, args.tokenizer)
    cfg = TrainConfig.build(args.method, "paper", {
        "model": model, "corpus": str(resolve_corpus(args.corpus)), "batch_size": args.batch_size,
        "output_dir": str(out / "runs"), "final_eval": False, "use_gpu": torch.cuda.is_available()})
    corpus = prepare_corpus(cfg.build_recipe(), read_corpus(cfg.corpus), use_ray=False)
    loop_seconds(cfg, corpus, args.warmup)  # pays the process's one-time costs (CUDA context, kernels)
    short = loop_seconds(cfg, corpus, args.warmup)
    full = loop_seconds(cfg, corpus, args.warmup + args.steps)
    loop = (full - short) / args.steps
    dev = device_seconds(cfg, corpus, args.steps, args.warmup) / args.steps
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device={name} model={args.model} method={args.method} batch={args.batch_size} steps={args.steps}")
    print("| loop step (ms) | device step, pre-tokenised, no reads (ms) | host share of the loop's step |")
    print("|---|---|---|")
    print(f"| {loop * 1e3:.2f} | {dev * 1e3:.2f} | {100 * (1 - dev / loop):.0f}% |")
    bench.ratio("loop step / device step", loop / dev, "~1: the host adds nothing")


CASE = Case("loop-host-share", "the share of the training loop's step the host spends while the device waits "
            "(the loop beside the bare device step on the same batches)", arguments, run,
            smoke=["--steps", "3", "--warmup", "1", "--batch-size", "8"],
            meaning="Batches arrive tokenised as tensors and the step reads the device only when it logs: "
                    "a ratio near 1 says the host is off the critical path.", gpu=True)
