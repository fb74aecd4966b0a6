"""``train_loop_per_worker(config)``: one worker's contrastive training, top to bottom, and the
small ``Runtime`` it is written against.

The loop is plain PyTorch; the recipe's ``loss`` is the science (``methods.recipe``) and everything
here is plumbing around it. Where it runs is chosen once, from the ``WorkerContext`` the job hands
it: a Ray Train worker (batches from its Ray Data shard, every evaluation reported with a
resumable checkpoint that Ray persists) or a plain process (a GPU box without Ray, a debugger,
``torchrun``: it reads the corpus itself, shards it by rank if ``torch.distributed`` is
initialised, and keeps the best checkpoint under ``output_dir``). Ray and MLflow are imported
only by the runtime that uses them.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import itertools
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

from methods.encoder import Encoder, shared_tokenizer
from methods.ingredients import derive_seed, epoch_permutation
from methods.recipe import Recipe
from platform import settings
from platform.config import TrainConfig
from platform.data import read_corpus, resolve_corpus
from platform.data.columns import CorpusData, prepare_corpus, resolve_local_models
from platform.evaluation.sts import STSEvaluator
from platform import checkpoint
from platform.checkpoint import Position, load_points
from platform.tracking.names import BEST, DEV_GEOMETRY, DEV_METRIC, POINTS, POINTS_RUN, PROGRESS_LINE, STEP, TRAIN_LOSS
from platform.data.pipeline import StepInputs

COMMIT_WAIT_S = 120.0  # how long rank 0 waits for Ray Train's controller to commit a reported checkpoint


def train_loop_per_worker(config: "dict[str, Any] | WorkerContext") -> dict[str, Any]:
    """One worker's training. ``config``: ``WorkerContext.loop_config()`` (or a flat config, for a
    hand call). Returns the steps done, training time, and the best STS-B dev with its step."""
    ctx = WorkerContext.of(config)
    cfg = ctx.cfg
    rt = make_runtime(ctx, cfg)
    resolve_local_models(cfg.ingredient_params)
    # Weights a checkpoint lacks and the heads: the same on every rank, from the seed.
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    recipe = cfg.build_recipe()
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    model = rt.wrap(compile_backbone(recipe.build(encoder, cfg.max_len, cfg.batch_size), cfg.compile))
    torch.manual_seed(derive_seed(cfg.seed, "dropout", rt.rank))  # each rank its own masks, from the seed
    steps = total_steps(cfg, rt.num_sentences(recipe))
    optimizer, schedule = make_optimizer(cfg, recipe, model, steps)
    autocast, scaler = mixed_precision(cfg.precision, rt.device)
    evaluator = rt.dev_evaluator() if rt.is_chief else None

    log = Points()
    sampler = SystemSampler(log) if rt.is_chief and rt.ctx.run_id else None
    pos = start_position(rt, recipe, model, evaluator, cfg, (optimizer, schedule, scaler), log, steps)
    inputs = StepInputs(recipe, cfg.model, cfg.max_len, static=cfg.static_shapes)
    window: list[torch.Tensor] = []  # the losses since the last evaluation, on the device
    model.train()
    for epoch in range(pos.epoch, cfg.epochs):
        skip = pos.batch_in_epoch if epoch == pos.epoch else 0  # the data position of a checkpoint
        pos.epoch, pos.batch_in_epoch = epoch, skip
        # Batches arrive tokenised, as tensors on the device: the step does no host work on text.
        for batch in itertools.islice(rt.batches(recipe, epoch, inputs), skip, None):
            if pos.step >= steps:
                break
            t0 = time.perf_counter()
            loss, extra = forward_backward(recipe, model, batch, pos.step, cfg.mini_batch_size, autocast, scaler, rt.world)
            scaler.unscale_(optimizer)  # fp16: clipping and the logged norm see the true gradient
            extra["grad_norm"] = clip_gradients(model, cfg.max_grad_norm)
            apply_step(optimizer, schedule, scaler)
            recipe.after_step(model)  # the ingredients' state across steps (ESimCSE's queue)
            optimizer.zero_grad(set_to_none=True)
            pos.step, pos.batch_in_epoch = pos.step + 1, pos.batch_in_epoch + 1
            window.append(loss.detach())
            logs, evaluates = pos.step % cfg.log_steps == 0, pos.step % cfg.eval_steps == 0 or pos.step == steps
            # The step's one read from the device, and only on a step that logs or evaluates.
            read = to_host({**({"train_loss": loss.detach(), "lr_current": schedule.get_last_lr()[0], **extra} if logs else {}),
                            **({TRAIN_LOSS: torch.stack(window).mean()} if evaluates else {})})
            pos.train_time_s += time.perf_counter() - t0  # the device's time too: reads wait for it
            if logs:
                log({k: v for k, v in read.items() if k != TRAIN_LOSS}, pos.step)
            if evaluates:
                evaluate_and_report(rt, recipe, model, evaluator, cfg, pos, read[TRAIN_LOSS], (optimizer, schedule, scaler),
                                    log, steps)
                window = []
                model.train()
        if pos.step >= steps:
            break
    rt.close()  # the model in flight written, the checkpoints' commits awaited
    if sampler is not None:
        sampler.stop()
    return {"steps": pos.step, "train_time_s": pos.train_time_s, BEST: pos.best, "best_step": pos.best_step}


def start_position(rt: Runtime, recipe: Recipe, model, evaluator, cfg: TrainConfig, optim, log: Points,
                   steps: int) -> Position:
    """Where training starts: a restart's position (Ray Train's, or ``--resume``), else step 0. A
    run restored at its end (``--resume`` of a trial cut just after its last step) reports its last
    state once more (its points are the checkpoint's), since Tune expects a result from every trial."""
    pos = rt.restore(model, *optim, log)
    if pos is None:
        pos = Position()
    if (pos.step or rt.started_over) and rt.is_chief:
        announce_resume(pos, log)
    if pos.step >= steps:
        evaluate_and_report(rt, recipe, model, evaluator, cfg, pos, 0.0, optim, log, steps, record=False)
    return pos


def compile_backbone(model: torch.nn.Module, mode: str, backend: str = "inductor") -> torch.nn.Module:
    """The backbone compiled in place (``nn.Module.compile``: parameter names, and so checkpoints,
    unchanged) with ``torch.compile``'s ``mode``; "none" leaves it eager. With ``static_shapes``
    every step has the same shapes, so one graph serves the whole run (and CUDA graphs apply
    under "reduce-overhead")."""
    if mode != "none":
        model.encoder.backbone.compile(mode=None if mode == "default" else mode, backend=backend)
    return model


def forward_backward(recipe: Recipe, model: torch.nn.Module, batch: dict[str, Any], step: int, mini_batch_size: int,
                     autocast, scaler, world: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The step's loss and its gradients: in one encoder pass, or in chunks of ``mini_batch_size``
    rows (``Recipe.cached_step``, GradCache). Every worker holds the same global loss and DDP
    averages gradients over workers, so scaling by W makes the applied gradient that of the global
    loss (see gather_with_grad)."""
    def backward(loss: torch.Tensor) -> None:
        scaler.scale(loss * world).backward()

    if not mini_batch_size:
        with autocast:
            loss, extra = recipe.loss(model, batch, step)
        backward(loss)
        return loss, extra
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return recipe.cached_step(model, batch, step, mini_batch_size, backward, autocast)
    with model.no_sync():  # the heads' gradients come from a backward that no DDP forward prepared
        loss, extra = recipe.cached_step(model, batch, step, mini_batch_size, backward, autocast)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat / world, grads)):
        g.copy_(synced)
    return loss, extra


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """The global gradient's L2 norm (on the device), before it is scaled to ``max_norm`` when
    above it (0: never), as the Hugging Face Trainer's ``max_grad_norm`` does."""
    parameters = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters]))


