"""What reaches MLflow from a fit, in one place: its step metrics, the replay that completes them,
the best checkpoint, and every other number a run logs.

- During a fit, rank 0 keeps each step's metrics as points (``StepLog``) and saves them with every
  resumable checkpoint. Once a checkpoint is one a restart would start from (in storage and, under
  Ray, committed by Train's controller) its new points are sent in the background, one attempt
  each: training never waits on the tracking server, and a restart from a checkpoint never shows
  points of the attempt it abandoned (no such checkpoint held them, so they were never sent).
- At a fit's end (its own, the sweep's Tune callback for a trial Tune ended, or ``--resume``),
  ``finish_fit`` replays the points of the fit's latest checkpoint, waiting for a server that is
  away: this replay is what a tracking outage costs nothing but time. MLflow stores a point once
  per (key, step, timestamp, value), so what arrives twice is stored once.
- ``finish_fit`` also decides the fit's best checkpoint, from storage: the checkpoint with the
  best STS-B dev (the first to reach it), never a tag that may lag behind it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from platform import settings, storage
from platform.tracking import store
from platform.tracking.runs import DEV_METRIC, Run, TrackingUnavailable

Point = tuple  # (key, value, timestamp in ms, step): one measurement, as MLflow stores it
POINTS_FILE = "metrics.json"  # in a resumable checkpoint: every point of the run up to its step
ATTEMPT_TIMEOUT_S = 10.0  # one request to an HTTP server; the replay tries again until its wait ends
BATCH = 1000  # metrics per log-batch request (MLflow's limit)


class StepLog:
    """Rank 0's step metrics of a run (``log(metrics, step)``), kept with its checkpoints:
    ``points()`` goes into each resumable checkpoint, ``restore`` takes a restarted attempt back
    to its checkpoint's points, and ``persisted()`` sends what a persisted checkpoint added. With
    a run, MLflow's monitor also logs this node's CPU, memory and GPU as ``system/*``."""

    def __init__(self, uri: str | None = None, run_id: str | None = None, system_metrics: bool = False):
        self.uri, self.run_id = uri, run_id
        self.recorded: list[Point] = []
        self.sent: set[Point] = set()
        # One background sender, in order; what it fails to deliver, the fit's replay delivers.
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="mlflow-steps") if run_id else None
        self.monitor = _system_metrics(uri, run_id) if run_id and system_metrics else None

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        self.recorded.extend((k, float(v), ts, int(step)) for k, v in metrics.items())

    def points(self) -> list[Point]:
        return list(self.recorded)

    def restore(self, points: list[Point], step: int) -> None:
        """The points of the checkpoint of ``step`` this attempt restarts from (none after it)."""
        self.recorded = [tuple(p) for p in points if p[3] <= step]
        self.sent.update(self.recorded)  # the earlier attempt (or the replay) sent them

    def persisted(self, points: list[Point] | None = None) -> None:
        """The state holding ``points`` (default: every point so far) is one a restart starts from:
        its new points go out."""
        new = [p for p in (self.recorded if points is None else points) if p not in self.sent]
        if self._sender is None or not new:
            return
        self.sent.update(new)
        self._sender.submit(_try_send, self.uri, self.run_id, new)

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


def load_points(location: str) -> list[Point]:
    """The step metrics kept in the checkpoint at ``location`` (a folder or a storage URI)."""
    text = storage.read_text(storage.join(location, POINTS_FILE))
    return [tuple(p) for p in json.loads(text)] if text else []


# ------------------------------------------------------------------------------------------------
# A fit's end


def checkpoints_under(location: str) -> list[tuple[dict, str]]:
    """(state, location) of each checkpoint directly under a fit's storage (Ray Train's
    ``checkpoint_*`` folders, or the process runtime's ``latest`` and ``best``)."""
    found = []
    for name in storage.list_dirs(location):
        folder = storage.join(location, name)
        state = storage.read_text(storage.join(folder, "state.json"))
        if state:
            found.append((json.loads(state), folder))
    return found


def latest_under(location: str) -> str | None:
    """The checkpoint with the highest step that keeps the run's points; None when there is none."""
    found = [(state.get("step", 0), folder) for state, folder in checkpoints_under(location)
             if storage.exists(storage.join(folder, POINTS_FILE))]
    return max(found)[1] if found else None


def best_under(location: str) -> tuple[str, float] | None:
    """The checkpoint with the best STS-B dev under a fit's storage (the first step to reach it),
    and that score; None when no checkpoint was evaluated."""
    found = [(-float(state[DEV_METRIC]), state.get("step", 0), folder)
             for state, folder in checkpoints_under(location) if DEV_METRIC in state]
    if not found:
        return None
    dev, _, folder = min(found)
    return folder, -dev


def finish_fit(uri: str | None, run_id: str | None, location: str, seconds: float | None = None) -> tuple[str, float] | None:
    """The end of the fit whose checkpoints are under ``location``: its latest checkpoint's points
    replayed to ``run_id`` (waiting up to ``seconds``, default ``$PLATFORM_TRACKING_WAIT`` or 600,
    for a server that is away: ``TrackingUnavailable`` after that), then its best checkpoint
    decided from storage and named on the run (``best_checkpoint``). Returns (best, its dev)."""
    best = best_under(location)
    if run_id is None:
        return best
    latest = latest_under(location)
    replay(uri, run_id, load_points(latest) if latest else [], seconds, where=f" ({location})")
    if best is not None:
        Run(uri, run_id).set_tags({"best_checkpoint": best[0]})
    return best


def replay(uri: str, run_id: str, points: list[Point], seconds: float | None = None, where: str = "") -> None:
    """Send ``points`` (all of a run's, again: MLflow keeps each once), trying until they arrive or
    ``seconds`` have passed."""
    seconds = settings.number(settings.TRACKING_WAIT, 600) if seconds is None else seconds
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
                        f"({' '.join(str(exc).split())[:200]}); the run's checkpoints{where} keep them: resume the "
                        "run with --resume once the server is back") from None
                time.sleep(pause)
                pause = min(pause * 2, 10.0)


def _try_send(uri: str, run_id: str, points: list[Point]) -> None:
    try:
        _send(uri, run_id, points)
    except Exception:  # the replay at the fit's end delivers what this attempt could not
        pass


def _send(uri: str, run_id: str, points: list[Point]) -> None:
    """One ``log-batch`` of metrics: over HTTP one attempt with a short timeout (MLflow's client
    would retry for minutes inside the call), else through the client (a database store)."""
    if not points:
        return
    if uri.startswith(("http://", "https://")):
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        body = {"run_id": run_id, "metrics": [{"key": k, "value": float(v), "timestamp": int(ts), "step": int(s)}
                                              for k, v, ts, s in points]}
        response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/runs/log-batch", "POST",
                                max_retries=0, timeout=ATTEMPT_TIMEOUT_S, json=body)
        verify_rest_response(response, "/api/2.0/mlflow/runs/log-batch")
        return
    from mlflow.entities import Metric

    store.client(uri).log_batch(run_id, metrics=[Metric(k, float(v), int(ts), int(s)) for k, v, ts, s in points])


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


def name_best(run: Run, checkpoint: str, tags: dict[str, str] | None = None) -> None:
    """A configuration's (or a sweep's) best checkpoint, chosen among its fits' (or trials')."""
    run.set_tags({"best_checkpoint": checkpoint, **(tags or {})})


def _system_metrics(uri: str | None, run_id: str):
    """MLflow's monitor of this node's CPU, memory, disk, network and (NVML) GPU utilisation and
    memory, logged to ``run_id`` as ``system/*`` every ``$MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL``
    seconds (default 10) until ``finish()``. None where psutil is missing."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter per run
    monitor = SystemMetricsMonitor(run_id, sampling_interval=settings.number(settings.SYSTEM_METRICS_INTERVAL, 10),
                                   samples_before_logging=1, resume_logging=True, tracking_uri=uri)
    monitor.start()
    return monitor
