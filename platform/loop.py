"""``train_loop_per_worker(config)``: one worker's contrastive training, top to bottom.

Plain PyTorch. Under Ray Train (``config["_ray"]``) the data comes from the worker's Ray Data
shard and metrics/checkpoints go through ``ray.train.report``; without Ray (a GPU box with only
torch, a debugger, ``torchrun``) the same loop reads the corpus itself, shards it by rank if
``torch.distributed`` is initialised, and keeps the best checkpoint under ``output_dir``.
Ray and MLflow are imported only when asked for.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

from methods.base import Method, method_class
from methods.encoder import Encoder
from platform.cache import prepared_state, replace_dir
from platform.config import TrainConfig
from platform.corpus import corpus_columns, statistics_input
from platform.data import DataError, read_corpus, resolve_corpus
from platform.local_models import resolve_local_models
from platform.sts import STSEvaluator

DEV_METRIC = "stsb_dev_spearman"
CHECKPOINT_STATE = "state.json"
CHECKPOINT_MODEL = "model"
TRAIN_STATE = "train_state.pt"


# ------------------------------------------------------------------------------------------------
# Where this worker runs


class Worker:
    """Rank, world size, device and the reporting channel of this worker."""

    def __init__(self, cfg: TrainConfig, use_ray: bool):
        self.use_ray = use_ray
        if use_ray:
            import ray.train
            import ray.train.torch

            ctx = ray.train.get_context()
            self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
            self.device = ray.train.torch.get_device()
        else:
            initialised = dist.is_available() and dist.is_initialized()
            self.rank = dist.get_rank() if initialised else 0
            self.world = dist.get_world_size() if initialised else 1
            if cfg.use_gpu and torch.cuda.is_available():
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            else:
                self.device = torch.device("cpu")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.use_ray:
            import ray.train.torch

            return ray.train.torch.prepare_model(model)
        model.to(self.device)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model


# ------------------------------------------------------------------------------------------------
# Data


def local_batches(
    columns: dict[str, list[str]], cfg: TrainConfig, rank: int, world: int, epoch: int
) -> Iterator[dict[str, np.ndarray]]:
    """Global batches of a seeded per-epoch permutation; this rank takes its contiguous slice,
    so W workers together see exactly the batches one worker would (drop_last)."""
    arrays = {k: np.asarray(v, dtype=object) for k, v in columns.items()}
    perm = np.random.default_rng(cfg.seed + epoch).permutation(len(arrays["sentence"]))
    local = cfg.batch_size // world
    for start in range(0, len(perm) - cfg.batch_size + 1, cfg.batch_size):
        idx = perm[start + rank * local : start + (rank + 1) * local]
        yield {k: a[idx] for k, a in arrays.items()}


def ray_batches(cfg: TrainConfig, world: int, epoch: int) -> Iterator[dict[str, np.ndarray]]:
    import ray.train

    shard = ray.train.get_dataset_shard("train")
    yield from shard.iter_batches(
        batch_size=cfg.batch_size // world,
        drop_last=True,
        batch_format="numpy",
        local_shuffle_buffer_size=4 * cfg.batch_size,
        local_shuffle_seed=cfg.seed + epoch,
    )


# ------------------------------------------------------------------------------------------------
# Checkpoints


def save_checkpoint(directory: Path, encoder: Encoder, state: dict[str, Any]) -> Path:
    """A checkpoint folder: the encoder in Hugging Face format plus ``state.json``."""
    encoder.save_pretrained(directory / CHECKPOINT_MODEL)
    (directory / CHECKPOINT_STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")
    return directory


def read_checkpoint_state(path: str | os.PathLike) -> dict[str, Any]:
    state_file = Path(path) / CHECKPOINT_STATE
    if not state_file.is_file() or not (Path(path) / CHECKPOINT_MODEL).is_dir():
        raise DataError(f"{path} is not a checkpoint (expected {CHECKPOINT_STATE} and {CHECKPOINT_MODEL}/)")
    return json.loads(state_file.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------
# The loop


def total_steps(cfg: TrainConfig, num_sentences: int) -> int:
    per_epoch = num_sentences // cfg.batch_size
    steps = per_epoch * cfg.epochs
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    cfg = TrainConfig.from_flat(config)
    worker = Worker(cfg, use_ray=bool(config.get("_ray")))
    is_chief = worker.rank == 0
    torch.manual_seed(cfg.seed)  # identical head initialisation on every rank

    resolve_local_models(cfg.params)
    method: Method = method_class(cfg.method)(cfg.params)
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    model = worker.wrap(method.build(encoder))

    ray_data = worker.use_ray and cfg.data_pipeline == "ray"
    if ray_data:
        num_sentences = int(config["_num_sentences"])
        state = None  # augmentation runs in Ray Data
    else:
        sentences = read_corpus(resolve_corpus(cfg.corpus), limit=cfg.max_sentences or None)
        columns = corpus_columns(method, sentences, use_ray=False)  # from the cache the driver filled
        num_sentences = len(sentences)
        state = prepared_state(method, statistics_input(columns))
        method.check_state(state)
    steps = total_steps(cfg, num_sentences)
    if steps < 1:
        raise ValueError(f"corpus has {num_sentences} sentences, fewer than one batch of {cfg.batch_size}")

    optimizer = torch.optim.AdamW(method.param_groups(model, cfg.lr), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, steps)  # SimCSE: linear decay
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if worker.device.type == "cuda" and cfg.bf16
        else contextlib.nullcontext()
    )
    evaluator = STSEvaluator.stsb_dev(batch_size=cfg.eval_batch_size) if is_chief else None
    eval_pooler = method.eval_pooler()

    best = {"stsb_dev_spearman": -math.inf, "step": 0, "checkpoint": None}
    step, start_epoch, skip, train_time = 0, 0, 0, 0.0
    resumed = restore(worker, model, optimizer, schedule)
    if resumed is not None:
        step, start_epoch, skip = resumed["step"], resumed["epoch"], resumed["batch_in_epoch"]
        train_time = resumed["train_time_s"]
        best.update(stsb_dev_spearman=resumed["best"], step=resumed["best_step"])
        if is_chief:
            print(f"resumed at step {step} (epoch {start_epoch}, batch {skip} of the epoch)", flush=True)
    sink = _metric_sink(config, resumed=resumed is not None) if is_chief else None
    window_loss, window_n = 0.0, 0
    model.train()
    for epoch in range(start_epoch, cfg.epochs):
        batches = ray_batches(cfg, worker.world, epoch) if ray_data else local_batches(columns, cfg, worker.rank, worker.world, epoch)
        batch_in_epoch = skip if epoch == start_epoch else 0
        if batch_in_epoch:
            batches = itertools.islice(batches, batch_in_epoch, None)  # the data position of the checkpoint
        for batch in batches:
            if step >= steps:
                break
            t0 = time.perf_counter()
            if not ray_data and type(method).augment is not Method.augment:
                batch = method.augment(batch, state)  # with Ray Data, the pipeline already did
            tokens = {
                col: encoder.tokenize([str(s) for s in batch[col]], max_len=cfg.max_len, device=worker.device)
                for col in method.text_columns
            }
            tokens.update(method.tensor_columns(batch, worker.device))
            with autocast:
                loss, extra = method.loss(model, tokens, step)
            # Every worker holds the same global loss; DDP averages gradients over workers, so
            # scaling by W makes the applied gradient that of the global loss (see gather_with_grad).
            (loss * worker.world).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            batch_in_epoch += 1
            train_time += time.perf_counter() - t0
            window_loss += float(loss.detach())
            window_n += 1

            if is_chief and step % cfg.log_steps == 0 and sink is not None:
                sink({"train_loss": float(loss.detach()), "lr": schedule.get_last_lr()[0], **extra}, step)

            if step % cfg.eval_steps == 0 or step == steps:
                metrics: dict[str, Any] = {
                    "step": step, "epoch": epoch, "train_loss_avg": window_loss / max(window_n, 1), "train_time_s": train_time,
                }
                window_loss, window_n = 0.0, 0
                # Under Ray every evaluation reports a resumable checkpoint (Ray keeps the best and
                # the latest); without Ray only a new best is kept, under output_dir.
                checkpoint_dir = Path(tempfile.mkdtemp(prefix="ckpt-")) if worker.use_ray else None
                if checkpoint_dir is not None:
                    torch.save(rng_state(), checkpoint_dir / f"rng_rank{worker.rank}.pt")
                if is_chief:
                    exported = method.export_encoder(model)
                    dev = evaluator(exported, pooler=eval_pooler)["STSBenchmark"]
                    metrics[DEV_METRIC] = dev
                    improved = dev > best["stsb_dev_spearman"]
                    if improved:
                        best.update(stsb_dev_spearman=dev, step=step)
                    metrics["best_" + DEV_METRIC] = best["stsb_dev_spearman"]
                    if improved and checkpoint_dir is None:
                        checkpoint_dir = Path(tempfile.mkdtemp(prefix="ckpt-"))
                    if checkpoint_dir is not None:
                        save_checkpoint(
                            checkpoint_dir,
                            exported,
                            {"step": step, "epoch": epoch, DEV_METRIC: dev, "method": cfg.method,
                             "eval_pooler": eval_pooler, "config": cfg.flat()},
                        )
                    if worker.use_ray:
                        save_train_state(checkpoint_dir, model, optimizer, schedule, {
                            "step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "train_time_s": train_time,
                            "best": best["stsb_dev_spearman"], "best_step": best["step"],
                        })
                    if sink is not None:
                        sink({k: v for k, v in metrics.items() if k not in ("step", "epoch", "train_time_s")}, step)
                best["checkpoint"] = _report(worker, cfg, config, metrics, checkpoint_dir, best["checkpoint"])
                model.train()
        if step >= steps:
            break

    return {
        "steps": step,
        "train_time_s": train_time,
        "best_" + DEV_METRIC: best["stsb_dev_spearman"],
        "best_step": best["step"],
        "best_checkpoint": best["checkpoint"],
    }


# ------------------------------------------------------------------------------------------------
# Resumable state (model with its training heads, optimizer, scheduler, position, RNG)


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_train_state(directory: Path, model, optimizer, schedule, position: dict[str, Any]) -> None:
    inner = getattr(model, "module", model)
    torch.save(
        {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(), **position},
        directory / TRAIN_STATE,
    )


def restore(worker: Worker, model, optimizer, schedule) -> dict[str, Any] | None:
    """Load the latest reported checkpoint (Ray Train restarts a failed worker group with it).
    Everything is read with ``weights_only=True``: tensors and plain values, never code."""
    if not worker.use_ray:
        return None
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        directory = Path(directory)
        state = torch.load(directory / TRAIN_STATE, map_location="cpu", weights_only=True)
        rng_file = directory / f"rng_rank{worker.rank}.pt"
        rng = torch.load(rng_file, weights_only=True) if rng_file.is_file() else None
    getattr(model, "module", model).load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    schedule.load_state_dict(state.pop("scheduler"))
    if rng is not None:
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return state


def _report(worker: Worker, cfg: TrainConfig, config: dict, metrics: dict, checkpoint_dir: Path | None, current):
    """Hand metrics and the checkpoint to Ray Train, or keep a new best under output_dir."""
    if worker.use_ray:
        import ray.train

        checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        try:
            ray.train.report(metrics, checkpoint=checkpoint)  # persisted before it returns
        finally:
            if checkpoint_dir:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)
        return current
    if worker.world > 1:
        dist.barrier()
    if checkpoint_dir is None:
        return current
    target = Path(config.get("_run_dir") or Path(cfg.output_dir) / "local") / "best"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name("best.tmp")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.move(str(checkpoint_dir), staging)
    replace_dir(staging, target)
    print(f"step {metrics['step']}: {DEV_METRIC}={metrics[DEV_METRIC]:.2f} (new best, saved to {target})", flush=True)
    return str(target)


def _metric_sink(config: dict, resumed: bool = False):
    if not config.get("_mlflow_run_id"):
        return None
    from platform.tracking import MetricSink

    # After a restart, steps past the checkpoint run again: points already logged are kept, not
    # duplicated.
    return MetricSink(config.get("_mlflow_uri"), config["_mlflow_run_id"], skip_logged=resumed)
