"""The checkpoint format, and every read and write of it.

A checkpoint is a folder ``checkpoint_<step>_<id>`` under its fit's folder, of one of two kinds
(``config.checkpoint_minutes`` says when each is written)::

    model/            the exported encoder in Hugging Face format (what evaluation and export load):
                      in a *model* checkpoint (an evaluation that improved STS-B dev), and in a
                      *state* checkpoint whose evaluation improved it
    state.json        step, epoch, STS-B dev score, recipe, evaluation pooler, the flat config; in a
                      model checkpoint, ``resume_from``: the state checkpoint a restart starts from
    train_state.pt    (state) model with its training heads, optimizer, scheduler, data position
    rng_rank<r>.pt    (state) each worker's RNG state
    metrics.json      (state) every step metric of the run up to this checkpoint's step: what MLflow
                      is sent once the checkpoint is persisted, and again after a restart

A fit keeps its latest state, its best model, and the best model as of that state (what a
restart from it falls back to), a Tune trial also the best before its best: ``Kept``. A restart
removes what the abandoned attempt wrote after the state it starts from.

Everything resumable is read with ``weights_only=True``: tensors and plain values, never code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from methods.encoder import Encoder
from platform import storage
from platform.errors import DataError
from platform.tracking.names import DEV_METRIC

STATE = "state.json"
MODEL = "model"
TRAIN_STATE = "train_state.pt"
POINTS = "metrics.json"
PREFIX = "checkpoint_"
PRUNER = "PRUNER"  # in a Tune trial's fit folder: the id of the Ray actor (rank 0) that prunes it
STATE_KIND, MODEL_KIND = "state", "model"


@dataclasses.dataclass
class Position:
    """Where training stands: what a resumed run continues from, and what a run reports."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_time_s: float = 0.0
    best: float = float("-inf")  # best STS-B dev so far
    best_step: int = 0
    best_name: str = ""  # the checkpoint folder holding that best model

    def improve(self, dev: float) -> bool:
        if dev > self.best:
            self.best, self.best_step = dev, self.step
            return True
        return False


def new_name(step: int) -> str:
    """A fresh checkpoint folder name: by step, and unique (a restarted attempt trains steps again)."""
    return f"{PREFIX}{step:08d}_{uuid.uuid4().hex[:8]}"


def step_of(name: str) -> int:
    return int(name[len(PREFIX):].split("_")[0])


def _step(name: str) -> int:
    try:
        return step_of(name)
    except ValueError:  # a folder of another naming (Ray Train's own)
        return -1


class Policy:
    """Which checkpoint an evaluation writes: the full *state* when one is due (``minutes`` since
    the last, 0 for every evaluation; an epoch's first evaluation; the last step), else the *model*
    when STS-B dev improved, else none. SimCSE's trainer likewise saves the model only when the
    dev score improves; the optimizer state (2x the model) is what a restart needs, not the registry."""

    def __init__(self, minutes: float, epoch: int = 0):
        self.minutes, self.epoch, self.since = minutes, epoch, time.monotonic()

    def kind(self, improved: bool, epoch: int, last: bool) -> str | None:
        due = last or self.minutes == 0 or epoch > self.epoch or time.monotonic() - self.since >= self.minutes * 60
        return STATE_KIND if due else MODEL_KIND if improved else None

    def wrote_state(self, epoch: int) -> None:
        self.epoch, self.since = epoch, time.monotonic()


class Kept:
    """The checkpoints a fit keeps (names under its folder): the latest state, the best model, and
    the best model as of that state. ``behind``: also the best before the best, for a fit whose
    scheduler decides on reports that lag its workers (a Tune trial: the driver names the best
    as of the last report Tune received, while the workers, until Ray ends them, go on training
    and may already have written a better one)."""

    def __init__(self, state: str = "", best: str = "", behind: bool = False):
        self.state, self.best, self.settled = state, best, best
        self.behind, self.previous = behind, ""

    def wrote(self, name: str, kind: str, improved: bool) -> None:
        if improved:
            self.previous, self.best = self.best, name
        if kind == STATE_KIND:
            self.state, self.settled = name, self.best

    def names(self) -> set[str]:
        return {n for n in (self.state, self.best, self.settled, self.previous if self.behind else "") if n}


