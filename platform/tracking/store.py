"""Where MLflow runs go, the client, and look-ups of runs.

``MLFLOW_TRACKING_URI`` picks the store; without it runs go to a local SQLite database under the
repository (``mlruns/mlflow.db``, artifacts in ``mlruns/artifacts``), which needs no server.
Open it with ``mlflow ui --backend-store-uri sqlite:///$PWD/mlruns/mlflow.db``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from platform import errors, settings
from platform.console import drop_notes
from platform.errors import UserError, one_line
from platform.storage import REPO_ROOT, in_ray_job_copy
from platform.tracking.names import EXPERIMENT_KIND_TAG, NOTE_TAG, PARENT_TAG, VIEW_TAG

DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")  # SQLAlchemy back ends MLflow's tracking store takes
SCHEMES = ("http", "https", "sqlite", *DATABASE_SCHEMES)
CREDENTIALS_ADVICE = {
    "http": "put them in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)",
    "postgresql": "put the password in PGPASSWORD or ~/.pgpass",
}


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the repository's SQLite store. A password inside the URI is
    refused: it would reach every worker's environment and every message that names the store."""
    uri = settings.get(settings.TRACKING_URI)
    cluster = settings.get(settings.CLUSTER)
    if cluster and (not uri or not uri.startswith(("http://", "https://"))):
        # A shell on a node that missed its ~/platform-env-<host>.sh (or a user's override) would write the
        # runs to a file on that node: not the server users browse, not backed up, lost with it.
        raise UserError(f"this is a node of cluster {cluster}, whose runs go to its MLflow server, but "
                        f"MLFLOW_TRACKING_URI is {errors.redact(uri) if uri else 'unset'}: run `. ~/platform-env-$(hostname).sh` "
                        "(a login shell does), or unset PLATFORM_CLUSTER if a local store is meant")
    if not uri and in_ray_job_copy(REPO_ROOT):
        raise UserError("MLFLOW_TRACKING_URI is unset, and the default store (mlruns/ in the repository) would be "
                        "inside the job's temporary copy, which Ray deletes: set it where the cluster's Ray starts "
                        "(cluster.yaml does) or in the job's env_vars")
    if not uri:
        return f"sqlite:///{REPO_ROOT / 'mlruns' / 'mlflow.db'}"
    if errors.redact(uri) != uri:
        scheme = uri.split(":", 1)[0].split("+", 1)[0]
        advice = CREDENTIALS_ADVICE.get("http" if scheme.startswith("http") else scheme,
                                        "give them the way the store's client reads them, not in the URI")
        raise UserError(f"MLFLOW_TRACKING_URI={errors.redact(uri)} carries a password; {advice}")
    return uri


def load_code(uri: str, model_uri: str) -> str:
    """The Python that loads ``model_uri`` in a new session: it names the store, since a new
    session's MLflow looks in ``./mlflow.db`` (not the platform's ``mlruns/mlflow.db``) or wherever
    its own ``MLFLOW_TRACKING_URI`` points."""
    return (f"import mlflow; mlflow.set_tracking_uri({redact(uri)!r}); "
            f"model = mlflow.sentence_transformers.load_model({model_uri!r})")


def ui_route(route: str) -> str:
    """A link into MLflow's UI (``#/experiments/...``) that opens it in its model-training mode:
    MLflow 3.17's sidebar switch (GenAI | Model training) defaults to GenAI and takes the mode from
    the link's ``workflowType``, not from the experiment's kind tag."""
    return route + ("&" if "?" in route else "?") + "workflowType=machine_learning"


def view_route(experiment_id: str, key: str) -> str:
    """The route that opens an experiment's runs table on the view ``save_runs_view`` saved as ``key``."""
    return f"#/experiments/{experiment_id}/runs?{VIEW_PARAM}={key}"


