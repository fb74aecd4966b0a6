"""The run record, in one place: an MLflow run's life (created or reopened by ``--resume``, ended
with a status that says what happened) and everything that reaches it from a fit (its step
metrics, the replay that completes them, every other number it logs). Which checkpoint is latest
and best is the checkpoint format's (``platform.checkpoint``).

Statuses:
- FINISHED: the work completed (or a scheduler ended it after a report) and the best checkpoint
  the run names exists in storage;
- KILLED: interrupted (Ctrl-C, SIGTERM, a driver that died), or stopped without a checkpoint;
- FAILED: an error, or work that completed without a checkpoint.
Who ends a run: outside a sweep, the process doing the work (``Run.closing``); in a sweep, the
driver's Tune callback ends every trial's runs from Tune's own trial events
(``platform.sweep_runs``), the work inside only marking them done; ``--resume`` ends the runs a
dead driver left open.

What a fit sends:
- During a fit, rank 0 sends each logged step's metrics (``StepLog``) at once from a background
  sender: a point is in MLflow seconds after its step, whatever the checkpoint interval, and
  training never waits on the tracking server. The points are also saved with every resumable
  checkpoint; once one is persisted, whatever of its points MLflow has not taken goes again.
- A restart from a checkpoint re-runs the steps after it, which the dead attempt had already sent
  (seeded: the same values, at other times): the restarted attempt adopts those points from
  MLflow and drops its own copies, so each step appears once.
- At a fit's end (``finish_fit``), ``replay`` sends the points of the fit's latest
  checkpoint again, waiting for a server that is away: this replay is what a tracking outage costs
  nothing but time. MLflow stores a point once per (key, step, timestamp, value), so what arrives
  twice is stored once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from platform import settings
from platform.checkpoint import Best, best_under, latest_under, load_points
from platform.checkpoint import exists as checkpoint_exists
from platform.errors import UserError, one_line
from platform.tracking import store
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, BEST_PREFIX, CORPUS_SENTENCES_TAG, CORPUS_SHA256_TAG,
                                     DEV_METRIC, DRIVER_TAG, END_REASON_TAG, GIT_COMMIT_TAG, METHOD_TAG, PARENT_TAG,
                                     RECIPE_TAG, RESUMED_TAG, WINNER, WORK_DONE_TAG)



def winner_key(key: str) -> str:
    """The parent's key for a trial's metric: ``best_stsb_dev_spearman`` -> ``best.stsb_dev_spearman``,
    ``sts_avg`` -> ``best.sts_avg``: a sort by a trial metric lists trials only."""
    return WINNER + (key[len(BEST_PREFIX):] if key.startswith(BEST_PREFIX) else key)


def trial_key(key: str) -> str | None:
    """The trial metric a parent's ``best.`` key stands for (None for other keys)."""
    if not key.startswith(WINNER):
        return None
    key = key[len(WINNER):]
    return BEST_PREFIX + key if key.startswith(DEV_METRIC) else key


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
    a checkpoint that exists) or raises. A trial's runs (``in_trial``) are ended by the sweep's
    callback, which knows whether Tune stopped the trial or it failed: ``closing()`` only marks
    the work done (``WORK_DONE_TAG``) when it completes."""

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
        if not self.in_trial:
            OPEN[self.id] = self
        try:
            yield self
        except BaseException as exc:
            if not self.in_trial:
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
        if self.in_trial:
            if self._completed:
                self.set_tags({WORK_DONE_TAG: "true"})
            return
        self.end("completed" if self._completed else "failed", self.checkpoint,
                 needs_checkpoint=self._needs_checkpoint)


# The runs this process is working in (inside ``Run.closing``), for an end that cannot go through
# the work's own stack: the Ray cluster gone (platform.run.ray_env.watch_cluster).
OPEN: dict[str, Run] = {}
FAILED_HERE: dict[str, Run] = {}  # ended FAILED by an error, maybe the cluster's loss seen first as one


def abandon_open_runs(reason: str) -> list[str]:
    """End every run this process works in, and each of their runs still RUNNING (a sweep's
    trials, a configuration's seeds), FAILED with ``reason``, which the runs an error already
    ended FAILED here get too; the names of them all."""
    ended = []
    for run in list(FAILED_HERE.values()):
        run.set_tags({END_REASON_TAG: reason})
        ended.append(run.info().info.run_name)
    for run in list(OPEN.values()):
        for child in store.child_runs(run.uri, run.id, "attributes.status = 'RUNNING'"):
            Run(run.uri, child.info.run_id).set_tags({END_REASON_TAG: reason})
            store.client(run.uri).set_terminated(child.info.run_id, status="FAILED")
            ended.append(child.info.run_name)
        run.set_tags({END_REASON_TAG: reason})
        store.client(run.uri).set_terminated(run.id, status="FAILED")
        ended.append(run.info().info.run_name)
        OPEN.pop(run.id, None)
    return ended


# ------------------------------------------------------------------------------------------------
# Step metrics

Point = tuple  # (key, value, timestamp in ms, step): one measurement, as MLflow stores it
ATTEMPT_TIMEOUT_S = 10.0  # one request to an HTTP server; the replay tries again until its wait ends
BATCH = 1000  # metrics per log-batch request (MLflow's limit)
QUIET_S = 30.0  # after a failed live send, how long the sender rests before it tries again
# How long an evaluation waits for its points to reach MLflow before the fit reports it: a scheduler
# that stops the trial on that report kills its workers at once, and the points still queued with them.
FLUSH_S = 5.0


class StepLog:
    """Rank 0's step metrics of a run (``log(metrics, step)``): each logged step goes to MLflow at
    once, from a background sender (the step never waits on it), and every point is also kept
    with the checkpoints: ``points()`` goes into each resumable checkpoint, ``restore`` takes a
    restarted attempt back to its checkpoint, ``persisted()`` sends again what did not arrive, and
    the fit's end replays the latest checkpoint's points (MLflow keeps an identical point once).

    A restart from an earlier checkpoint re-runs steps whose points the dead attempt had already
    sent (seeded: the same values, at other times): ``restore`` adopts those points from MLflow
    and the re-run's copies of them are dropped, so each step appears once. With a run, MLflow's
    monitor also logs this node's CPU, memory and GPU as ``system/*``. ``tags`` go with the first
    request MLflow takes (who sends the points: ``SENDER_TAG``)."""

    def __init__(self, uri: str | None = None, run_id: str | None = None, system_metrics: bool = False,
                 tags: dict[str, str] | None = None):
        self.uri, self.run_id = uri, run_id
        self._tags = dict(tags or {})  # sent with the first request MLflow takes
        self.recorded: list[Point] = []
        self.sent: set[Point] = set()  # what MLflow took (updated by the sender)
        self.adopted: set[tuple[str, int]] = set()  # (key, step) MLflow holds from a restart's earlier attempt
        self._lock = threading.Lock()
        # One background sender draining what is pending, in order, a batch a request. After a
        # failed request it rests QUIET_S (an outage costs one attempt per rest, not one per
        # step), then catches up on everything MLflow has not taken; the fit's replay is the backstop.
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="mlflow-steps") if run_id else None
        self._pending: list[Point] = []
        self._draining = False
        self._behind = False
        self._quiet_until = 0.0
        self.monitor = _system_metrics(uri, run_id) if run_id and system_metrics else None

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        # A key the earlier attempt already sent at this step keeps that point (a re-run's copy).
        new = [(k, float(v), ts, int(step)) for k, v in metrics.items() if (k, int(step)) not in self.adopted]
        self.recorded.extend(new)
        self._submit(new)

    def points(self) -> list[Point]:
        return list(self.recorded)

    def restore(self, points: list[Point], step: int) -> None:
        """The points of the checkpoint of ``step`` this attempt restarts from, and those MLflow
        already holds of the steps after it (the earlier attempt sent them live; this one re-runs
        them and keeps theirs). MLflow away: none adopted (its outage already cost the live points)."""
        restored = [tuple(p) for p in points if p[3] <= step]
        later = self._sent_after(step, {p[0] for p in points}) if self.run_id else []
        with self._lock:
            self.recorded = restored + later
            self.sent.update(self.recorded)
        self.adopted = {(p[0], p[3]) for p in later}

    def _sent_after(self, step: int, keys: set[str]) -> list[Point]:
        try:
            client = store.client(self.uri)
            keys |= {k for k in client.get_run(self.run_id).data.metrics if not k.startswith("system/")}
            return sorted(((m.key, float(m.value), int(m.timestamp), int(m.step)) for key in keys
                           for m in client.get_metric_history(self.run_id, key) if m.step > step), key=lambda p: p[3])
        except Exception:
            return []

    def persisted(self, points: list[Point] | None = None) -> None:
        """The state holding ``points`` (default: every point so far) is one a restart starts from:
        whatever of them MLflow has not taken yet goes again."""
        with self._lock:
            new = [p for p in (self.recorded if points is None else points) if p not in self.sent]
        self._submit(new)

    def _submit(self, points: list[Point]) -> None:
        if self._sender is None or not points:
            return
        with self._lock:
            if time.monotonic() < self._quiet_until:
                return  # resting after a failure: caught up later, or replayed
            self._pending.extend(points)
            if self._draining:
                return
            self._draining = True
        self._sender.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._behind:  # the first request after an outage: whatever MLflow has not taken
                    batch = [p for p in self.recorded if p not in self.sent][:BATCH]
                else:
                    batch = self._pending[:BATCH]
                if not batch:
                    self._pending, self._behind, self._draining = [], False, False
                    return
            try:
                _send(self.uri, self.run_id, batch, self._tags)
                self._tags = {}
            except Exception:  # the server away: rest, then catch up (persisted() and the replay too)
                with self._lock:
                    self._quiet_until = time.monotonic() + QUIET_S
                    self._pending, self._behind, self._draining = [], True, False
                return
            with self._lock:
                self.sent.update(batch)
                if not self._behind:
                    del self._pending[:len(batch)]

    def flush(self, timeout: float = FLUSH_S) -> bool:
        """Wait, at most ``timeout`` seconds, until the sender has sent what is pending (at once
        while it rests after a failure: nothing is pending then). Whether it has."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._draining:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        """The loop's end: the sends under way finish (one attempt each; a hand call of the loop,
        outside a fit, has no replay after it)."""
        if self._sender is not None:
            self._sender.shutdown(wait=True)
        if self.monitor is not None:
            monitor, self.monitor = self.monitor, None
            # MLflow's monitor sends its last sample on finish, with its client's retries: not
            # waited for when the server is away.
            threading.Thread(target=monitor.finish, daemon=True).start()


# ------------------------------------------------------------------------------------------------
# A fit's end


class TrackingUnavailable(UserError):
    """The tracking server took no delivery until the fit's end and beyond the wait; the run's
    checkpoints (with its points) stay in storage, to be resumed."""


def complete_evaluations(uri: str, run_id: str, evaluations: list[tuple[int, dict[str, float]]],
                         seconds: float | None = None) -> None:
    """A fit's evaluations as its runtime reported them (a sweep: Tune's results), sent where the
    run lacks their step: a trial the scheduler stops between its resumable states, whose worker
    is killed with points still queued, keeps every evaluation it made. A (metric, step) the run
    holds already is not sent again (its value there is the one the worker sent)."""
    if not evaluations:
        return
    client = store.client(uri)
    keys = sorted({k for _, numbers in evaluations for k in numbers})
    try:
        held = {k: {m.step for m in client.get_metric_history(run_id, k)} for k in keys}
    except Exception as exc:  # the server away: the run's checkpoints keep what they hold
        raise TrackingUnavailable(f"MLflow at {store.redact(uri)} did not answer for run {run_id}'s metrics "
                                  f"({one_line(exc, 200)})") from None
    now = int(time.time() * 1000)
    points = [(k, v, now, step) for step, numbers in evaluations for k, v in numbers.items() if step not in held[k]]
    replay(uri, run_id, points, seconds, where=" (Tune's reports)")


def replay(uri: str, run_id: str, points: list[Point], seconds: float | None = None, where: str = "") -> None:
    """Send ``points`` (all of a run's, again: MLflow keeps each once), trying until they arrive or
    ``seconds`` have passed."""
    seconds = settings.number(settings.TRACKING_WAIT) if seconds is None else seconds
    deadline, pause = time.monotonic() + seconds, 0.5
    for i in range(0, len(points), BATCH):
        while True:
            try:
                _send(uri, run_id, points[i : i + BATCH])
                break
            except Exception as exc:  # the server away: tried again until the wait ends
                if time.monotonic() + pause > deadline:
                    raise TrackingUnavailable(
                        f"MLflow at {store.redact(uri)} took none of run {run_id}'s last metrics within {seconds:g} s "
                        f"({one_line(exc, 200)}); the run's checkpoints{where} keep them: resume the "
                        "run with --resume once the server is back") from None
                time.sleep(pause)
                pause = min(pause * 2, 10.0)


def _send(uri: str, run_id: str, points: list[Point], tags: dict[str, str] | None = None) -> None:
    """One ``log-batch`` of metrics (and ``tags``): over HTTP one attempt with a short timeout
    (MLflow's client would retry for minutes inside the call), else through the client (a database
    store)."""
    if not points:
        return
    tags = tags or {}
    if uri.startswith(("http://", "https://")):
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        body = {"run_id": run_id, "metrics": [{"key": k, "value": float(v), "timestamp": int(ts), "step": int(s)}
                                              for k, v, ts, s in points],
                "tags": [{"key": k, "value": str(v)} for k, v in tags.items()]}
        response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/runs/log-batch", "POST",
                                max_retries=0, timeout=ATTEMPT_TIMEOUT_S, json=body)
        verify_rest_response(response, "/api/2.0/mlflow/runs/log-batch")
        return
    from mlflow.entities import Metric, RunTag

    store.client(uri).log_batch(run_id, metrics=[Metric(k, float(v), int(ts), int(s)) for k, v, ts, s in points],
                                tags=[RunTag(k, str(v)) for k, v in tags.items()])


# ------------------------------------------------------------------------------------------------
# A run's other numbers


def log_results(run: Run, metrics: dict[str, Any], step: int = 0) -> None:
    """Numbers that are not step metrics (final scores, seed means, a sweep's winner), at ``step``,
    retried as the fit's replay is."""
    if metrics:
        ts = int(time.time() * 1000)
        replay(run.uri, run.id, [(k, float(v), ts, int(step)) for k, v in metrics.items()])


def link_to_model(run: Run, model_id: str, keys: list[str]) -> None:
    """The run's final point of each of ``keys`` it has (its scores) shown on its logged model
    ``model_id`` too: the same points sent again with the model's id, which the run keeps once
    (a point is its key, step, timestamp and value) and the model lists as its metrics."""
    from mlflow.entities import Metric

    client = store.client(run.uri)
    have = client.get_run(run.id).data.metrics
    last = [max(client.get_metric_history(run.id, k), key=lambda m: (m.step, m.timestamp)) for k in keys if k in have]
    client.log_batch(run.id, metrics=[Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id) for m in last])


def finish_fit(uri: str | None, run_id: str | None, location: str, seconds: float | None = None) -> Best | None:
    """The end of the fit whose checkpoints are under ``location``: its latest checkpoint's points
    replayed to ``run_id`` (waiting up to ``seconds``, default ``$PLATFORM_TRACKING_WAIT`` or 600,
    for a server that is away: ``TrackingUnavailable`` after that), then its best checkpoint
    decided from storage and named on the run (``best_checkpoint``)."""
    best = best_under(location)
    if run_id is None:
        return best
    latest = latest_under(location)
    replay(uri, run_id, load_points(latest) if latest else [], seconds, where=f" ({location})")
    if best is not None:
        name_best(Run(uri, run_id), best.checkpoint)
    return best


def name_best(run: Run, checkpoint: str, tags: dict[str, str] | None = None) -> None:
    """The one writer of ``best_checkpoint``: a fit's best checkpoint (from its storage), or a
    configuration's (or a sweep's), chosen among its fits' (or trials')."""
    run.set_tags({BEST_CHECKPOINT_TAG: checkpoint, **(tags or {})})


def _system_metrics(uri: str | None, run_id: str):
    """MLflow's monitor of this node's CPU, memory, disk, network and (NVML) GPU utilisation and
    memory, logged to ``run_id`` as ``system/*`` every ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
    seconds (default 10) until ``finish()``. None where psutil is missing."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter per run
    monitor = SystemMetricsMonitor(run_id, sampling_interval=settings.number(settings.SYSTEM_METRICS_INTERVAL),
                                   samples_before_logging=1, resume_logging=True, tracking_uri=uri)
    monitor.start()
    return monitor
