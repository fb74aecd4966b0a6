"""``train_loop_per_worker(config)``: one worker's contrastive training, top to bottom.

Plain PyTorch against a small ``Runtime`` (``platform.run.runtime``): under Ray Train the batches
come from the worker's Ray Data shard and every evaluation reports a resumable checkpoint;
without Ray the same loop reads the corpus itself, shards it by rank if ``torch.distributed`` is
initialised, and keeps the best checkpoint under ``output_dir``. The recipe's ``loss`` is the
science (``methods.recipe``); everything here is plumbing around it.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

import torch
from transformers import get_linear_schedule_with_warmup

from methods.encoder import Encoder
from methods.recipe import Recipe
from platform.config import TrainConfig
from platform.evaluation.sts import STSEvaluator
from platform.run import checkpoint
from platform.run.checkpoint import Position
from platform.run.local_models import resolve_local_models
from platform.run.runtime import RunContext, Runtime, make_runtime

DEV_METRIC = "stsb_dev_spearman"


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    ctx = RunContext.of(config)
    cfg = ctx.cfg
    rt = make_runtime(ctx, cfg)
    torch.manual_seed(cfg.seed)  # identical head initialisation on every rank
    resolve_local_models(cfg.ingredient_params)
    recipe = cfg.build_recipe()
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    model = rt.wrap(recipe.build(encoder))
    steps = total_steps(cfg, rt.num_sentences(recipe))
    optimizer = torch.optim.AdamW(recipe.param_groups(model, cfg.lr), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, steps)  # SimCSE: linear decay
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if rt.device.type == "cuda" and cfg.bf16
                else contextlib.nullcontext())
    evaluator = STSEvaluator.stsb_dev(batch_size=cfg.eval_batch_size) if rt.is_chief else None

    pos = rt.restore(model, optimizer, schedule) or Position()
    if pos.step and rt.is_chief:
        print(f"resumed at step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch} of the epoch)", flush=True)
    log = rt.metric_log(resumed=pos.step > 0)
    window: list[float] = []
    model.train()
    for epoch in range(pos.epoch, cfg.epochs):
        skip = pos.batch_in_epoch if epoch == pos.epoch else 0  # the data position of a checkpoint
        pos.epoch, pos.batch_in_epoch = epoch, skip
        for batch in itertools.islice(rt.batches(recipe, epoch), skip, None):
            if pos.step >= steps:
                break
            t0 = time.perf_counter()
            tokens = {c: encoder.tokenize([str(s) for s in batch[c]], max_len=cfg.max_len, device=rt.device)
                      for c in recipe.text_columns}
            tokens.update(recipe.tensor_columns(batch, rt.device))
            with autocast:
                loss, extra = recipe.loss(model, tokens, pos.step)
            # Every worker holds the same global loss; DDP averages gradients over workers, so
            # scaling by W makes the applied gradient that of the global loss (see gather_with_grad).
            (loss * rt.world).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            pos.step, pos.batch_in_epoch = pos.step + 1, pos.batch_in_epoch + 1
            pos.train_time_s += time.perf_counter() - t0
            window.append(float(loss.detach()))
            if pos.step % cfg.log_steps == 0:
                log({"train_loss": window[-1], "lr": schedule.get_last_lr()[0], **extra}, pos.step)
            if pos.step % cfg.eval_steps == 0 or pos.step == steps:
                evaluate_and_report(rt, recipe, model, evaluator, cfg, pos, window, (optimizer, schedule), log)
                window = []
                model.train()
        if pos.step >= steps:
            break
    return {"steps": pos.step, "train_time_s": pos.train_time_s, "best_" + DEV_METRIC: pos.best,
            "best_step": pos.best_step}


def total_steps(cfg: TrainConfig, num_sentences: int) -> int:
    per_epoch = num_sentences // cfg.batch_size
    steps = per_epoch * cfg.epochs
    steps = min(steps, cfg.max_steps) if cfg.max_steps else steps
    if steps < 1:
        raise ValueError(f"corpus has {num_sentences} sentences, fewer than one batch of {cfg.batch_size}")
    return steps


def evaluate_and_report(rt: Runtime, recipe: Recipe, model, evaluator, cfg: TrainConfig, pos: Position,
                        window: list[float], optim, log) -> None:
    """STS-B dev on rank 0, then the runtime's report with a checkpoint of this step."""
    metrics: dict[str, Any] = {"step": pos.step, "epoch": pos.epoch, "train_loss_avg": sum(window) / max(len(window), 1),
                               "train_time_s": pos.train_time_s}
    write, improved = None, False
    if rt.is_chief:
        exported = recipe.export_encoder(model)
        dev = evaluator(exported, pooler=recipe.eval_pooler())["STSBenchmark"]
        improved = pos.improve(dev)
        metrics.update({DEV_METRIC: dev, "best_" + DEV_METRIC: pos.best})
        state = {"step": pos.step, "epoch": pos.epoch, DEV_METRIC: dev, "method": cfg.method,
                 "recipe": recipe.spec.describe(), "eval_pooler": recipe.eval_pooler(), "config": cfg.flat()}

        def write(folder: Path) -> None:
            checkpoint.save(folder, exported, state)
            if rt.resumable:
                checkpoint.save_train_state(folder, model, *optim, pos)

        log({k: v for k, v in metrics.items() if k not in ("step", "epoch", "train_time_s")}, pos.step)
    rt.report(metrics, write, improved)