def prune(location: str, keep: set[str], whole: bool = False, up_to: int | None = None) -> None:
    """Every checkpoint folder under a fit's ``location`` (a folder or URI) not in ``keep`` (and of
    a step <= ``up_to``: newer ones may still be uploading) loses what it holds. During a fit the
    folder itself stays, with a note: Ray Train's run snapshot lists every checkpoint reported, and
    refuses to resume when one is missing. ``whole``: the folders go too (a finished fit, never
    trained again)."""
    for name in storage.list_dirs(location):
        folder = storage.join(location, name)
        if not name.startswith(PREFIX) or name in keep or (up_to is not None and _step(name) > up_to):
            continue
        if whole or ".tmp-" in name:
            storage.remove(folder)
        elif storage.exists(storage.join(folder, STATE)):
            storage.empty(folder, "removed by the fit's checkpoint policy (platform.checkpoint.Kept)\n")


def save(directory: Path, encoder: Encoder | None, state: dict[str, Any]) -> Path:
    """``state.json``, with the encoder in Hugging Face format (the evaluable part) unless None."""
    if encoder is not None:
        encoder.save_pretrained(directory / MODEL)
    (directory / STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")
    return directory


class Snapshot(NamedTuple):
    """An encoder's weights as of one evaluation, in ``ModelWriter``'s host buffer."""
    encoder: Encoder
    weights: dict[str, torch.Tensor]
    copied: Any  # a CUDA event the copy completes at (None on a CPU: copied when taken)


class ModelWriter:
    """A new best model written without stopping the training step.

    ``snapshot`` copies the encoder's weights into one reused host buffer (pinned for a GPU's
    weights, so the copy is asynchronous: about 25 ms of PCIe for bert-base; on a CPU a memory
    copy of the same size) and returns; ``write`` (called from a background thread: this class's
    own for the process runtime, Ray Train's checkpoint upload thread for Ray's) writes the
    Hugging Face folder from the buffer. At most one write is in flight: a newer best waits in
    ``snapshot`` for the pending write to finish, never overtakes it, since a best that
    superseded a half-written one would leave a window with neither complete. ``blocked_s`` is
    each snapshot's wait plus copy: what an evaluation's save costs the training thread."""

    def __init__(self) -> None:
        self.buffer: dict[str, torch.Tensor] = {}
        self.free = threading.Event()
        self.free.set()
        self.blocked_s: list[float] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Future, Callable[[], None]] | None = None

    def snapshot(self, encoder: Encoder) -> Snapshot:
        t0 = time.perf_counter()
        self.collect(wait=True)
        self.free.wait()
        self.free.clear()
        weights = encoder.backbone.state_dict()
        if self.buffer.keys() != weights.keys() or any(self.buffer[k].shape != t.shape for k, t in weights.items()):
            self.buffer = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for k, t in weights.items()}
        with torch.no_grad():
            for k, t in weights.items():
                self.buffer[k].copy_(t, non_blocking=t.is_cuda)
        copied = None
        if any(t.is_cuda for t in weights.values()):
            copied = torch.cuda.Event()
            copied.record()
        self.blocked_s.append(time.perf_counter() - t0)
        return Snapshot(encoder, self.buffer, copied)

    def write(self, snapshot: Snapshot, directory: Path) -> None:
        """The snapshot's Hugging Face folder at ``directory`` (any thread); the buffer is free
        again after, also when the write failed."""
        try:
            if snapshot.copied is not None:
                snapshot.copied.synchronize()
            snapshot.encoder.save_pretrained(directory, state_dict=snapshot.weights)
        finally:
            self.free.set()

    def submit(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        """``job`` (which writes a snapshot) in this writer's thread; ``then`` on the caller's
        thread at ``collect``, once the job succeeded."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="best-model")
        self._pending = (self._pool.submit(job), then)

    def collect(self, wait: bool) -> None:
        """The write in flight's end: its ``then`` run when it succeeded, its error raised here
        (a failed write stops the run, never leaves a checkpoint silently missing). ``wait``:
        block until it ends; else only if it already has."""
        if self._pending is None or not (wait or self._pending[0].done()):
            return
        future, then = self._pending
        self._pending = None
        future.result()
        then()

    def close(self) -> None:
        self.collect(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def save_rng(directory: Path, rank: int) -> None:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, directory / f"rng_rank{rank}.pt")


def save_train_state(directory: Path, model, optimizer, schedule, position: Position, scaler=None) -> None:
    inner = getattr(model, "module", model)
    torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                **({"scaler": scaler.state_dict()} if scaler is not None else {}),
                **dataclasses.asdict(position)}, directory / TRAIN_STATE)


def load_train_state(directory: Path, rank: int, model, optimizer, schedule, scaler=None) -> Position:
    """Restore model, optimizer, scheduler, fp16's loss scale and this rank's RNG; return the position."""
    state = torch.load(directory / TRAIN_STATE, map_location="cpu", weights_only=True)
    getattr(model, "module", model).load_state_dict(state.pop("model"))
    load_optimizer(optimizer, state.pop("optimizer"))
    schedule.load_state_dict(state.pop("scheduler"))
    saved_scale = state.pop("scaler", None)
    if scaler is not None and saved_scale:
        scaler.load_state_dict(saved_scale)
    rng_file = directory / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return Position(**{f.name: state[f.name] for f in dataclasses.fields(Position) if f.name in state})


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """``optimizer.load_state_dict(saved)``, the optimizer keeping the update kernel it was built
    with (fused or foreach: ``loop.optimizer_kernel``), where ``load_state_dict`` would take the
    saved groups' (a state written on another device or by an older version), and each ``step``
    count where that kernel keeps it (fused: on the parameter's device)."""
    kernels = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, kernel in zip(optimizer.param_groups, kernels):
        group.update(kernel)
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if torch.is_tensor(step):
                optimizer.state[p]["step"] = step.to(p.device if kernel["fused"] else "cpu", torch.float32)


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    state_file = Path(path) / STATE
    if not state_file.is_file() or not (Path(path) / MODEL).is_dir():
        raise DataError(f"{path} is not a checkpoint (expected {STATE} and {MODEL}/)")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{state_file} is not a readable checkpoint state ({exc}); the checkpoint is damaged") from None
    if not isinstance(state, dict) or "eval_pooler" not in state:
        raise DataError(f"{state_file} is not a checkpoint state (no eval_pooler); the checkpoint is damaged")
    return state


def resume_from(path: str | os.PathLike) -> str | None:
    """The state checkpoint a model checkpoint names (``resume_from``): where a restart starts."""
    return json.loads((Path(path) / STATE).read_text(encoding="utf-8")).get("resume_from")


def model_dir(path: str | os.PathLike) -> Path:
    return Path(path) / MODEL


def save_points(directory: Path, points: list) -> None:
    (directory / POINTS).write_text(json.dumps([list(p) for p in points]), encoding="utf-8")


def load_points(location: str) -> list[tuple]:
    """The step metrics kept in the checkpoint at ``location`` (a folder or a storage URI)."""
    text = storage.read_text(storage.join(location, POINTS))
    return [tuple(p) for p in json.loads(text)] if text else []


def name_pruner(location: str, actor_id: str) -> None:
    """Say which Ray actor prunes the fit under ``location`` (``PRUNER``): a sweep's driver waits
    for its end before it names the best of a trial the scheduler stopped (``pruner``)."""
    storage.write_text(storage.join(location, PRUNER), actor_id)


def pruner(location: str) -> str:
    """The Ray actor that prunes the fit under ``location`` (its id; "" where none said)."""
    return (storage.read_text(storage.join(location, PRUNER)) or "").strip()


def exists(location: str | None) -> bool:
    """Whether a checkpoint (a folder or URI holding ``state.json``) is in storage."""
    return bool(location) and storage.exists(storage.join(location, STATE))


def checkpoints_under(location: str) -> list[tuple[dict, str]]:
    """(state, location) of each checkpoint directly under a fit's storage (Ray Train's
    ``checkpoint_*`` folders, or the process runtime's): a folder still being written (``.tmp-``)
    is none."""
    folders = [storage.join(location, name) for name in storage.list_dirs(location) if ".tmp-" not in name]
    return [(json.loads(state), folder) for folder in folders if (state := storage.read_text(storage.join(folder, STATE)))]


class Best(NamedTuple):
    """A fit's best checkpoint (a folder or URI) and its STS-B dev."""
    checkpoint: str
    dev: float


def best_under(location: str, up_to: int | None = None) -> Best | None:
    """The checkpoint with the best STS-B dev under a fit's storage (the first step to reach it),
    and that score; None when no checkpoint was evaluated. ``up_to``: only checkpoints of that
    step or before (those reported: a later one may still be uploading)."""
    found = [(-float(state[DEV_METRIC]), state.get("step", 0), folder)
             for state, folder in checkpoints_under(location)
             if DEV_METRIC in state and (up_to is None or state.get("step", 0) <= up_to)]
    return Best(min(found)[2], -min(found)[0]) if found else None


def read_state_at(location: str) -> dict:
    """A checkpoint's ``state.json`` at a folder or URI, without copying its weights."""
    if not storage.is_uri(location):
        return read_state(location)
    text = storage.read_text(storage.join(location, STATE))
    if text is None:
        with storage.local_copy(location) as folder:
            return read_state(folder)
    return json.loads(text)
