"""MLflow: where runs go, a reachability check before any Ray work, and run bookkeeping.

``MLFLOW_TRACKING_URI`` picks the store; without it runs go to a local SQLite database under the
repository (``mlruns/mlflow.db``, artifacts in ``mlruns/artifacts``), which needs no server.
Open it with ``mlflow ui --backend-store-uri sqlite:///$PWD/mlruns/mlflow.db``.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from platform.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    store = REPO_ROOT / "mlruns"
    return f"sqlite:///{store / 'mlflow.db'}"


def redact(uri: str) -> str:
    """The URI with any password or token masked, for messages and logs."""
    import re

    return re.sub(r"(?<=://)([^:/@]+):([^@/]+)@", r"\1:***@", uri)


def artifact_root(uri: str) -> str | None:
    """Local stores keep artifacts beside the database; servers decide for themselves."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
    return None


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (before Ray starts) if the tracking store cannot be used."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
                if resp.status >= 400:
                    raise UserError(f"MLflow tracking server {redact(uri)} answered HTTP {resp.status}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"MLflow tracking server {redact(uri)} is unreachable ({reason}); check MLFLOW_TRACKING_URI") from None
    elif uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"MLflow store {uri}: cannot create {db.parent} ({exc.strerror})") from None
        if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise UserError(f"MLflow store {uri}: {db} is not writable")
    elif uri.startswith("file:") or "://" not in uri:
        raise UserError(
            f"MLflow tracking URI {redact(uri)!r}: the file store is deprecated in MLflow 3; "
            "use sqlite:////absolute/path/mlflow.db or an http(s) server"
        )


def client(uri: str | None = None):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri or tracking_uri())


def ensure_experiment(name: str, uri: str) -> str:
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=artifact_root(uri))
    except Exception:  # created concurrently by another process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=False
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def start_run(uri: str, experiment: str, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
    c = client(uri)
    exp_id = ensure_experiment(experiment, uri)
    tags = {"git_commit": git_commit(), **tags}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = c.create_run(exp_id, run_name=name, tags=tags)
    return run.info.run_id


def log_params(uri: str, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    c = client(uri)
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        c.log_batch(run_id, params=items[i : i + 100])


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], step: int | None = None) -> None:
    import time

    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, step or 0) for k, v in metrics.items()]
    if items:
        client(uri).log_batch(run_id, metrics=items)


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)


class MetricSink:
    """Step metrics from rank 0 of the training loop straight to the run (None: print only).

    ``skip_logged``: a worker group restarted from a checkpoint re-runs the steps after it; a
    point whose step is not past the last one already logged for that key is dropped, so the
    history has neither duplicates nor gaps."""

    def __init__(self, uri: str | None, run_id: str | None, skip_logged: bool = False):
        self.uri, self.run_id, self.skip_logged = uri, run_id, skip_logged
        self.logged_until: dict[str, int] = {}

    def _last_step(self, key: str) -> int:
        if key not in self.logged_until:
            history = client(self.uri).get_metric_history(self.run_id, key)
            self.logged_until[key] = max((m.step for m in history), default=-1)
        return self.logged_until[key]

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        if not self.run_id:
            return
        if self.skip_logged:
            metrics = {k: v for k, v in metrics.items() if step > self._last_step(k)}
            for k in metrics:
                self.logged_until[k] = step
        if metrics:
            log_metrics(self.uri, self.run_id, metrics, step)
