"""The run record, in one place: an MLflow run's life (created or reopened by ``--resume``, ended
with a status that says what happened) and everything that reaches it (the points its reports
carry, every other number it logs). Which checkpoint is latest and best is the checkpoint
format's (``platform.checkpoint``).

Statuses:
- FINISHED: the work completed (or a scheduler ended it after a report) and the best checkpoint
  the run names exists in storage;
- KILLED: interrupted (Ctrl-C, SIGTERM, a driver that died), or stopped without a checkpoint;
- FAILED: an error, or work that completed without a checkpoint.

One writer per run: the process that ends a run writes its points. Outside a sweep that is the
process that runs the fit (``Run.closing``): a ``RunWriter`` sends the points the loop's reports
carry (in-process, or handed over by Ray Train's controller). In a sweep it is the driver: its
Tune callback writes the points of each result Tune hands it and ends the trial's run when Tune
ends the trial (``platform.sweep_runs``). Workers never contact MLflow. A state checkpoint keeps
the points so far; a restart from it (Ray Train's, or ``--resume`` after a lost driver) reports
them again with its first report, and the writer sends each (key, step) once.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from platform import settings
from platform.checkpoint import exists as checkpoint_exists
from platform.errors import one_line
from platform.tracking import store
from platform.tracking.writer import MAX_PAUSE_S, TrackingUnavailable, send
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, CORPUS_SENTENCES_TAG, CORPUS_SHA256_TAG,
                                     DRIVER_TAG, END_REASON_TAG, GIT_COMMIT_TAG, METHOD_TAG, PARENT_TAG,
                                     RECIPE_TAG, RESUMED_TAG)



def experiment_note(tags: dict[str, str]) -> str:
    """An experiment's description (Markdown), from the tags of its first run."""
    method, recipe = tags.get(METHOD_TAG, "?"), tags.get(RECIPE_TAG, "")
    return (f"Sentence encoders trained with the **{method}** recipe" + (f" (`{recipe}`)" if recipe else "")
            + " by the contrastive sentence-embedding platform. Every run trains from a backbone and is selected "
            f"by STS-B dev (`{BEST}`, Spearman x100). A sweep is a parent run (tag `sweep=true`) with a child run "
            "per trial: its description names the winner and links the view of its trials; its registered "
            "model is under Models.")


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


