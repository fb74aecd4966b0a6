"""Delivery of a run's metrics and tags to MLflow in the background: training never waits on the
tracking server.

A ``Delivery`` owns one thread that sends what it is given, in order, and keeps retrying what did
not arrive (the server restarting, a network cut) with a growing pause, so a tracking outage costs
the run nothing but a late chart. Metrics carry the time they were measured, so sending one again
(after a lost answer, or from a checkpoint's record after a restart) stores nothing twice: MLflow
keeps one row per (key, step, timestamp, value).

``flush(seconds)`` waits for everything given so far; what an outage kept back after that is the
caller's to report (its points are also in the run's checkpoints, ``platform.tracking.runs``).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

ATTEMPT_TIMEOUT_S = 10.0  # one request; a server that does not answer in this time is retried
MAX_PAUSE_S = 10.0  # the longest pause between attempts during an outage


class Delivery:
    """Batches of metrics (``(key, value, timestamp_ms, step)``) and tags for one run, sent in
    order by a daemon thread."""

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self._queue: queue.Queue = queue.Queue()
        self._unsent = 0  # batches given and not yet delivered
        self._lock = threading.Condition()
        self.failures = 0  # attempts that did not arrive (for tests and notes)
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name=f"mlflow-delivery-{run_id[:8]}", daemon=True)
        self._thread.start()

    def send(self, metrics: list[tuple[str, float, int, int]] = (), tags: dict[str, str] | None = None) -> None:
        if not metrics and not tags:
            return
        with self._lock:
            self._unsent += 1
        self._queue.put((list(metrics), dict(tags or {})))

    @property
    def pending(self) -> int:
        with self._lock:
            return self._unsent

    def flush(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for everything sent so far; whether it all arrived."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while self._unsent and time.monotonic() < deadline:
                self._lock.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return not self._unsent

    def _run(self) -> None:
        while True:
            metrics, tags = self._queue.get()
            pause = 0.5
            for i in range(0, max(len(metrics), 1), 1000):  # MLflow takes 1,000 metrics per batch
                chunk = metrics[i : i + 1000]
                while True:
                    try:
                        post_batch(self.uri, self.run_id, chunk, tags if i == 0 else {})
                        break
                    except Exception as exc:  # the server away; the batch is kept and sent again
                        self.failures += 1
                        self.last_error = " ".join(str(exc).split())[:200]
                        time.sleep(pause)
                        pause = min(pause * 2, MAX_PAUSE_S)
            with self._lock:
                self._unsent -= 1
                self._lock.notify_all()


def post_batch(uri: str, run_id: str, metrics: list[tuple[str, float, int, int]], tags: dict[str, str]) -> None:
    """One ``log-batch``: over HTTP as one attempt with a short timeout (MLflow's client would retry
    for minutes inside the call), else through the client (a database store)."""
    if uri.startswith(("http://", "https://")):
        from mlflow.utils.credentials import get_default_host_creds
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        body: dict[str, Any] = {
            "run_id": run_id,
            "metrics": [{"key": k, "value": float(v), "timestamp": int(ts), "step": int(step)} for k, v, ts, step in metrics],
            "tags": [{"key": k, "value": str(v)} for k, v in tags.items()],
        }
        response = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/runs/log-batch", "POST",
                                max_retries=0, timeout=ATTEMPT_TIMEOUT_S, json=json.loads(json.dumps(body)))
        verify_rest_response(response, "/api/2.0/mlflow/runs/log-batch")
        return
    from mlflow.entities import Metric, RunTag

    from platform.tracking import store

    store.client(uri).log_batch(run_id, metrics=[Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in metrics],
                                tags=[RunTag(k, str(v)) for k, v in tags.items()])