def ui_command(uri: str, experiment_id: str | None = None, run_id: str | None = None, route: str | None = None) -> str:
    """How to open this store's MLflow UI on an experiment's runs (or one run, or ``route``), in its
    model-training mode."""
    page = f"/#/experiments/{experiment_id}" if experiment_id else "/#/experiments"
    page = ui_route("/" + route if route else page + (f"/runs/{run_id}" if experiment_id and run_id else ""))
    if uri.startswith(("http://", "https://")):
        return f"open {redact(uri).rstrip('/')}{page} in a browser"
    return f"mlflow ui --backend-store-uri {redact(uri)} (then http://127.0.0.1:5000{page})"


def redact(uri: str) -> str:
    """The URI with its credentials masked, for messages and logs."""
    return errors.redact(uri)


def artifact_root(uri: str) -> str | None:
    """Local stores keep artifacts beside the database; servers decide for themselves."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
    return None


SEARCH_WAIT_S = 30.0  # how long the preflight waits for a server that answered /health to answer a search


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (before Ray starts) if the tracking store cannot be used."""
    if uri.startswith(("http://", "https://")):
        _check_server(uri, timeout)
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
    elif uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        _check_database(uri, timeout)
    elif not uri.startswith("databricks"):  # Databricks' own client checks its workspace
        raise UserError(f"MLflow tracking URI {redact(uri)!r}: unsupported scheme; use one of "
                        f"{', '.join(s + '://' for s in SCHEMES)}")


def _check_server(uri: str, timeout: float) -> None:
    """The server answers, and takes this client's credentials (``/health`` needs none, so a
    search of one experiment is asked too, as MLflow's client would ask it)."""
    import base64

    base = uri.rstrip("/")
    headers = {}
    user, password, token = (settings.get(k) for k in settings.TRACKING_CREDENTIALS)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user:
        pair = f"{user}:{password or ''}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    # A server that is down or a wrong host fails /health within ``timeout``; one that answered it
    # is up, and its search (a database query, after the account's check) may take longer on a
    # busy head (seen: 6 s on a loaded 2-core machine; MLflow's own client waits 120 s).
    for path, wait in (("/health", timeout), ("/api/2.0/mlflow/experiments/search?max_results=1", max(timeout, SEARCH_WAIT_S))):
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=wait):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise UserError(f"MLflow tracking server {redact(uri)} refused this client (HTTP {exc.code}); set "
                                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an account of its") from None
            raise UserError(f"MLflow tracking server {redact(uri)} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"MLflow tracking server {redact(uri)} is unreachable ({reason}); "
                            "check MLFLOW_TRACKING_URI") from None


def _check_database(uri: str, timeout: float) -> None:
    """A database store answers and takes a connection, within ``timeout`` (its driver installed)."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": max(1, int(timeout))})
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except ModuleNotFoundError as exc:
        raise UserError(f"MLflow store {redact(uri)}: its database driver is not installed ({exc.name}); "
                        "pip install the project's dependencies") from None
    except Exception as exc:  # refused, unknown host, authentication: the driver's first line says which
        reason = one_line(getattr(exc, "orig", None) or exc)
        raise UserError(f"MLflow store {redact(uri)} is unreachable ({reason}); check MLFLOW_TRACKING_URI") from None


def quoted(value: str) -> str:
    """``value`` as a string literal of MLflow's search filter (single quotes, or double quotes where
    it holds a single one); one line of UserError where it holds both."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise UserError(f"{value!r} holds both kinds of quote: MLflow's search cannot name it; use the run's id")


def client(uri: str | None = None):
    import mlflow
    from mlflow.tracking import MlflowClient

    # MLflow's notes that are not the user's to act on: a new SQLite store's table creation, and that
    # the requirements it records drop torch's local version label (``2.13.0+cpu``).
    drop_notes({"mlflow.store.db.utils": ("database tables",),
                "mlflow.utils.requirements_utils": ("local version label",)})
    uri = uri or tracking_uri()
    # MLflow's own code inside a call makes clients of the process's default store (the registry
    # resolving a logged model does): it must be this one, also when MLFLOW_TRACKING_URI is unset
    # and the store is the platform's default (MLflow's would be ./mlflow.db).
    if mlflow.get_tracking_uri() != uri:
        mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


TRAINING_KIND = "custom_model_development"  # MLflow's UI then opens on runs, not on GenAI traces


