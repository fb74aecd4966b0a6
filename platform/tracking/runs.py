"""A run's MLflow life, in one place: created (or reopened by ``--resume``), logged to, and ended
with a status that says what happened.

- FINISHED: the work completed (or a scheduler ended it after a report) and the best checkpoint
  the run names exists in storage;
- KILLED: interrupted (Ctrl-C, SIGTERM, a driver that died), or stopped without a checkpoint;
- FAILED: an error, or work that completed without a checkpoint.

Who ends a run: outside a sweep, the process doing the work (``Run.closing``); in a sweep, the
driver's Tune callback ends every trial's runs from Tune's own trial events
(``platform.sweep_runs``), the work inside only marking them done; ``--resume`` ends the runs a
dead driver left open. Its numbers reach MLflow through ``platform.tracking.recorder``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

from platform import storage
from platform.errors import UserError
from platform.tracking import store

DEV_METRIC = "stsb_dev_spearman"  # STS-B dev Spearman x100: what checkpoints and runs are selected by
BEST = "best_" + DEV_METRIC
END_REASON_TAG = "platform.end_reason"
STORAGE_TAG = "platform.storage"  # where the run's checkpoints and resumable state live
WORK_DONE_TAG = "platform.work_done"  # a trial's run whose work completed, for the sweep's callback to end


WINNER = "best."  # a sweep's parent holds its best trial's numbers under these keys, never the trials' own


def winner_key(key: str) -> str:
    """The parent's key for a trial's metric: ``best_stsb_dev_spearman`` -> ``best.stsb_dev_spearman``,
    ``sts_avg`` -> ``best.sts_avg``: a sort by a trial metric lists trials only."""
    return WINNER + (key[len("best_"):] if key.startswith("best_") else key)


def trial_key(key: str) -> str | None:
    """The trial metric a parent's ``best.`` key stands for (None for other keys)."""
    if not key.startswith(WINNER):
        return None
    key = key[len(WINNER):]
    return "best_" + key if key.startswith(DEV_METRIC) else key


def experiment_note(tags: dict[str, str]) -> str:
    """An experiment's description (Markdown), from the tags of its first run."""
    method, recipe = tags.get("method", "?"), tags.get("recipe", "")
    return (f"Sentence encoders trained with the **{method}** recipe" + (f" (`{recipe}`)" if recipe else "")
            + " by the contrastive sentence-embedding platform. Every run trains from a backbone and is selected "
            f"by STS-B dev (`{BEST}`, Spearman x100). A sweep is a parent run (tag `sweep=true`) with a child run "
            "per trial: its description names the winner and links the view of its trials; its registered "
            "model is under Models.")


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
    a checkpoint that exists) or raises. A trial's runs (``in_trial``) are ended by the sweep's
    callback, which knows whether Tune stopped the trial or it failed: ``closing()`` only marks
    the work done (``WORK_DONE_TAG``) when it completes."""

    def __init__(self, uri: str, run_id: str, name: str = "", resumed: bool = False, in_trial: bool = False,
                 experiment_id: str = ""):
        self.uri, self.id, self.name, self.resumed = uri, run_id, name, resumed
        self.in_trial, self.experiment_id = in_trial, experiment_id
        self.checkpoint: str | None = None
        self._completed, self._needs_checkpoint = False, True

    @classmethod
    def create(cls, uri: str, experiment: str, name: str, tags: dict[str, str], parent: "Run | None" = None,
               in_trial: bool = False) -> "Run":
        tags = {"git_commit": store.git_commit(), store.DRIVER_TAG: store.driver_id(), **tags}
        if parent is not None:
            tags[store.PARENT_TAG] = parent.id
            experiment_id = parent.experiment_id or parent.info().info.experiment_id
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
        c.set_tag(run_id, store.DRIVER_TAG, store.driver_id())
        c.set_tag(run_id, "platform.resumed", str(int(info.data.tags.get("platform.resumed", "0")) + 1))
        return cls(uri, run_id, info.info.run_name, resumed=True, in_trial=in_trial,
                   experiment_id=info.info.experiment_id)

    def child(self, name: str, tags: dict[str, str]) -> "Run":
        """A run nested under this one (a seed of a configuration), ended by the same owner."""
        return Run.create(self.uri, "", name, tags, parent=self, in_trial=self.in_trial)

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
            if not self.in_trial:
                try:
                    self.end(outcome_of(exc))
                except Exception as lost:  # the tracking server away: the error that ended the work is the one to tell
                    print(f"note: run {self.id} stays RUNNING in MLflow, which could not be told it ended "
                          f"({' '.join(str(lost).split())[:120]}); --resume of the run closes it", file=sys.stderr)
            raise
        if self.in_trial:
            if self._completed:
                self.set_tags({WORK_DONE_TAG: "true"})
            return
        self.end("completed" if self._completed else "failed", self.checkpoint,
                 needs_checkpoint=self._needs_checkpoint)


# ------------------------------------------------------------------------------------------------
# Outside the run's life


class TrackingUnavailable(UserError):
    """The tracking server took no delivery until the fit's end and beyond the wait; the run's
    checkpoints (with its points) stay in storage, to be resumed."""


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
