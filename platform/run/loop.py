"""``train_loop_per_worker(config)``: one worker's contrastive training, top to bottom, and the
small ``Runtime`` it is written against.

The loop is plain PyTorch; the recipe's ``loss`` is the science (``methods.recipe``) and everything
here is plumbing around it. Where it runs is chosen once, from the ``RunContext`` the job hands
it: a Ray Train worker (batches from its Ray Data shard, every evaluation reported with a
resumable checkpoint that Ray persists) or a plain process (a GPU box without Ray, a debugger,
``torchrun``: it reads the corpus itself, shards it by rank if ``torch.distributed`` is
initialised, and keeps the best checkpoint under ``output_dir``). Ray and MLflow are imported
only by the runtime that uses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import logging
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

from methods.encoder import Encoder
from methods.ingredients import derive_seed
from methods.recipe import Recipe
from platform import settings
from platform.config import TrainConfig
from platform.data import read_corpus, resolve_corpus
from platform.data.cache import replace_dir
from platform.data.columns import CorpusData, prepare_corpus
from platform.evaluation.sts import STSEvaluator
from platform.run import checkpoint
from platform.run.checkpoint import Position
from platform.run.local_models import resolve_local_models
from platform.tracking.recorder import StepLog, load_points
from platform.tracking.runs import BEST, DEV_METRIC

COMMIT_WAIT_S = 120.0  # how long rank 0 waits for Ray Train's controller to commit a reported checkpoint


def train_loop_per_worker(config: "dict[str, Any] | RunContext") -> dict[str, Any]:
    """One worker's training. ``config``: ``RunContext.loop_config()`` (or a flat config, for a
    hand call). Returns the steps done, training time, and the best STS-B dev with its step."""
    ctx = RunContext.of(config)
    cfg = ctx.cfg
    rt = make_runtime(ctx, cfg)
    resolve_local_models(cfg.ingredient_params)
    # Weights a checkpoint lacks and the heads: the same on every rank, from the seed.
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    recipe = cfg.build_recipe()
    encoder = Encoder.from_pretrained(cfg.model, dropout=cfg.dropout)
    model = rt.wrap(recipe.build(encoder))
    torch.manual_seed(derive_seed(cfg.seed, "dropout", rt.rank))  # each rank its own masks, from the seed
    steps = total_steps(cfg, rt.num_sentences(recipe))
    optimizer, schedule = make_optimizer(cfg, recipe, model, steps)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if rt.device.type == "cuda" and cfg.bf16 else contextlib.nullcontext()
    evaluator = rt.dev_evaluator() if rt.is_chief else None

    log = rt.metric_log()
    pos = rt.restore(model, optimizer, schedule, log) or Position()
    if pos.step and rt.is_chief:
        announce_resume(pos, log)
    if pos.step >= steps:  # a run restored at its end (--resume of a trial cut just after its last step):
        # its last state reported once more (its points are the checkpoint's), since Tune expects a result from every trial
        evaluate_and_report(rt, recipe, model, evaluator, cfg, pos, [], (optimizer, schedule), log, steps, record=False)
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
            extra["grad_norm"] = clip_gradients(model, cfg.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            pos.step, pos.batch_in_epoch = pos.step + 1, pos.batch_in_epoch + 1
            pos.train_time_s += time.perf_counter() - t0
            window.append(float(loss.detach()))
            if pos.step % cfg.log_steps == 0:
                log({"train_loss": window[-1], "lr": schedule.get_last_lr()[0], **extra}, pos.step)
            if pos.step % cfg.eval_steps == 0 or pos.step == steps:
                evaluate_and_report(rt, recipe, model, evaluator, cfg, pos, window, (optimizer, schedule), log, steps)
                window = []
                model.train()
        if pos.step >= steps:
            break
    log.close()
    rt.close()
    return {"steps": pos.step, "train_time_s": pos.train_time_s, BEST: pos.best, "best_step": pos.best_step}


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """The global gradient's L2 norm, before it is scaled to ``max_norm`` when above it (0: never),
    as the Hugging Face Trainer's ``max_grad_norm`` does."""
    parameters = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters])))


