"""A run's one writer: the points a report carries (``points_in``) and any other work on the run,
sent in order from a background thread by the process that ends the run (``RunWriter``); see
``platform.tracking.recorder`` for who that process is."""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from typing import Any, Callable

from platform import settings
from platform.errors import UserError, one_line
from platform.tracking import store
from platform.tracking.names import POINTS


Point = tuple  # (key, value, timestamp in ms, step): one measurement, as MLflow stores it
ATTEMPT_TIMEOUT_S = 10.0  # one request to an HTTP server; a failed one is tried again after a pause
BATCH = 1000  # metrics per log-batch request (MLflow's limit)
MAX_PAUSE_S = 10.0  # the longest pause between two attempts while the server is away
TRIES = 5  # attempts of a request that failed otherwise than by an absent server (a store busy with another writer)
IDLE_S = 30.0  # how long a writer's thread waits for work before it ends (the next log starts another)
MAX_QUEUED = 200_000  # points a writer holds for a server that is away; beyond, they wait in the checkpoints


def points_in(result: dict[str, Any]) -> list[Point]:
    """The points a report carries (``POINTS``: what the loop's rank 0 logged since its last
    report), as tuples."""
    raw = result.get(POINTS)
    return [tuple(p) for p in json.loads(raw)] if raw else []


class TrackingUnavailable(UserError):
    """The tracking server took no delivery until the fit's end and beyond the wait; the run's
    checkpoints (with its points) stay in storage, to be resumed."""


class RunWriter:
    """The one writer of the runs this process owns: each report's points (``log``) and any other
    work on a run (``call``: ending it), done in order by one background thread, so that the
    caller (the loop's report, Tune's driver loop) never waits on MLflow. A request that fails
    is tried again after a pause, in order: until it succeeds while the server does not answer
    (an outage costs time, not points, up to ``MAX_QUEUED`` of them; beyond, the checkpoints keep
    them for ``--resume``), ``TRIES`` times where it answered with an error. Each (key, step) reaches a run once: a restart re-runs steps whose
    points the run holds (seeded: the same values) and ``--resume`` replays a checkpoint's
    points; what MLflow holds of a run is read once, before the first points sent to it."""

    def __init__(self, uri: str):
        self.uri = uri
        self._queue: collections.deque = collections.deque()  # ("points", run_id, points) | ("call", fn, what)
        self._queued_points, self._busy, self.dropped = 0, False, 0
        self._held: dict[str, set[tuple[str, int]]] = {}  # per run: the (key, step) MLflow has
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def log(self, run_id: str, points: list[Point]) -> None:
        if not points or self._closed:
            return
        with self._cond:
            if self._queued_points + len(points) > MAX_QUEUED:
                if not self.dropped:
                    print(f"note: MLflow at {store.redact(self.uri)} has taken no points for a while; the next ones wait "
                          "in the runs' checkpoints (--resume sends them)", file=sys.stderr, flush=True)
                self.dropped += len(points)
                return
            self._queue.append(("points", run_id, list(points)))
            self._queued_points += len(points)
            self._wake()

    def call(self, fn: Callable[[], None], what: str) -> None:
        """``fn`` run by the writer's thread once everything queued before it is done; ``what``
        names it in the note printed when it fails otherwise than by an absent server."""
        with self._cond:
            self._queue.append(("call", fn, what))
            self._wake()

    def flush(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until everything queued is done; whether it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        return True

    def close(self, timeout: float = 0.0) -> bool:
        """Wait, at most ``timeout`` seconds, for what is queued; then drop the rest (the checkpoints
        keep the points) and end the thread. Whether nothing was dropped."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._queued_points = 0
            self._cond.notify_all()
        return done

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="mlflow-writer", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _work(self) -> None:
        pause, failures = 0.5, 0
        while True:
            with self._cond:
                while not self._queue:
                    self._busy = False
                    if self._closed:
                        self._thread = None
                        return
                    self._cond.notify_all()
                    if not self._cond.wait(IDLE_S) and not self._queue:
                        self._thread = None  # a writer with nothing to do holds no thread
                        return
                head, merged = self._queue[0], 1
                item = head
                if head[0] == "points":  # what is queued behind for the same run goes in the same request
                    points = list(head[2])
                    while (merged < len(self._queue) and self._queue[merged][0] == "points"
                           and self._queue[merged][1] == head[1] and len(points) + len(self._queue[merged][2]) <= BATCH):
                        points += self._queue[merged][2]
                        merged += 1
                    item = ("points", head[1], points)
                self._busy = True
            try:
                self._do(item)
                pause, failures = 0.5, 0
            except Exception as exc:  # noqa: BLE001 - the server away: the same item again, after a pause
                failures += 1
                if _unreachable(exc) or failures < TRIES:
                    with self._cond:
                        if not self._closed:
                            self._cond.wait(pause)
                    pause = min(pause * 2, MAX_PAUSE_S)
                    continue
                what = item[2] if item[0] == "call" else f"sending run {item[1]}'s points"
                print(f"note: {what} failed {failures} times ({one_line(exc, 200)})", file=sys.stderr, flush=True)
                pause, failures = 0.5, 0
            with self._cond:
                if self._queue and self._queue[0] is head:
                    for _ in range(merged):
                        self._queue.popleft()
                    self._queued_points -= len(item[2]) if item[0] == "points" else 0

    def _do(self, item) -> None:
        if item[0] == "call":
            item[1]()
            return
        run_id = item[1]
        if run_id not in self._held:
            c = store.client(self.uri)
            keys = [k for k in c.get_run(run_id).data.metrics if not k.startswith("system/")]
            self._held[run_id] = {(k, int(m.step)) for k in keys for m in c.get_metric_history(run_id, k)}
        held, new, seen = self._held[run_id], [], set()
        for p in item[2]:  # the first of each (key, step) not held yet
            if (p[0], int(p[3])) not in held and (p[0], int(p[3])) not in seen:
                seen.add((p[0], int(p[3])))
                new.append(p)
        for i in range(0, len(new), BATCH):
            send(self.uri, run_id, new[i : i + BATCH])
            held.update((p[0], int(p[3])) for p in new[i : i + BATCH])


def _unreachable(exc: Exception) -> bool:
    """Whether ``exc`` says that the tracking server did not answer (tried again), rather than that
    it refused the request."""
    text = f"{type(exc).__name__} {exc}"
    return any(w in text for w in ("Connection", "Timeout", "timed out", "Max retries", "502", "503", "504",
                                   "database is locked"))


def delivered(writer: RunWriter, run_id: str, seconds: float | None = None, where: str = "") -> None:
    """Wait until ``writer`` has sent what it holds (``seconds``, default ``$PLATFORM_TRACKING_WAIT``
    or 600); ``TrackingUnavailable`` after that."""
    seconds = settings.number(settings.TRACKING_WAIT) if seconds is None else seconds
    if not writer.flush(seconds) or writer.dropped:
        raise TrackingUnavailable(
            f"MLflow at {store.redact(writer.uri)} took none of run {run_id}'s last metrics within {seconds:g} s; the "
            f"run's checkpoints{where} keep them: resume the run with --resume once the server is back")


def send(uri: str, run_id: str, points: list[Point], tags: dict[str, str] | None = None) -> None:
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