def ensure_experiment(name: str, uri: str, note: str = "") -> str:
    """The experiment ``name``, created if missing, marked as model training for MLflow's UI, with
    ``note`` as its description unless it has one (a description a user wrote stays)."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is None:
        try:
            exp = c.get_experiment(c.create_experiment(name, artifact_location=artifact_root(uri)))
        except Exception:  # created concurrently by another process
            exp = c.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
        c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    if note and not exp.tags.get(NOTE_TAG):
        c.set_experiment_tag(exp.experiment_id, NOTE_TAG, note)
    return exp.experiment_id


VIEW_PARAM = "viewStateShareKey"  # MLflow's UI opens a saved view (names.VIEW_TAG) from a link with this parameter


def save_runs_view(uri: str, experiment_id: str, key: str, name: str, search: str, params: list[str],
                   metric: str) -> None:
    """A saved view of the experiment's runs table, as MLflow's UI saves one ("Views"; opened by
    ``view_route``): the runs ``search`` finds, their ``params``
    and ``metric`` as columns, best ``metric`` first."""
    import json
    import time

    columns = [f"params.`{p}`" for p in params] + [f"metrics.`{metric}`", "attributes.`Models`"]
    state = {"searchFilter": search, "orderByKey": f"metrics.`{metric}`", "orderByAsc": False,
             "selectedColumns": columns}
    now = int(time.time() * 1000)
    view = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    client(uri).set_experiment_tag(experiment_id, VIEW_TAG + key, json.dumps(view))


def git_commit() -> str:
    """The repository's commit. Ray ships the repository to workers (and ``ray job submit`` to
    the driver) without ``.git``: there the commit comes from ``$PLATFORM_GIT_COMMIT``, which the
    driver forwards to its workers and ``ray job submit`` is given (docs/cluster.md)."""
    if settings.get(settings.GIT_COMMIT):
        return settings.get(settings.GIT_COMMIT)
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=False
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------------------
# The process that drives a run: recorded on the run, so that a later --resume can tell a run whose
# driver died (SIGKILL, the OOM killer, a lost head) from one that is still being driven.


def driver_id() -> str:
    """``host:pid:start time`` of this process (the start time tells a reused pid apart)."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def driver_alive(driver: str | None) -> bool:
    """Whether the process a ``driver_id`` names still runs (on this host; another host's driver
    cannot be seen from here and counts as gone: a resume is run where the driver ran)."""
    import psutil

    host, _, rest = (driver or "").partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == started
    except psutil.Error:
        return False


# ------------------------------------------------------------------------------------------------
# Look-ups


def check_run(uri: str, run_id: str) -> None:
    """The store is reachable and holds ``run_id``."""
    from mlflow.exceptions import MlflowException

    check_reachable(uri)
    try:
        client(uri).get_run(run_id)
    except MlflowException:
        raise UserError(f"no MLflow run {run_id!r} in {redact(uri)}") from None


def child_runs(uri: str, parent: str, extra_filter: str = "", order_by: list[str] | None = None) -> list:
    """The runs nested directly under ``parent`` (a sweep's trials, a configuration's seeds)."""
    c = client(uri)
    exp = c.get_run(parent).info.experiment_id
    query = f"tags.`{PARENT_TAG}` = '{parent}'" + (f" and {extra_filter}" if extra_filter else "")
    return c.search_runs([exp], filter_string=query, order_by=order_by)


def find_run(uri: str, experiment: str, name_or_id: str):
    """A run by its id, or by its name in ``experiment``; a user error naming what was looked for."""
    from mlflow.exceptions import MlflowException

    c = client(uri)
    try:
        return c.get_run(name_or_id)
    except MlflowException:
        pass
    exp = c.get_experiment_by_name(experiment)
    found = c.search_runs([exp.experiment_id], f"attributes.run_name = {quoted(name_or_id)}") if exp else []
    if len(found) != 1:
        what = "no run" if not found else f"{len(found)} runs"
        raise UserError(f"{what} named or numbered {name_or_id!r} in experiment {experiment!r} of {redact(uri)}")
    return found[0]