def make_optimizer(cfg: TrainConfig, recipe: Recipe, model, steps: int):
    """AdamW or Adam over the recipe's parameter groups; linear decay to 0 after the warm-up, or constant."""
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = kind(recipe.param_groups(model, cfg.lr), lr=cfg.lr, weight_decay=cfg.weight_decay)
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
                        window: list[float], optim, log: StepLog, steps: int, record: bool = True) -> None:
    """STS-B dev on rank 0 (its one console line; the step metrics so far go out to MLflow), then
    the runtime's report with a checkpoint of this step."""
    metrics: dict[str, Any] = {"step": pos.step, "epoch": pos.epoch, "train_loss_avg": sum(window) / max(len(window), 1),
                               "train_time_s": pos.train_time_s}
    write, improved = None, False
    if rt.is_chief:
        exported = recipe.export_encoder(model)
        dev = evaluator(exported, pooler=recipe.eval_pooler())["STSBenchmark"]
        improved = pos.improve(dev)
        metrics.update({DEV_METRIC: dev, BEST: pos.best})
        state = {"step": pos.step, "epoch": pos.epoch, DEV_METRIC: dev, "method": cfg.method,
                 "recipe": recipe.spec.describe(), "eval_pooler": recipe.eval_pooler(), "config": cfg.flat()}

        if record:  # the best so far goes with this step's points: sent once this checkpoint is persisted
            log({DEV_METRIC: dev, BEST: pos.best, "train_loss_avg": metrics["train_loss_avg"]}, pos.step)

        def write(folder: Path, resumable: bool = True) -> None:
            checkpoint.save(folder, exported, state)
            if resumable:
                checkpoint.save_train_state(folder, model, *optim, pos)
                checkpoint.save_points(folder, log.points())

        say(progress_line(rt.ctx.label, pos, steps, metrics["train_loss_avg"], dev, improved))
    rt.report(metrics, write, improved, log)


def announce_resume(pos: Position, log: StepLog) -> None:
    """A restart (Ray Train's, after a lost worker, or ``--resume``) on the console and in the
    run's history (``resumed_at_step``): a worker's console line reaches the driver through Ray's
    log monitor, which may drop it."""
    say(f"resumed at step {pos.step} (epoch {pos.epoch}, batch {pos.batch_in_epoch} of the epoch)")
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


# ------------------------------------------------------------------------------------------------
# Where the loop runs


@dataclasses.dataclass
class RunContext:
    """What a training worker gets: the typed configuration and where its run is."""

    cfg: TrainConfig
    runtime: str = "process"  # "ray": inside a Ray Train worker group
    num_sentences: int = 0  # the corpus size, when batches come from the Ray Data pipeline
    corpus: CorpusData | None = None  # the prepared corpus, when the driver runs the loop itself
    tracking_uri: str | None = None  # MLflow run that rank 0 logs step metrics to (None: print only)
    run_id: str | None = None
    run_dir: str | None = None  # process runtime: where its latest and best checkpoints are kept
    # STS-B dev ({"sent1", "sent2", "scores"} lists) read by the driver: a worker on another node
    # has no data folder. None: rank 0 reads it from $PLATFORM_DATA_DIR.
    dev: dict[str, list] | None = None
    corpus_ref: Any = None  # Ray runtime, local pipeline: object-store reference to (columns, states)
    label: str | None = None  # prefixes rank 0's console line per evaluation (a trial's id)
    resumed: bool = False  # the MLflow run was reopened by --resume

    def loop_config(self) -> dict[str, Any]:
        """For Ray's ``train_loop_config``. Ray's Train controller unpickles it in a process where
        ``platform`` is still the standard module, so the context travels as bytes that only the
        workers unpickle; the object-store reference travels as itself, so Ray keeps it alive."""
        plain = dataclasses.replace(self, corpus=None, corpus_ref=None)
        return {"context": pickle.dumps(plain), "corpus_ref": self.corpus_ref}

    @classmethod
    def of(cls, config: "dict[str, Any] | RunContext") -> "RunContext":
        """From ``loop_config()``, the context itself (the process runtime), or a flat config."""
        if isinstance(config, RunContext):
            return config
        if "context" in config:
            return dataclasses.replace(pickle.loads(config["context"]), corpus_ref=config.get("corpus_ref"))
        return cls(cfg=TrainConfig.from_flat(config))


class Runtime:
    """Rank, world size and device of this worker; its batches, checkpoints and metric log."""

    def __init__(self, ctx: RunContext, cfg: TrainConfig):
        self.ctx, self.cfg = ctx, cfg
        self.rank, self.world, self.device = 0, 1, torch.device("cpu")

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def dev_evaluator(self) -> STSEvaluator:
        if self.ctx.dev is None:
            return STSEvaluator.stsb_dev(batch_size=self.cfg.eval_batch_size)
        return STSEvaluator.from_pairs({"STSBenchmark": self.ctx.dev}, batch_size=self.cfg.eval_batch_size)

    def batches(self, recipe: Recipe, epoch: int) -> Iterator[dict[str, np.ndarray]]:
        """This worker's share of the epoch's global batches, with the recipe's per-epoch columns."""
        corpus = self.ctx.corpus or self._read_corpus(recipe)
        for batch in local_batches(corpus.columns, self.cfg, self.rank, self.world, epoch):
            yield recipe.augment(batch, corpus.states, epoch) if recipe.augments_per_epoch else batch

    def _read_corpus(self, recipe: Recipe) -> CorpusData:
        # Generated columns and statistics come from the cache the driver filled.
        if not hasattr(self, "_corpus"):
            sentences = read_corpus(resolve_corpus(self.cfg.corpus), limit=self.cfg.max_sentences or None)
            self._corpus = prepare_corpus(recipe, sentences, use_ray=False)
        return self._corpus

    def num_sentences(self, recipe: Recipe) -> int:
        return (self.ctx.corpus or self._read_corpus(recipe)).num_sentences

    def restore(self, model, optimizer, schedule, log: StepLog) -> Position | None:
        """The training state of the run's latest checkpoint (a restart or --resume), if any, and
        its step metrics into ``log``."""
        return None

    def report(self, metrics: dict[str, Any], write: Callable[..., None] | None, improved: bool,
               log: StepLog) -> None:
        """Hand an evaluation's metrics on with a checkpoint of this step, which ``write(folder,
        resumable=True)`` fills on rank 0 (with the step metrics so far, which MLflow is sent once
        the checkpoint is persisted: ``log.persisted()``)."""
        raise NotImplementedError

    def close(self) -> None:
        """The loop's end (after its last report)."""

    def metric_log(self) -> StepLog:
        """Rank 0's step metrics, and MLflow's system metrics of its node for the run."""
        if not (self.is_chief and self.ctx.run_id):
            return StepLog()
        return StepLog(self.ctx.tracking_uri, self.ctx.run_id, system_metrics=True)


