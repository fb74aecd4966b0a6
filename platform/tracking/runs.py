"""A run's MLflow life, in one place: created (or reopened by ``--resume``), logged to, and ended
with a status that says what happened.

- FINISHED: the work completed (or a scheduler ended it after a report) and the best checkpoint
  the run names exists in storage;
- KILLED: interrupted (Ctrl-C, SIGTERM, a driver that died), or stopped without a checkpoint;
- FAILED: an error, or work that completed without a checkpoint.

Whoever sees a run's end first ends it: the process doing the work, when the work completes (and,
outside a sweep, when it fails or is interrupted); the sweep's driver when Tune ends a trial
otherwise; ``--resume`` for runs whose driver died. Step metrics are delivered when the checkpoint
of their step is reported (``MetricLog``), and a best score only once its checkpoint is persisted
(``record_best``), so a run never shows a number its checkpoints cannot back.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator

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
                self.end(outcome_of(exc))
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


class MetricLog:
    """Rank 0's step metrics of a run, delivered when the checkpoint of their step is reported
    (``commit``): a run restarted from checkpoint c trains the steps after c again, and the
    history shows each step once, with the values of the run that produced the checkpoints.

    ``resumed``: the run already holds points; a point at or before the last step logged for its
    key is dropped (a checkpoint whose report was cut after its points went out)."""

    def __init__(self, uri: str | None, run_id: str | None, resumed: bool = False, system_metrics: bool = False):
        self.uri, self.run_id, self.resumed = uri, run_id, resumed
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.logged_until: dict[str, int] = {}
        self.monitor = start_system_metrics(uri, run_id, resume=resumed) if run_id and system_metrics else None

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        if self.run_id:
            self.pending.append((step, dict(metrics)))

    def _last_step(self, key: str) -> int:
        if key not in self.logged_until:
            history = store.client(self.uri).get_metric_history(self.run_id, key) if self.resumed else []
            self.logged_until[key] = max((m.step for m in history), default=-1)
        return self.logged_until[key]

    def commit(self) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = []
        for step, metrics in self.pending:
            for key, value in metrics.items():
                if step > self._last_step(key):
                    items.append(Metric(key, float(value), ts, step))
                    self.logged_until[key] = step
        self.pending = []
        for i in range(0, len(items), 1000):
            store.client(self.uri).log_batch(self.run_id, metrics=items[i : i + 1000])

    def close(self) -> None:
        if self.run_id:
            self.commit()
        if self.monitor is not None:
            self.monitor.finish()
            self.monitor = None


def record_best(log: MetricLog, step: int, best: float, checkpoint: str | None) -> None:
    """After the checkpoint of ``step`` is persisted: the run's best score so far, and, when this
    checkpoint is the new best, the tag naming it. A best score is never logged before the
    checkpoint that backs it exists in storage."""
    if not log.run_id:
        return
    log({BEST: best}, step)
    log.commit()
    if checkpoint is not None:
        Run(log.uri, log.run_id).set_tags({"best_checkpoint": checkpoint})


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
