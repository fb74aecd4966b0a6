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
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting: a sweep's trials, a configuration's seeds


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


GIT_COMMIT_ENV = "PLATFORM_GIT_COMMIT"


def git_commit() -> str:
    """The repository's commit. Ray ships the repository to workers (and ``ray job submit`` to
    the driver) without ``.git``: there the commit comes from ``$PLATFORM_GIT_COMMIT``, which the
    driver forwards to its workers and ``ray job submit`` is given (README, "On a cluster")."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=False
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def check_run(uri: str, run_id: str) -> None:
    """The store is reachable and holds ``run_id``."""
    from mlflow.exceptions import MlflowException

    check_reachable(uri)
    try:
        client(uri).get_run(run_id)
    except MlflowException:
        raise UserError(f"no MLflow run {run_id!r} in {redact(uri)}") from None


def start_run(uri: str, experiment: str, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
    c = client(uri)
    exp_id = ensure_experiment(experiment, uri)
    tags = {"git_commit": git_commit(), **tags}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
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


def set_tags(uri: str, run_id: str, tags: dict[str, str]) -> None:
    c = client(uri)
    for key, value in tags.items():
        c.set_tag(run_id, key, value)


def reopen_run(uri: str, run_id: str) -> None:
    client(uri).update_run(run_id, status="RUNNING")


def log_file(uri: str, run_id: str, path: Path, artifact_path: str | None = None) -> None:
    client(uri).log_artifact(run_id, str(path), artifact_path)


def log_folder(uri: str, run_id: str, folder: Path, artifact_path: str) -> None:
    client(uri).log_artifacts(run_id, str(folder), artifact_path)


def log_table(uri: str, run_id: str, frame, artifact_file: str) -> None:
    """A pandas DataFrame as an MLflow table (shown in the UI's artifact and evaluation views)."""
    client(uri).log_table(run_id, data=frame, artifact_file=artifact_file)


# ------------------------------------------------------------------------------------------------
# A sweep's runs: one parent, one child per trial (tagged with Tune's trial id)


def child_runs(uri: str, parent: str, extra_filter: str = "", order_by: list[str] | None = None) -> list:
    c = client(uri)
    exp = c.get_run(parent).info.experiment_id
    query = f"tags.`{PARENT_TAG}` = '{parent}'" + (f" and {extra_filter}" if extra_filter else "")
    return c.search_runs([exp], filter_string=query, order_by=order_by)


def finished_trial_run(uri: str, parent: str, trial_id: str):
    """The trial's child run if it finished (a resumed sweep reports it instead of training again)."""
    runs = child_runs(uri, parent, f"tags.trial_id = '{trial_id}' and attributes.status = 'FINISHED'")
    return runs[0] if runs else None


def close_child_runs(uri: str, parent: str, errored: set[str], interrupted: bool = False,
                     ended: set[str] = frozenset()) -> None:
    """No child run stays RUNNING: trials the scheduler stopped end FINISHED (tagged), errored
    ones FAILED, and after Ctrl-C the ones still running end KILLED (``--resume`` runs them again),
    except those of trials Tune had already ended (``ended``), which close as above."""
    c = client(uri)
    for trial in child_runs(uri, parent):
        trial_id = trial.data.tags.get("trial_id")
        # A trial with seeds has one run per seed nested under its own.
        nested = child_runs(uri, trial.info.run_id, "attributes.status = 'RUNNING'")
        for run in [*nested, *([trial] if trial.info.status == "RUNNING" else [])]:
            if interrupted and trial_id not in ended:
                c.set_terminated(run.info.run_id, "KILLED")
            elif trial_id in errored:
                c.set_terminated(run.info.run_id, "FAILED")
            else:
                c.set_tag(run.info.run_id, "stopped_by_scheduler", "true")
                c.set_terminated(run.info.run_id, "FINISHED")


def ranked_child_runs(uri: str, parent: str, metric: str, mode: str) -> list:
    """FINISHED child runs that logged ``best_<metric>``, best first. A trial cut by Ctrl-C keeps
    its KILLED run beside the one ``--resume`` trains it in again: only the latter can win."""
    order = "DESC" if mode == "max" else "ASC"
    runs = child_runs(uri, parent, "attributes.status = 'FINISHED'", order_by=[f"metrics.best_{metric} {order}"])
    return [r for r in runs if f"best_{metric}" in r.data.metrics]


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
    client(uri).log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(),
                                                         tags=[InputTag("mlflow.data.context", "training")])])
    set_tags(uri, run_id, {"corpus_sha256": digest, "corpus_sentences": str(num_sentences)})


class MetricSink:
    """Step metrics from rank 0 of the training loop straight to the run (None: print only).

    ``skip_logged``: a worker group restarted from a checkpoint re-runs the steps after it; a
    point whose step is not past the last one already logged for that key is dropped, so the
    history has neither duplicates nor gaps."""

    def __init__(self, uri: str | None, run_id: str | None, skip_logged: bool = False, system_metrics: bool = False):
        self.uri, self.run_id, self.skip_logged = uri, run_id, skip_logged
        self.logged_until: dict[str, int] = {}
        self.monitor = start_system_metrics(uri, run_id, resume=skip_logged) if run_id and system_metrics else None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()
            self.monitor = None

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