def to_host(values: dict[str, Any]) -> dict[str, float]:
    """Numbers and 0-d tensors as floats, the tensors read back from the device in one transfer."""
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in values.items() if k not in tensors}
    if tensors:
        out.update(zip(tensors, torch.stack([t.float().reshape(()) for t in tensors.values()]).tolist()))
    return out


def apply_step(optimizer, schedule, scaler) -> None:
    """The optimizer's and the schedule's step. Under fp16 the scaler skips a step whose gradient
    overflowed (and lowers its scale); as in the HF Trainer the authors ran, a skipped step does
    not advance the learning-rate schedule. Knowing it reads the scale back (fp16 steps only)."""
    before = scaler.get_scale() if scaler.is_enabled() else 0.0
    scaler.step(optimizer)
    scaler.update()
    if not scaler.is_enabled() or scaler.get_scale() >= before:
        schedule.step()


def mixed_precision(precision: str, device: torch.device):
    """The step's autocast and gradient scaler for ``precision`` on ``device``: ``fp16`` autocast
    with a loss scaler (the HF Trainer's ``--fp16``, which SimCSE's, SAN's and AugCSE's authors
    train with), ``bf16`` autocast (no scaler: bf16 has fp32's range), ``fp32`` neither. On a CPU
    the step runs in fp32 whatever ``precision`` says; a disabled scaler passes everything through."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision) if device.type == "cuda" else None
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    return autocast, torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


FUSED_DEVICES = ("cuda", "cpu")  # where torch has fused Adam(W) kernels (CPU since torch 2.4)


def optimizer_kernel(device: torch.device) -> dict[str, bool]:
    """How Adam(W)'s update runs, chosen here only: one fused kernel where torch has one for the
    device (what the Hugging Face Trainer defaults to on CUDA), else the multi-tensor ``foreach``
    path. The same update either way (tests/platform/run/test_optimizer.py bounds the difference);
    fused reads the parameters once per step instead of once per elementwise operation. A restored
    optimizer keeps it (``checkpoint.load_train_state``)."""
    return {"fused": True} if device.type in FUSED_DEVICES else {"foreach": True}


def make_optimizer(cfg: TrainConfig, recipe: Recipe, model, steps: int):
    """AdamW or Adam over the recipe's parameter groups, with ``optimizer_kernel``'s update; linear
    decay to 0 after the warm-up, or constant."""
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    device = next(model.parameters()).device
    optimizer = kind(recipe.param_groups(model, cfg.lr), lr=cfg.lr, weight_decay=cfg.weight_decay,
                     **optimizer_kernel(device))
    if cfg.schedule == "constant":
        return optimizer, get_constant_schedule_with_warmup(optimizer, cfg.warmup_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, cfg.warmup_steps, steps)


def total_steps(cfg: TrainConfig, num_sentences: int) -> int:
    per_epoch = num_sentences // cfg.batch_size
    steps = per_epoch * cfg.epochs
    steps = min(steps, cfg.max_steps) if cfg.max_steps else steps
    if steps < 1:
        raise ValueError(f"corpus has {num_sentences} sentences, fewer than one batch of {cfg.batch_size}")
    return steps


def evaluate_and_report(rt: Runtime, recipe: Recipe, model, evaluator, cfg: TrainConfig, pos: Position,
                        loss_avg: float, optim, log: Points, steps: int, record: bool = True) -> None:
    """STS-B dev on rank 0 (its one console line), then the runtime's report with the checkpoint
    the policy asks for (``checkpoint.Policy``: the full state when due, the model when improved,
    else none), carrying the points logged since the last report (``POINTS``, for the run's
    writer). ``loss_avg``: the mean training loss since the last evaluation."""
    metrics: dict[str, Any] = {STEP: pos.step, "epoch": pos.epoch, TRAIN_LOSS: loss_avg,
                               "train_time_s": pos.train_time_s}
    write, kind, improved, snapshot = None, None, False, None
    if rt.is_chief:
        exported = recipe.export_encoder(model)
        emb = evaluator.encode(exported, pooler=recipe.eval_pooler(), prompt=recipe.dev_prompt())
        dev = evaluator.score(emb)["STSBenchmark"]
        geometry = {DEV_GEOMETRY[k]: v for k, v in evaluator.geometry(emb).items()}  # the same embeddings
        improved = pos.improve(dev)
        kind = rt.policy.kind(improved, pos.epoch, last=pos.step >= steps)
        # The new best's weights copied aside now; written to its folder while training goes on.
        snapshot = rt.writer.snapshot(exported) if improved and kind else None
        metrics.update({DEV_METRIC: dev, BEST: pos.best, **geometry})
        state = {"step": pos.step, "epoch": pos.epoch, DEV_METRIC: dev, **geometry, "method": cfg.method,
                 "recipe": recipe.spec.describe(), "eval_pooler": recipe.eval_pooler(),
                 "eval_prompt": recipe.eval_prompt(), "config": cfg.flat()}

        if record:
            log({DEV_METRIC: dev, BEST: pos.best, TRAIN_LOSS: metrics[TRAIN_LOSS], **geometry}, pos.step)

        def write(folder: Path, name: str) -> None:
            if improved:
                pos.best_name = name  # saved with the state: what a restart from it keeps as the best
            resumable = kind == checkpoint.STATE_KIND
            checkpoint.save(folder, None, state if resumable else {**state, "resume_from": rt.kept.state})
            if resumable:
                checkpoint.save_train_state(folder, model, *optim[:2], pos, scaler=optim[2])
                checkpoint.save_points(folder, log.kept)

        line = progress_line(rt.ctx.label, pos, steps, metrics[TRAIN_LOSS], dev, improved)
        if rt.ctx.to_tune:  # printed by the sweep's driver once Tune has the report (and its points)
            metrics[PROGRESS_LINE] = line
        else:
            say(line)
        if rt.ctx.run_id:
            metrics.update({POINTS: json.dumps(log.take()), POINTS_RUN: rt.ctx.run_id})
    rt.report(metrics, write, kind, improved, snapshot)


def announce_resume(pos: Position, log: Points) -> None:
    """A restart (Ray Train's, after a lost worker, or ``--resume``) on the console and in the
    run's history (``resumed_at_step``, 0 when no state was written yet): a worker's console line
    reaches the driver through Ray's log monitor, which may drop it."""
    if pos.step:
        say(f"resumed at step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch} of the epoch)")
    else:  # the steps already shown are trained again
        say("restarted at step 0: the earlier attempt wrote no state checkpoint to resume from (a state is "
            "written at a new epoch's first evaluation, every checkpoint_minutes and at the last step)")
    log({"resumed_at_step": pos.step}, pos.step)


def say(line: str) -> None:
    """One console line, straight to stdout: Ray Train turns print() into log records, which the
    console shows twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def progress_line(label: str | None, pos: Position, steps: int, loss: float, dev: float, improved: bool) -> str:
    """``[label] step 8/24  loss 1.234  dev 78.12 (best 78.12, new)  ETA 1m05s``: the ETA from the
    training time per step so far (evaluations not counted)."""
    eta = int(pos.train_time_s / max(pos.step, 1) * (steps - pos.step))
    best = f"best {pos.best:.2f}" + (", new" if improved else "")
    prefix = f"[{label}] " if label else ""
    return (f"{prefix}step {pos.step}/{steps}  loss {loss:.4f}  {DEV_METRIC} {dev:.2f} ({best})  "
            f"ETA {eta // 60}m{eta % 60:02d}s")


class Points:
    """Rank 0's points (``log(metrics, step)``): every one kept, for the state checkpoints (a
    restart from one, or ``--resume``, reports its points again: the run's writer sends each
    (key, step) once), and those not reported yet, which go with the next report (``take``)."""

    def __init__(self) -> None:
        self.kept: list[tuple] = []
        self._new: list[tuple] = []
        self.step = 0
        self._lock = threading.Lock()  # the system sampler adds from its thread

    def __call__(self, metrics: dict[str, float], step: int, keep: bool = True) -> None:
        ts = int(time.time() * 1000)
        new = [(k, float(v), ts, int(step)) for k, v in metrics.items()]
        with self._lock:
            self.kept.extend(new if keep else [])
            self._new.extend(new)
            self.step = max(self.step, int(step))

    def restore(self, points: list, step: int) -> None:
        """The points of the state checkpoint of ``step`` a restart starts from: reported again."""
        with self._lock:
            self.kept = [tuple(p) for p in points if p[3] <= step]
            self._new = list(self.kept)
            self.step = step

    def take(self) -> list[tuple]:
        with self._lock:
            taken, self._new = self._new, []
        return taken


class SystemSampler:
    """MLflow's monitors of this node's CPU, memory, disk, network and (NVML) GPU, sampled every
    ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (default 10) from a daemon thread into
    ``points`` as ``system/*`` (averaged over the interval, at the step trained last): they reach
    the run with the next report. Without psutil, nothing."""

    def __init__(self, points: Points):
        self._done = threading.Event()
        try:
            from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
            from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
            from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
        except ImportError:
            return
        monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
        with contextlib.suppress(Exception):  # no NVML, no GPU
            from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

            monitors.append(GPUMonitor())
        interval = settings.number(settings.SYSTEM_METRICS_INTERVAL)

        def sample() -> None:
            while not self._done.wait(interval):
                values = {}
                for monitor in monitors:
                    with contextlib.suppress(Exception):
                        monitor.collect_metrics()
                        values.update(monitor.aggregate_metrics())
                        monitor.clear_metrics()
                points({f"system/{k}": v for k, v in values.items()}, points.step, keep=False)

        threading.Thread(target=sample, name="system-metrics", daemon=True).start()

    def stop(self) -> None:
        self._done.set()


# ------------------------------------------------------------------------------------------------
# Where the loop runs


@dataclasses.dataclass
class WorkerContext:
    """What a training worker gets: the typed configuration and where its run is."""

    cfg: TrainConfig
    runtime: str = "process"  # "ray": inside a Ray Train worker group
    num_sentences: int = 0  # the corpus size, when batches come from the Ray Data pipeline
    corpus: CorpusData | None = None  # the prepared corpus, when the driver runs the loop itself
    run_id: str | None = None  # the MLflow run the reports' points are for (None: print only)
    run_dir: str | None = None  # the fit's folder (a path or URI): its checkpoints, pruned by rank 0
    # STS-B dev ({"sent1", "sent2", "scores"} lists) read by the driver: a worker on another node
    # has no data folder. None: rank 0 reads it from $PLATFORM_DATA_DIR.
    dev: dict[str, list] | None = None
    corpus_ref: Any = None  # Ray runtime, local pipeline: object-store reference to (columns, statistics)
    label: str | None = None  # prefixes rank 0's console line per evaluation (a trial's id)
    to_tune: bool = False  # the reports go to Tune, whose driver prints their lines and writes their points
    # The process runtime: what takes rank 0's reports (the fit's run writer); Ray Train's
    # controller takes them under Ray.
    on_report: Callable[[dict[str, Any]], None] | None = None

    def loop_config(self) -> dict[str, Any]:
        """For Ray's ``train_loop_config``. Ray's Train controller unpickles it in a process where
        ``platform`` is still the standard module, so the context travels as bytes that only the
        workers unpickle; the object-store reference travels as itself, so Ray keeps it alive."""
        plain = dataclasses.replace(self, corpus=None, corpus_ref=None, on_report=None)
        return {"context": pickle.dumps(plain), "corpus_ref": self.corpus_ref}

    @classmethod
    def of(cls, config: "dict[str, Any] | WorkerContext") -> "WorkerContext":
        """From ``loop_config()``, the context itself (the process runtime), or a flat config."""
        if isinstance(config, WorkerContext):
            return config
        if "context" in config:
            return dataclasses.replace(pickle.loads(config["context"]), corpus_ref=config.get("corpus_ref"))
        return cls(cfg=TrainConfig.from_flat(config))


class Runtime:
    """Rank, world size and device of this worker; its batches, checkpoints and metric log."""

    prunes_whole = True  # checkpoints the fit no longer keeps go whole (Ray Train's must stay listed)
    started_over = False  # a restart with no state to start from: step 0 again

    def __init__(self, ctx: WorkerContext, cfg: TrainConfig):
        self.ctx, self.cfg = ctx, cfg
        self.rank, self.world, self.device = 0, 1, torch.device("cpu")
        self.policy, self.kept = checkpoint.Policy(cfg.checkpoint_minutes), checkpoint.Kept(behind=ctx.to_tune)
        self.writer = checkpoint.ModelWriter()  # rank 0's new best models, written in the background

    def restored(self, name: str, pos: Position, latest: str = "") -> Position:
        """Started again from the state checkpoint ``name``: what the abandoned attempt wrote after
        it goes, but for ``latest`` (what Ray Train restarts from again, should this attempt die
        before it reports)."""
        self.policy = checkpoint.Policy(self.cfg.checkpoint_minutes, pos.epoch)
        self.kept = checkpoint.Kept(name, pos.best_name, self.ctx.to_tune)
        if self.is_chief and self.ctx.run_dir:
            checkpoint.prune(self.ctx.run_dir, self.kept.names() | {latest}, whole=self.prunes_whole)
        return pos

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def dev_evaluator(self) -> STSEvaluator:
        if self.ctx.dev is None:
            return STSEvaluator.stsb_dev(batch_size=self.cfg.eval_batch_size)
        return STSEvaluator.from_pairs({"STSBenchmark": self.ctx.dev}, batch_size=self.cfg.eval_batch_size)

    def batches(self, recipe: Recipe, epoch: int, inputs: StepInputs) -> Iterator[dict[str, Any]]:
        """This worker's share of the epoch's global batches, with the recipe's per-epoch columns,
        as the step's tensors on this worker's device. The host makes ``STEPS_PER_BLOCK`` steps'
        rows at a time in a helper thread (gathered, augmented, tokenised to fixed width), a block
        ahead; each block goes to the device in one copy, and each step's batch is a slice of it
        there (``DeviceBlock``): no per-step host work, no per-step transfer."""
        corpus = self.ctx.corpus or self._read_corpus(recipe)
        local = self.cfg.batch_size // self.world

        def made() -> Iterator[DeviceBlock]:
            for rows in local_batches(corpus.columns, self.cfg, self.rank, self.world, epoch, STEPS_PER_BLOCK):
                rows = recipe.augment(rows, corpus.statistics, epoch) if recipe.augments_per_epoch else rows
                yield DeviceBlock.of(inputs, inputs.arrays(rows), pin=self.device.type == "cuda")

        for block in prefetched(made()):
            yield from block.steps(local, self.device)

    def _read_corpus(self, recipe: Recipe) -> CorpusData:
        # Generated columns and statistics come from the cache the driver filled.
        if not hasattr(self, "_corpus"):
            sentences = read_corpus(resolve_corpus(self.cfg.corpus), limit=self.cfg.max_sentences or None)
            self._corpus = prepare_corpus(recipe, sentences, use_ray=False)
        return self._corpus

    def num_sentences(self, recipe: Recipe) -> int:
        return (self.ctx.corpus or self._read_corpus(recipe)).num_sentences

    def restore(self, model, optimizer, schedule, scaler, log: Points) -> Position | None:
        """The training state of the run's latest checkpoint (a restart or --resume), if any, and
        its points into ``log``."""
        return None

    def report(self, metrics: dict[str, Any], write: Callable[[Path, str], None] | None, kind: str | None,
               improved: bool, snapshot: checkpoint.Snapshot | None = None) -> None:
        """Hand an evaluation's metrics on, with a checkpoint of ``kind`` (rank 0's choice) that
        ``write(folder, name)`` fills on rank 0, and ``snapshot``'s model in its ``model/`` (a new
        best), written in the background: the checkpoint is named (renamed into place, reported)
        only once complete. ``metrics`` carry rank 0's points since the last report."""
        raise NotImplementedError

    def close(self) -> None:
        """The loop's end (after its last report): the model in flight written."""
        self.writer.close()

class ProcessRuntime(Runtime):
    """This process (``torch.distributed`` ranks if initialised). Its checkpoints are folders under
    ``run_dir`` (default ``output_dir/local``), each written aside and renamed into place."""

    def __init__(self, ctx: WorkerContext, cfg: TrainConfig):
        super().__init__(ctx, cfg)
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if cfg.use_gpu and torch.cuda.is_available():
            self.device = torch.device("cuda", int(settings.get(settings.LOCAL_RANK) or 0))
        self.run_dir = Path(ctx.run_dir or Path(cfg.output_dir) / "local")
        self.ctx = dataclasses.replace(ctx, run_dir=str(self.run_dir))

    def wrap(self, model):
        model.to(self.device)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model

    def restore(self, model, optimizer, schedule, scaler, log):
        written = [p for p in self.run_dir.glob(checkpoint.PREFIX + "*") if ".tmp-" not in p.name]
        states = [p for p in written if (p / checkpoint.TRAIN_STATE).is_file()]
        if not states:  # the models of an attempt cut before its first state, if any, go
            self.started_over = bool(written)
            if self.is_chief and written:
                checkpoint.prune(str(self.run_dir), set(), whole=True)
            return None
        latest = max(states, key=lambda p: checkpoint.step_of(p.name))
        pos = checkpoint.load_train_state(latest, self.rank, model, optimizer, schedule, scaler)
        log.restore(load_points(str(latest)), pos.step)
        return self.restored(latest.name, pos)

    def report(self, metrics, write, kind, improved, snapshot=None):
        if self.world > 1:
            dist.barrier()
        if self.is_chief and self.ctx.on_report is not None:
            self.ctx.on_report(metrics)
        if not (self.is_chief and kind):
            return
        # Checkpoints appear in the order they were reported: a state names the best before it.
        self.writer.collect(wait=True)
        name = checkpoint.new_name(metrics[STEP])
        state = kind == checkpoint.STATE_KIND
        self.run_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=self.run_dir))
        write(staging, name)
        if state:
            checkpoint.save_rng(staging, self.rank)
            self.policy.wrote_state(metrics["epoch"])

        def publish() -> None:  # a process killed before the rename leaves a .tmp- folder: no checkpoint
            if snapshot is not None:
                self.writer.write(snapshot, staging / checkpoint.MODEL)
            staging.rename(self.run_dir / name)

        def settle() -> None:  # the earlier best goes only once this one is complete
            self.kept.wrote(name, kind, improved)
            checkpoint.prune(str(self.run_dir), self.kept.names(), whole=True)

        if snapshot is None:
            publish()
            settle()
        else:
            self.writer.submit(publish, settle)


class RayTrainRuntime(Runtime):
    """A Ray Train worker: DDP through Ray, batches from its Ray Data shard (or read locally),
    every evaluation reported, with the checkpoint the policy chose uploaded by Ray in the
    background; once Ray Train's controller has committed it, rank 0 sends a state's points and
    prunes what the fit no longer keeps."""

    prunes_whole = False

    def __init__(self, ctx: WorkerContext, cfg: TrainConfig):
        super().__init__(ctx, cfg)
        import ray
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        # Ray Train's per-report INFO lines (one logger is named by its module's file) would bury
        # the one line per evaluation this loop prints.
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        spec = importlib.util.find_spec("ray.train.v2._internal.execution.context")
        if spec is not None and spec.origin:
            logging.getLogger(spec.origin).setLevel(logging.WARNING)
        self.device = ray.train.torch.get_device()
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-commit")
        # A worker Ray ends mid-fit (a trial the scheduler stopped) exits at once: the interpreter's
        # finalization would abort a training thread that is inside a backward pass, loudly.
        atexit.register(os._exit, 0)
        quiet_when_killed()
        if ctx.to_tune and self.is_chief and ctx.run_dir:  # a stopped trial trains on until Ray ends this actor
            checkpoint.name_pruner(ctx.run_dir, ray.get_runtime_context().get_actor_id())

    def wrap(self, model):
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def batches(self, recipe, epoch, inputs):
        if self.cfg.data_pipeline == "local":
            yield from super().batches(recipe, epoch, inputs)
            return
        import ray.train

        # The epoch's own dataset: a uniform permutation of the corpus, augmented and tokenised by
        # Ray Data; Ray collates the next batch in its prefetch thread and moves it to the device.
        shard = ray.train.get_dataset_shard(f"train_{epoch}")
        for flat in shard.iter_torch_batches(batch_size=self.cfg.batch_size // self.world, drop_last=True,
                                             collate_fn=ray_collate(inputs), device=self.device,
                                             pin_memory=self.device.type == "cuda"):
            yield inputs.nest(flat)

    def num_sentences(self, recipe):
        return self.ctx.num_sentences if self.cfg.data_pipeline == "ray" else super().num_sentences(recipe)

    def _read_corpus(self, recipe):
        if self.ctx.corpus_ref is None:
            return super()._read_corpus(recipe)
        import ray

        # Prepared once by the driver; no worker reads the corpus or the caches from its own disk.
        if not hasattr(self, "_corpus"):
            self._corpus = CorpusData(*ray.get(self.ctx.corpus_ref))
        return self._corpus

    def restore(self, model, optimizer, schedule, scaler, log):
        """The state a restart starts from: Ray Train's latest committed checkpoint, or the state a
        model checkpoint names (``resume_from``); None before the first state (a fresh start)."""
        import ray.train

        found = ray.train.get_checkpoint()
        if found is None:
            return None
        latest = found.path.rstrip("/").rsplit("/", 1)[1]
        with found.as_directory() as directory:
            if not (Path(directory) / checkpoint.TRAIN_STATE).is_file():
                name = checkpoint.resume_from(directory)
                if not name:  # Ray Train restarted the fit before its first state: weights only so far
                    self.started_over = True
                    if self.is_chief and self.ctx.run_dir:
                        checkpoint.prune(self.ctx.run_dir, {latest}, whole=self.prunes_whole)
                    return None
                found = ray.train.Checkpoint(path=f"{found.path.rstrip('/').rsplit('/', 1)[0]}/{name}",
                                             filesystem=found.filesystem)
        with found.as_directory() as directory:
            pos = checkpoint.load_train_state(Path(directory), self.rank, model, optimizer, schedule, scaler)
            log.restore(load_points(str(directory)), pos.step)
        return self.restored(found.path.rstrip("/").rsplit("/", 1)[1], pos, latest)

    def report(self, metrics, write, kind, improved, snapshot=None):
        import ray.train

        kind, name = self._agree(kind, metrics[STEP])
        if kind is None:
            ray.train.report(metrics)
            return
        state = kind == checkpoint.STATE_KIND
        folder = Path(tempfile.mkdtemp(prefix="ckpt-"))
        if state:
            checkpoint.save_rng(folder, self.rank)
        if self.is_chief:
            write(folder, name)
        found = ray.train.Checkpoint.from_directory(str(folder)) if self.is_chief or state else None
        upload = None
        if snapshot is not None:
            storage = ray.train.get_context().get_storage()

            def upload(local, dir_name):  # in Ray's upload thread: the model written, then persisted
                self.writer.write(snapshot, Path(local.path) / checkpoint.MODEL)
                return storage.persist_current_checkpoint(local, dir_name)
        # Written and uploaded in the background (Ray removes the local copy after), the report
        # reaching the controller only then: the loop goes on training.
        ray.train.report(metrics, checkpoint=found, checkpoint_dir_name=name,
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
                         delete_local_checkpoint_after_upload=True, checkpoint_upload_fn=upload)
        if found is None:
            shutil.rmtree(folder, ignore_errors=True)
        if not self.is_chief:
            return
        self.kept.wrote(name, kind, improved)
        if state:
            self.policy.wrote_state(metrics["epoch"])
        # What the fit keeps as of this checkpoint: a name Kept drops never comes back.
        self._committer.submit(self._committed, name, self.kept.names() | {name})

    def _agree(self, kind: str | None, step: int) -> tuple[str | None, str | None]:
        """Rank 0's choice of checkpoint, and its folder name, on every rank (one merged folder)."""
        choice = [(kind, checkpoint.new_name(step) if kind else None)]
        if self.world > 1:
            dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def _committed(self, name: str, keep: set[str]) -> None:
        """Once Ray Train's controller committed the checkpoint ``name`` (what a resumed fit starts
        from): what the fit no longer keeps, up to it, is emptied (newer checkpoints may still be
        uploading)."""
        import ray.train

        try:
            ray.train.get_all_reported_checkpoints(ray.train.CheckpointConsistencyMode.COMMITTED,
                                                   timeout_s=COMMIT_WAIT_S)
        except Exception:  # no controller to answer: the fit is ending
            return
        if self.ctx.run_dir:
            checkpoint.prune(self.ctx.run_dir, keep, up_to=checkpoint.step_of(name))

    def close(self) -> None:
        super().close()
        self._committer.shutdown(wait=True)
        atexit.unregister(os._exit)


def quiet_when_killed() -> None:
    """In a Ray actor's process (a trial, a Train worker): its kill (ASHA's stop) prints nothing.
    Ray's SIGTERM handler raises SystemExit wherever the main thread is; inside a finalizer (a
    weakref callback, a ``__del__``) Python cannot raise it and prints "Exception ignored in ...
    Traceback" instead, which Ray forwards to the sweep's console. Ray ends the process anyway
    (its raylet follows the SIGTERM with a SIGKILL); other unraisable exceptions print as before."""
    hook = sys.unraisablehook
    if getattr(hook, "quiet_when_killed", False):
        return

    def quiet(unraisable) -> None:
        if not isinstance(unraisable.exc_value, SystemExit):
            hook(unraisable)

    quiet.quiet_when_killed = True
    sys.unraisablehook = quiet


def make_runtime(ctx: WorkerContext, cfg: TrainConfig) -> Runtime:
    return RayTrainRuntime(ctx, cfg) if ctx.runtime == "ray" else ProcessRuntime(ctx, cfg)


_END = object()


def prefetched(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, each made in a helper thread while the caller works on the one before."""
    with ThreadPoolExecutor(1, thread_name_prefix="batches") as pool:
        pending = pool.submit(next, items, _END)
        while (item := pending.result()) is not _END:
            pending = pool.submit(next, items, _END)
            yield item


def local_batches(
    columns: dict[str, Any], cfg: TrainConfig, rank: int, world: int, epoch: int, steps: int = 1
) -> Iterator[dict[str, np.ndarray]]:
    """Global batches of a seeded per-epoch permutation; this rank takes its contiguous slice,
    so W workers together see exactly the batches one worker would (drop_last). ``columns``:
    Arrow arrays or lists; a batch's rows are taken from them as it is made. ``steps``: this
    rank's rows of that many consecutive batches in one (the last block may hold fewer)."""
    import pyarrow as pa

    table = pa.table(columns)
    perm = epoch_permutation(cfg.seed, epoch, table.num_rows)
    local = cfg.batch_size // world
    starts = range(0, len(perm) - cfg.batch_size + 1, cfg.batch_size)
    for first in range(0, len(starts), steps):
        idx = np.concatenate([perm[s + rank * local : s + (rank + 1) * local] for s in starts[first:first + steps]])
        rows = table.take(idx)
        yield {"row": idx, **{k: rows.column(k).to_numpy(zero_copy_only=False) for k in rows.column_names}}


STEPS_PER_BLOCK = 64  # steps' rows made on the host, and sent to the device, at a time


@dataclasses.dataclass
class DeviceBlock:
    """Consecutive steps' rows as ``StepInputs.arrays`` made them (text columns at fixed width,
    with their lengths), as tensors; ``steps`` moves them to the device once and cuts each step's
    batch there: what ``StepInputs.collate`` + ``nest`` give for the same rows (a text column cut
    to its batch's longest row, or to the fixed width when ``static``)."""

    inputs: StepInputs
    tensors: dict[str, torch.Tensor]
    lengths: dict[str, np.ndarray]  # each text column's token counts, on the host: a step's width without a read

    @classmethod
    def of(cls, inputs: StepInputs, arrays: dict[str, np.ndarray], pin: bool) -> "DeviceBlock":
        sep = StepInputs.SEP
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64 if k.endswith(sep + "input_ids") else None))
                   for k, v in arrays.items()}
        lengths = {c: np.asarray(arrays[f"{c}{sep}length"]) for c in inputs.recipe.text_columns}
        if pin:
            tensors = {k: t.pin_memory() for k, t in tensors.items()}
        return cls(inputs, tensors, lengths)

    def steps(self, local: int, device: torch.device) -> Iterator[dict[str, Any]]:
        sep, inputs = StepInputs.SEP, self.inputs
        placed = {k: t.to(device, non_blocking=True) for k, t in self.tensors.items()}
        types = "token_type_ids" in shared_tokenizer(inputs.tokenizer).model_input_names
        fixed = inputs.recipe.encoder.token_width(inputs.max_len) if inputs.static else None
        positions = torch.arange(max(t.shape[1] for k, t in placed.items() if k.endswith(sep + "input_ids")),
                                 device=device)
        tokenised = {f"{c}{sep}{k}" for c in inputs.recipe.text_columns for k in ("input_ids", "length")}
        for start in range(0, len(next(iter(self.lengths.values()))) - local + 1, local):
            rows = slice(start, start + local)
            batch: dict[str, Any] = {k: t[rows] for k, t in placed.items() if k not in tokenised}
            for column in inputs.recipe.text_columns:
                width = fixed or int(self.lengths[column][rows].max())
                ids = placed[f"{column}{sep}input_ids"][rows, :width]
                made = {"input_ids": ids, **({"token_type_ids": torch.zeros_like(ids)} if types else {}),
                        "attention_mask": (positions[:width] < placed[f"{column}{sep}length"][rows, None]).long()}
                batch[column] = made
            yield batch


def ray_collate(inputs):
    """``inputs.collate`` as Ray Data's collate class for ``iter_torch_batches`` (Ray 2.47 deprecates
    a plain function there); Ray still moves its tensors to the device in its prefetch thread."""
    from ray.data.collate_fn import NumpyBatchCollateFn

    class Collate(NumpyBatchCollateFn):
        def __call__(self, batch):
            return inputs.collate(batch)

    return Collate()