class ProcessRuntime(Runtime):
    """This process (``torch.distributed`` ranks if initialised). Under ``run_dir`` (default
    ``output_dir/local``) it keeps ``latest`` (resumable: model, heads, optimizer, scheduler, data
    position, RNG) and ``best`` (the encoder and its state), each replaced in one rename."""

    def __init__(self, ctx: RunContext, cfg: TrainConfig):
        super().__init__(ctx, cfg)
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if cfg.use_gpu and torch.cuda.is_available():
            self.device = torch.device("cuda", int(settings.get(settings.LOCAL_RANK) or 0))
        self.run_dir = Path(ctx.run_dir or Path(cfg.output_dir) / "local")

    def wrap(self, model):
        model.to(self.device)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model

    def restore(self, model, optimizer, schedule, log):
        latest = self.run_dir / "latest"
        if not (latest / checkpoint.TRAIN_STATE).is_file():
            return None
        pos = checkpoint.load_train_state(latest, self.rank, model, optimizer, schedule)
        log.restore(load_points(str(latest)), pos.step)
        return pos

    def report(self, metrics, write, improved, log):
        if self.world > 1:
            dist.barrier()
        if not (self.is_chief and write):
            return
        self._write("latest", lambda folder: (write(folder), checkpoint.save_rng(folder, self.rank)))
        if improved:
            self._write("best", lambda folder: write(folder, resumable=False))
        log.persisted()

    def _write(self, name: str, fill: Callable[[Path], Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=self.run_dir))
        fill(staging)
        replace_dir(staging, self.run_dir / name)


class RayTrainRuntime(Runtime):
    """A Ray Train worker: DDP through Ray, batches from its Ray Data shard (or read locally),
    every evaluation reported with a resumable checkpoint that Ray persists to storage before
    ``report`` returns; rank 0's new points go out once Ray Train's controller has committed it."""

    def __init__(self, ctx: RunContext, cfg: TrainConfig):
        super().__init__(ctx, cfg)
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

    def wrap(self, model):
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def batches(self, recipe, epoch):
        if self.cfg.data_pipeline == "local":
            yield from super().batches(recipe, epoch)
            return
        import ray.train

        # The epoch's own dataset: a uniform permutation of the corpus, augmented by Ray Data.
        shard = ray.train.get_dataset_shard(f"train_{epoch}")
        yield from shard.iter_batches(batch_size=self.cfg.batch_size // self.world, drop_last=True,
                                      batch_format="numpy")

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

    def restore(self, model, optimizer, schedule, log):
        """The latest reported checkpoint: Ray Train restarts a failed worker group with it."""
        import ray.train

        found = ray.train.get_checkpoint()
        if found is None:
            return None
        with found.as_directory() as directory:
            pos = checkpoint.load_train_state(Path(directory), self.rank, model, optimizer, schedule)
            log.restore(load_points(str(directory)), pos.step)
            return pos

    def report(self, metrics, write, improved, log):
        import ray.train

        folder = Path(tempfile.mkdtemp(prefix="ckpt-"))
        try:
            checkpoint.save_rng(folder, self.rank)
            if self.is_chief and write:
                write(folder)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)))  # persisted on return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if self.is_chief:
            # A resumed fit starts from the checkpoint the controller committed, not from the newest
            # one in storage: points go out once they are committed, so none is sent twice.
            try:
                ray.train.get_all_reported_checkpoints(ray.train.CheckpointConsistencyMode.COMMITTED,
                                                       timeout_s=COMMIT_WAIT_S)
            except Exception:  # no controller to answer: the points are replayed at the fit's end
                return
        log.persisted()


def make_runtime(ctx: RunContext, cfg: TrainConfig) -> Runtime:
    return RayTrainRuntime(ctx, cfg) if ctx.runtime == "ray" else ProcessRuntime(ctx, cfg)


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
        yield {"row": idx, **{k: a[idx] for k, a in arrays.items()}}