# ------------------------------------------------------------------------------------------------
# Model Registry

CHAMPION = "champion"
INPUT_EXAMPLE = ["A man is playing a guitar.", "A woman is slicing a tomato."]


def registered_name(method: str, recipe: str) -> str:
    """``<recipe>-encoder``: the paper's name for a named recipe (``una-encoder``), else the
    ingredients (``recipe-negatives-una-san-loss-hince-aux-vascl-encoder``)."""
    import re

    if method != "recipe":
        return f"{method}-encoder"
    parts = [p for p in recipe.split() if not p.endswith(("=none", "=dropout"))]
    return "recipe-" + re.sub(r"[^A-Za-z0-9]+", "-", " ".join(parts)).strip("-") + "-encoder"


def log_encoder_model(uri: str, run_id: str, st_dir: Path, artifact_path: str = "model") -> str:
    """The exported encoder as an MLflow model of the ``sentence_transformers`` flavor (signature
    and input example included), in the run's artifacts; returns its ``runs:/`` URI.

    The requirements are the flavor's own (sentence-transformers, transformers, torch; MLflow adds
    itself): left to infer them, MLflow loads the model in a new interpreter to see what it
    imports, about 11 s a model on 2 CPUs, and lists whatever the process had imported."""
    import tempfile

    import mlflow.sentence_transformers
    from mlflow.models import infer_signature
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    signature = infer_signature(INPUT_EXAMPLE, model.encode(INPUT_EXAMPLE))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / artifact_path
        mlflow.sentence_transformers.save_model(
            model, str(path), signature=signature, input_example=INPUT_EXAMPLE,
            pip_requirements=mlflow.sentence_transformers.get_default_pip_requirements())
        client(uri).log_artifacts(run_id, str(path), artifact_path)
    return f"runs:/{run_id}/{artifact_path}"


class RegistryUnavailable(Exception):
    """The tracking store has no Model Registry (a ``file:`` store)."""


def register_encoder(uri: str, name: str, model_uri: str, run_id: str, dev: float, tags: dict[str, str]) -> tuple[str, bool]:
    """A new version of ``name`` with ``tags``; the ``champion`` alias moves to it only when its
    STS-B dev beats the current champion's. Returns (version, whether it became champion)."""
    from mlflow.exceptions import MlflowException

    c = client(uri)
    try:
        c.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise RegistryUnavailable(" ".join(str(exc).split())[:200]) from None
        c.create_registered_model(name, description="Sentence encoders trained by the platform; "
                                                    "alias 'champion' = best STS-B dev so far.")
    version = c.create_model_version(name, model_uri, run_id=run_id,
                                     tags={**tags, "stsb_dev_spearman": f"{dev:.6f}"}).version
    _wait_ready(c, name, version)
    try:
        current = c.get_model_version_by_alias(name, CHAMPION)
        best = float(current.tags.get("stsb_dev_spearman", "-inf"))
    except MlflowException:
        best = float("-inf")
    promoted = dev > best
    if promoted:
        c.set_registered_model_alias(name, CHAMPION, version)
    return version, promoted


def _wait_ready(c, name: str, version: str, timeout: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while c.get_model_version(name, version).status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------------
# Results across experiments (``platform.report``)


def experiments(uri: str, names: list[str] | None = None) -> list:
    """The named experiments (all but MLflow's ``Default`` when none are named); an unknown name
    is a user error that lists the ones there are."""
    c = client(uri)
    found = {e.name: e for e in c.search_experiments()}
    if not names:
        return [e for n, e in sorted(found.items()) if n not in ("Default",)]
    missing = [n for n in names if n not in found]
    if missing:
        raise UserError(f"no MLflow experiment named {', '.join(map(repr, missing))} in {redact(uri)}; "
                        f"there are: {', '.join(sorted(found)) or 'none'}")
    return [found[n] for n in names]


def result_runs(uri: str, experiment_ids: list[str]) -> list:
    """Finished top-level runs (a training run, a run with seeds, a sweep) that hold a 7-task
    table: their nested seed and trial runs are parts of them, not results of their own."""
    runs = client(uri).search_runs(experiment_ids, filter_string="attributes.status = 'FINISHED'", max_results=5000)
    return [r for r in runs if PARENT_TAG not in r.data.tags and "sts_avg" in r.data.metrics]


def leaf_runs(uri: str, run) -> list:
    """The runs under ``run`` that trained (no runs nested under them), ``run`` itself if none:
    what its compute time is the sum of."""
    children = child_runs(uri, run.info.run_id)
    if not children:
        return [run]
    return [leaf for child in children for leaf in leaf_runs(uri, child)]


def log_report(uri: str, experiment: str, name: str, tags: dict[str, str], frame, files: list[Path]) -> str:
    """A report as its own FINISHED run: the table (MLflow table) and its files as artifacts."""
    run_id = start_run(uri, experiment, name, tags)
    status = "FAILED"
    try:
        log_table(uri, run_id, frame, "report.json")
        for path in files:
            log_file(uri, run_id, path)
        status = "FINISHED"
    finally:
        end_run(uri, run_id, status)
    return run_id
