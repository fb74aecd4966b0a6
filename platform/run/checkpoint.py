"""The checkpoint format, and every read and write of it.

A checkpoint is a folder::

    model/            the exported encoder in Hugging Face format (what evaluation and export load)
    state.json        step, epoch, STS-B dev score, recipe, evaluation pooler, the flat config
    train_state.pt    resumable training state: model with its training heads, optimizer,
                      scheduler, data position (written where the runtime can resume)
    rng_rank<r>.pt    each worker's RNG state
    metrics.json      every step metric of the run up to this checkpoint's step (resumable ones):
                      what MLflow is sent once the checkpoint is persisted, and again after a restart

Everything resumable is read with ``weights_only=True``: tensors and plain values, never code.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from methods.encoder import Encoder
from platform.errors import DataError
from platform.tracking.recorder import POINTS_FILE

STATE = "state.json"
MODEL = "model"
TRAIN_STATE = "train_state.pt"
POINTS = POINTS_FILE  # read back by platform.tracking.recorder


@dataclasses.dataclass
class Position:
    """Where training stands: what a resumed run continues from, and what a run reports."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_time_s: float = 0.0
    best: float = float("-inf")  # best STS-B dev so far
    best_step: int = 0

    def improve(self, dev: float) -> bool:
        if dev > self.best:
            self.best, self.best_step = dev, self.step
            return True
        return False


def save(directory: Path, encoder: Encoder, state: dict[str, Any]) -> Path:
    """The evaluable part: the encoder in Hugging Face format plus ``state.json``."""
    encoder.save_pretrained(directory / MODEL)
    (directory / STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")
    return directory


def save_rng(directory: Path, rank: int) -> None:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, directory / f"rng_rank{rank}.pt")


def save_train_state(directory: Path, model, optimizer, schedule, position: Position) -> None:
    inner = getattr(model, "module", model)
    torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                **dataclasses.asdict(position)}, directory / TRAIN_STATE)


def load_train_state(directory: Path, rank: int, model, optimizer, schedule) -> Position:
    """Restore model, optimizer, scheduler and this rank's RNG; return the position."""
    state = torch.load(directory / TRAIN_STATE, map_location="cpu", weights_only=True)
    getattr(model, "module", model).load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    schedule.load_state_dict(state.pop("scheduler"))
    rng_file = directory / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return Position(**{f.name: state[f.name] for f in dataclasses.fields(Position) if f.name in state})


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


def is_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / STATE).is_file()


def model_dir(path: str | os.PathLike) -> Path:
    return Path(path) / MODEL



def save_points(directory: Path, points: list) -> None:
    (directory / POINTS).write_text(json.dumps([list(p) for p in points]), encoding="utf-8")