class Run:
    """One MLflow run, as seen by the process that works in it.

    ``closing()`` ends it when the work inside returns (FINISHED once ``complete(checkpoint)`` named
    a checkpoint that exists) or raises. A trial's own run (``in_trial``) is written and ended
    by the sweep's driver, which knows whether Tune stopped the trial or it failed."""

    def __init__(self, uri: str, run_id: str, name: str = "", resumed: bool = False, in_trial: bool = False,
                 experiment_id: str = ""):
        self.uri, self.id, self.name, self.resumed = uri, run_id, name, resumed
        self.in_trial, self._experiment_id = in_trial, experiment_id
        self.checkpoint: str | None = None
        self._completed, self._needs_checkpoint = False, True

    @property
    def experiment_id(self) -> str:
        """Known when the run was created or reopened here; asked of MLflow once otherwise."""
        if not self._experiment_id:
            self._experiment_id = self.info().info.experiment_id
        return self._experiment_id

    @classmethod
    def create(cls, uri: str, experiment: str, name: str, tags: dict[str, str], parent: "Run | None" = None,
               in_trial: bool = False) -> "Run":
        tags = {GIT_COMMIT_TAG: store.git_commit(), DRIVER_TAG: store.driver_id(), **tags}
        if parent is not None:
            tags[PARENT_TAG] = parent.id
            experiment_id = parent.experiment_id
        else:
            experiment_id = store.ensure_experiment(experiment, uri, experiment_note(tags))
        run = store.client(uri).create_run(experiment_id, run_name=name, tags=tags)
        return cls(uri, run.info.run_id, name, in_trial=in_trial, experiment_id=experiment_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str, in_trial: bool = False) -> "Run":
        """An earlier run continued by ``--resume``: RUNNING again, driven by this process."""
        c = store.client(uri)
        info = c.get_run(run_id)
        c.update_run(run_id, status="RUNNING")
        c.set_tag(run_id, DRIVER_TAG, store.driver_id())
        c.set_tag(run_id, RESUMED_TAG, str(int(info.data.tags.get(RESUMED_TAG, "0")) + 1))
        return cls(uri, run_id, info.info.run_name, resumed=True, in_trial=in_trial,
                   experiment_id=info.info.experiment_id)

    def child(self, name: str, tags: dict[str, str]) -> "Run":
        """A run nested under this one (a seed of a configuration), ended by the process that runs its fit."""
        return Run.create(self.uri, "", name, tags, parent=self)

    def info(self):
        """The run as MLflow has it now (status, params, metrics, tags)."""
        return store.client(self.uri).get_run(self.id)

    # -- logging --------------------------------------------------------------------------------

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            store.client(self.uri).log_batch(self.id, params=items[i : i + 100])

    def log_config(self, cfg, extra: dict[str, Any] | None = None) -> None:
        """A configuration: its recipe values as params (``TrainConfig.tracked``), where and how it
        ran as ``config.json`` and a few ``run.*`` tags."""
        params, tags = cfg.tracked()
        self.log_params({**params, **(extra or {})})
        self.set_tags(tags)
        self.log_dict(cfg.flat(), "config.json")

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            store.client(self.uri).log_batch(self.id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        store.client(self.uri).log_artifact(self.id, str(path), artifact_path)

    def log_folder(self, folder: Path, artifact_path: str) -> None:
        store.client(self.uri).log_artifacts(self.id, str(folder), artifact_path)

    def log_dict(self, values: dict, artifact_file: str) -> None:
        store.client(self.uri).log_dict(self.id, values, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        store.client(self.uri).log_text(self.id, text, artifact_file)

    def log_table(self, frame, artifact_file: str) -> None:
        """A pandas DataFrame as an MLflow table (shown in the UI's artifact and evaluation views)."""
        store.client(self.uri).log_table(self.id, data=frame, artifact_file=artifact_file)

    def log_corpus(self, location: str, digest: str, num_sentences: int) -> None:
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
        dataset = MetaDataset(source, name=Path(location).name, digest=digest[:32],
                              schema=Schema([ColSpec("string", "sentence")]))
        store.client(self.uri).log_inputs(self.id, datasets=[DatasetInput(
            dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", "training")])])
        self.set_tags({CORPUS_SHA256_TAG: digest, CORPUS_SENTENCES_TAG: str(num_sentences)})

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
        OPEN[self.id] = self
        try:
            yield self
        except BaseException as exc:
            try:
                # KeyboardInterrupt (Ctrl-C, and SIGTERM: platform.errors.cli_main) and SystemExit
                # ask the process to stop; any other exception is an error.
                if self.end("failed" if isinstance(exc, Exception) else "interrupted") == "FAILED":
                    FAILED_HERE[self.id] = self
            except Exception as lost:  # the tracking server away: the error that ended the work is the one to tell
                print(f"note: run {self.id} stays RUNNING in MLflow, which could not be told it ended "
                      f"({one_line(lost, 120)}); --resume of the run closes it", file=sys.stderr)
            raise
        finally:
            OPEN.pop(self.id, None)
        self.end("completed" if self._completed else "failed", self.checkpoint, needs_checkpoint=self._needs_checkpoint)


# The runs this process is working in (inside ``Run.closing``), for an end that cannot go through
# the work's own stack: the Ray cluster gone (platform.run.ray_env.watch_cluster).
OPEN: dict[str, Run] = {}
FAILED_HERE: dict[str, Run] = {}  # ended FAILED by an error, maybe the cluster's loss seen first as one


def abandon_open_runs(reason: str, outcome: str = "failed") -> list[str]:
    """End every run this process works in, and each of their runs still RUNNING (a sweep's
    trials, a configuration's seeds), with ``outcome`` (FAILED; ``interrupted``: KILLED, for a
    command that was stopping) and ``reason``, which the runs an error already ended FAILED here
    get too; the names of them all."""
    ended = []
    for run in list(FAILED_HERE.values()):
        if outcome == "failed":
            run.set_tags({END_REASON_TAG: reason})
        else:  # the error was the stop's doing
            run.end(outcome, tags={END_REASON_TAG: reason})
        ended.append(run.info().info.run_name)
    for run in list(OPEN.values()):
        ended += end_with_children(run, outcome, reason)
        OPEN.pop(run.id, None)
    return ended


def end_with_children(run: Run, outcome: str, reason: str) -> list[str]:
    """End ``run`` and its runs still RUNNING (a sweep's trials, a configuration's seeds) with
    ``outcome`` and ``reason``, for a process that ends them in place of the one that worked in
    them; the names of them all."""
    ended = []
    for child in store.child_runs(run.uri, run.id, "attributes.status = 'RUNNING'"):
        Run(run.uri, child.info.run_id).end(outcome, tags={END_REASON_TAG: reason})
        ended.append(child.info.run_name)
    run.end(outcome, tags={END_REASON_TAG: reason})
    return [*ended, run.info().info.run_name]


# ------------------------------------------------------------------------------------------------
# A run's other numbers


def log_results(run: Run, metrics: dict[str, Any], step: int = 0, seconds: float | None = None) -> None:
    """Numbers that are not step metrics (final scores, seed means, a sweep's winner), at ``step``,
    tried until they arrive or ``seconds`` (default ``$PLATFORM_TRACKING_WAIT``) have passed."""
    if not metrics:
        return
    ts = int(time.time() * 1000)
    points = [(k, float(v), ts, int(step)) for k, v in metrics.items()]
    seconds = settings.number(settings.TRACKING_WAIT) if seconds is None else seconds
    deadline, pause = time.monotonic() + seconds, 0.5
    while True:
        try:
            return send(run.uri, run.id, points)
        except Exception as exc:  # the server away: tried again until the wait ends
            if time.monotonic() + pause > deadline:
                raise TrackingUnavailable(f"MLflow at {store.redact(run.uri)} took none of run {run.id}'s results within "
                                          f"{seconds:g} s ({one_line(exc, 200)})") from None
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)


def link_to_model(run: Run, model_id: str, keys: list[str]) -> None:
    """The run's final point of each of ``keys`` it has (its scores) shown on its logged model
    ``model_id`` too: the same points sent again with the model's id, which the run keeps once
    (a point is its key, step, timestamp and value) and the model lists as its metrics."""
    from mlflow.entities import Metric

    client = store.client(run.uri)
    have = client.get_run(run.id).data.metrics
    last = [max(client.get_metric_history(run.id, k), key=lambda m: (m.step, m.timestamp)) for k in keys if k in have]
    client.log_batch(run.id, metrics=[Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id) for m in last])


def name_best(run: Run, checkpoint: str, tags: dict[str, str] | None = None) -> None:
    """The one writer of ``best_checkpoint``: a fit's best checkpoint (from its storage), or a
    configuration's (or a sweep's), chosen among its fits' (or trials')."""
    run.set_tags({**best_tags(checkpoint), **(tags or {})})


def best_tags(checkpoint: str | None) -> dict[str, str]:
    """What naming ``checkpoint`` the run's best writes (none for no checkpoint): ``name_best``'s
    tags, for a run that ends in the same request (``Run.end(tags=...)``)."""
    return {BEST_CHECKPOINT_TAG: checkpoint} if checkpoint else {}
