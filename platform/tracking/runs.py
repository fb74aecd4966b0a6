"""A run's MLflow life, in one place: created (or reopened by ``--resume``), logged to, and ended
with a status that says what happened.

- FINISHED: the work completed (or a scheduler ended it after a report) and the best checkpoint
  the run names exists in storage;
- KILLED: interrupted (Ctrl-C, SIGTERM, a driver that died), or stopped without a checkpoint;
- FAILED: an error, or work that completed without a checkpoint.

Whoever sees a run's end first ends it: the process doing the work, when the work completes (and,
outside a sweep, when it fails or is interrupted); the sweep's driver when Tune ends a trial
otherwise; ``--resume`` for runs whose driver died. Step metrics (with the best score so far) are
kept in the checkpoint of their step (``MetricLog``) and sent, in the background, once it is
persisted (``Publisher``), so a run never shows a number its checkpoints cannot back, and a
tracking outage delays the charts without stopping the training.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from platform.errors import UserError
from platform.run import storage
from platform.tracking import store

DEV_METRIC = "stsb_dev_spearman"  # STS-B dev Spearman x100: what checkpoints and runs are selected by
BEST = "best_" + DEV_METRIC
END_REASON_TAG = "platform.end_reason"
STORAGE_TAG = "platform.storage"  # where the run's checkpoints and resumable state live


def checkpoint_exists(location: str | None) -> bool:
    """Whether a checkpoint (a folder or URI holding ``state.json``) is in storage."""
    return bool(location) and storage.exists(storage.join(location, "state.json"))


def closing_status(outcome: str, checkpoint: str | None, needs_checkpoint: bool = True) -> tuple[str, str]:
    """``(MLflow status, reason)`` of a run that ended with ``outcome``: ``completed`` (its work
    returned), ``stopped`` (a scheduler ended it after a report), ``interrupted`` or ``failed``.
    ``needs_checkpoint``: False for runs that train nothing (a report)."""
    if outcome in ("completed", "stopped"):
        if not needs_checkpoint or checkpoint_exists(checkpoint):
            return "FINISHED", outcome
        missing = f"{outcome}, but its best checkpoint ({checkpoint or 'none'}) is not in storage"
        return ("FAILED" if outcome == "completed" else "KILLED"), missing
    return {"interrupted": "KILLED", "failed": "FAILED"}[outcome], outcome


def outcome_of(exc: BaseException) -> str:
    # KeyboardInterrupt (Ctrl-C, and SIGTERM: platform.errors.cli_main) and SystemExit ask the
    # process to stop; any other exception is an error.
    return "failed" if isinstance(exc, Exception) else "interrupted"


class Run:
    """One MLflow run, as seen by the process that works in it.

    ``closing()`` ends it when the work inside returns (FINISHED once ``complete(checkpoint)`` named
    a checkpoint that exists) or raises; runs inside a Tune trial leave errors to the sweep's
    driver (``ends_on_error=False``), which knows whether Tune stopped the trial or it failed."""

    def __init__(self, uri: str, run_id: str, name: str = "", resumed: bool = False, ends_on_error: bool = True,
                 experiment_id: str = ""):
        self.uri, self.id, self.name, self.resumed = uri, run_id, name, resumed
        self.ends_on_error, self.experiment_id = ends_on_error, experiment_id
        self.checkpoint: str | None = None
        self._completed, self._needs_checkpoint = False, True

    @classmethod
    def create(cls, uri: str, experiment: str, name: str, tags: dict[str, str], parent: "Run | None" = None,
               ends_on_error: bool = True) -> "Run":
        tags = {"git_commit": store.git_commit(), store.DRIVER_TAG: store.driver_id(), **tags}
        if parent is not None:
            tags[store.PARENT_TAG] = parent.id
        if parent is not None:
            experiment_id = parent.experiment_id or parent.info().info.experiment_id
        else:
            experiment_id = store.ensure_experiment(experiment, uri)
        run = store.client(uri).create_run(experiment_id, run_name=name, tags=tags)
        return cls(uri, run.info.run_id, name, ends_on_error=ends_on_error, experiment_id=experiment_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str, ends_on_error: bool = True) -> "Run":
        """An earlier run continued by ``--resume``: RUNNING again, driven by this process."""
        c = store.client(uri)
        info = c.get_run(run_id)
        c.update_run(run_id, status="RUNNING")
        c.set_tag(run_id, store.DRIVER_TAG, store.driver_id())
        c.set_tag(run_id, "platform.resumed", str(int(info.data.tags.get("platform.resumed", "0")) + 1))
        return cls(uri, run_id, info.info.run_name, resumed=True, ends_on_error=ends_on_error,
                   experiment_id=info.info.experiment_id)

    def child(self, name: str, tags: dict[str, str]) -> "Run":
        """A run nested under this one (a seed of a configuration), with the same error policy."""
        return Run.create(self.uri, "", name, tags, parent=self, ends_on_error=self.ends_on_error)

    def info(self):
        """The run as MLflow has it now (status, params, metrics, tags)."""
        return store.client(self.uri).get_run(self.id)

    # -- logging --------------------------------------------------------------------------------

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            store.client(self.uri).log_batch(self.id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        log_metrics(self.uri, self.id, metrics, step)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            store.client(self.uri).log_batch(self.id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        store.client(self.uri).log_artifact(self.id, str(path), artifact_path)

    def log_folder(self, folder: Path, artifact_path: str) -> None:
        store.client(self.uri).log_artifacts(self.id, str(folder), artifact_path)

    def log_table(self, frame, artifact_file: str) -> None:
        """A pandas DataFrame as an MLflow table (shown in the UI's artifact and evaluation views)."""
        store.client(self.uri).log_table(self.id, data=frame, artifact_file=artifact_file)

    def log_corpus(self, location: str, digest: str, num_sentences: int) -> None:
        log_corpus(self.uri, self.id, location, digest, num_sentences)

    # -- the end --------------------------------------------------------------------------------

    def complete(self, checkpoint: str | None, needs_checkpoint: bool = True) -> None:
        """The work is done and its final numbers are logged; ``checkpoint``: its best checkpoint
        (``needs_checkpoint=False`` for a run that trains nothing)."""
        self.checkpoint, self._completed, self._needs_checkpoint = checkpoint, True, needs_checkpoint

    def end(self, outcome: str, checkpoint: str | None = None, only_if_running: bool = False,
            tags: dict[str, str] | None = None, needs_checkpoint: bool = True) -> str | None:
        """End the run with the status ``outcome`` earns (``closing_status``); returns it, or None
        when ``only_if_running`` and someone else already ended the run."""
        if only_if_running and self.info().info.status != "RUNNING":
            return None
        status, reason = closing_status(outcome, checkpoint, needs_checkpoint)
        self.set_tags({END_REASON_TAG: reason, **(tags or {})})
        store.client(self.uri).set_terminated(self.id, status=status)
        return status

    @contextlib.contextmanager
    def closing(self) -> Iterator["Run"]:
        try:
            yield self
        except BaseException as exc:
            if self.ends_on_error:
                try:
                    self.end(outcome_of(exc))
                except Exception as lost:  # the tracking server away: the error that ended the work is the one to tell
                    print(f"note: run {self.id} stays RUNNING in MLflow, which could not be told it ended "
                          f"({' '.join(str(lost).split())[:120]}); --resume of the run closes it", file=sys.stderr)
            raise
        self.end("completed" if self._completed else "failed", self.checkpoint,
                 needs_checkpoint=self._needs_checkpoint)


# ------------------------------------------------------------------------------------------------
# Metrics


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
    if items:
        store.client(uri).log_batch(run_id, metrics=items)


Point = tuple  # (key, value, timestamp in ms, step): one measurement, as MLflow stores it
POINTS_FILE = "metrics.json"  # in a resumable checkpoint: every point of the run up to its step
POINTS_WAIT_ENV = "PLATFORM_TRACKING_WAIT"  # seconds a fit's end waits for an absent tracking server (600)


class TrackingUnavailable(UserError):
    """The tracking server took no delivery until the fit's end and beyond the wait; the run's
    checkpoints (with its points) stay in storage, to be resumed."""


class MetricLog:
    """Rank 0's step metrics of a run, kept with its checkpoints: ``points()`` (every point of the
    steps so far) goes into each resumable checkpoint, and a restart from a checkpoint takes its
    points back (``restore``). Nothing here talks to MLflow except the node's system metrics
    (``system_metrics``): the points reach MLflow through a ``Publisher`` once their checkpoint is
    persisted, so the run's history is that of the checkpoints it keeps: after a restart from the
    checkpoint of step c, the abandoned attempt's points after c were never sent, and the re-run's
    follow, each step once."""

    def __init__(self, uri: str | None = None, run_id: str | None = None, system_metrics: bool = False):
        self.recorded: list[Point] = []
        self.monitor = start_system_metrics(uri, run_id, resume=True) if run_id and system_metrics else None

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        self.recorded.extend((k, float(v), ts, int(step)) for k, v in metrics.items())

    def points(self) -> list[Point]:
        return list(self.recorded)

    def restore(self, points: list[Point], step: int) -> None:
        """The points of a checkpoint of ``step`` this attempt restarts from (none after it)."""
        self.recorded = [tuple(p) for p in points if p[3] <= step]

    def close(self) -> None:
        if self.monitor is not None:
            monitor, self.monitor = self.monitor, None
            # MLflow's monitor sends its last sample on finish, with its client's retries: not
            # waited for beyond a few seconds when the server is away.
            import threading

            threading.Thread(target=monitor.finish, daemon=True).start()


class Publisher:
    """Sends a run's checkpointed points and best-checkpoint tag to MLflow in the background
    (``platform.tracking.delivery``), each point once: called as each checkpoint is persisted
    (Ray Train's controller, or the process runtime), and at a fit's end from its latest
    checkpoint (``finish``), which waits for a server that is away."""

    def __init__(self, uri: str, run_id: str):
        from platform.tracking.delivery import Delivery

        self.uri, self.run_id = uri, run_id
        self.delivery = Delivery(uri, run_id)
        self.sent: set[Point] = set()

    def publish(self, points: list[Point], best_checkpoint: str | None = None) -> None:
        new = [tuple(p) for p in points if tuple(p) not in self.sent]
        self.sent.update(new)
        self.delivery.send(new, {"best_checkpoint": best_checkpoint} if best_checkpoint else None)

    def finish(self, seconds: float | None = None, where: str = "") -> None:
        """Wait until everything published arrived; ``TrackingUnavailable`` after ``seconds``
        (default ``$PLATFORM_TRACKING_WAIT``, 600)."""
        seconds = float(os.environ.get(POINTS_WAIT_ENV) or 600) if seconds is None else seconds
        if not self.delivery.flush(seconds):
            raise TrackingUnavailable(
                f"MLflow at {store.redact(self.uri)} took none of run {self.run_id}'s last metrics within {seconds:g} s "
                f"({self.delivery.last_error or 'no answer'}); the run's checkpoints{where} keep them: resume the run "
                "with --resume once the server is back")


def published_checkpoint(publisher: Publisher, latest: str | None, best: str | None) -> None:
    """A fit's end: the points of its latest checkpoint (every step of the run) and its best
    checkpoint's tag, sent again where anything is missing (MLflow stores nothing twice)."""
    publisher.publish(load_points(latest) if latest else [], best)


def load_points(location: str) -> list[Point]:
    """The step metrics kept in the checkpoint at ``location`` (a folder or a storage URI): every
    point of the run up to its step; none for a checkpoint without them."""
    import json

    text = storage.read_text(storage.join(location, POINTS_FILE))
    return [tuple(p) for p in json.loads(text)] if text else []


def _complete_checkpoints(location: str) -> list[tuple[dict, str]]:
    """(state, folder) of the checkpoints directly under ``location`` (a fit's storage: Ray Train's
    ``checkpoint_*`` folders, or ``latest`` and ``best``) that keep their points."""
    import json

    found = []
    for name in storage.list_dirs(location):
        folder = storage.join(location, name)
        state = storage.read_text(storage.join(folder, "state.json"))
        if state and storage.exists(storage.join(folder, POINTS_FILE)):
            found.append((json.loads(state), folder))
    return found


def latest_checkpoint(location: str) -> str | None:
    """The checkpoint with the highest step under ``location``; None when there is none."""
    found = [(state.get("step", 0), folder) for state, folder in _complete_checkpoints(location)]
    return max(found)[1] if found else None


def best_checkpoint_under(location: str) -> str | None:
    """The checkpoint with the best STS-B dev (the first to reach it) under ``location``; None when
    there is none. For a fit Tune ended before the tag naming its best checkpoint reached MLflow."""
    found = [(-float(state[DEV_METRIC]), state.get("step", 0), folder)
             for state, folder in _complete_checkpoints(location) if DEV_METRIC in state]
    return min(found)[2] if found else None


def deliver_points_under(uri: str, run_id: str, location: str, seconds: float) -> bool:
    """The points of the latest checkpoint under ``location`` (a fit Tune ended before it
    returned) sent where missing; whether they arrived within ``seconds``."""
    latest = latest_checkpoint(location)
    if latest is None:
        return True
    publisher = Publisher(uri, run_id)
    publisher.publish(load_points(latest))
    return publisher.delivery.flush(seconds)


SAMPLING_ENV = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"  # MLflow's own variable, seconds


def start_system_metrics(uri: str | None, run_id: str, resume: bool = False):
    """MLflow's monitor of this node's CPU, memory, disk, network and (NVML) GPU utilisation and
    memory, logged to ``run_id`` as ``system/*`` every ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
    seconds (default 10) until ``finish()``. None where psutil is missing."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    import logging

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter per run
    monitor = SystemMetricsMonitor(run_id, sampling_interval=float(os.environ.get(SAMPLING_ENV, 10)),
                                   samples_before_logging=1, resume_logging=resume, tracking_uri=uri)
    monitor.start()
    return monitor


def log_corpus(uri: str, run_id: str, location: str, digest: str, num_sentences: int) -> None:
    """The training corpus as the run's MLflow dataset input (context ``training``): its source,
    and the content digest the platform's caches are keyed by (MLflow keeps 36 characters of it;
    the full sha256 is the tag ``corpus_sha256``)."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types import ColSpec, Schema

    with warnings.catch_warnings():  # a local path matches two equivalent source types
        warnings.simplefilter("ignore")
        source = resolve_dataset_source(location)
    dataset = MetaDataset(source, name=Path(location).name, digest=digest[:32], schema=Schema([ColSpec("string", "sentence")]))
    store.client(uri).log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(),
                                                               tags=[InputTag("mlflow.data.context", "training")])])
    Run(uri, run_id).set_tags({"corpus_sha256": digest, "corpus_sentences": str(num_sentences)})
