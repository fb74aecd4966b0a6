"""The documented production store: an MLflow server over a real PostgreSQL (Debian's
``postgresql``: ``initdb`` + ``pg_ctl`` on a temporary folder and a free port, password in
``PGPASSWORD``), with basic authentication as ``cluster.yaml`` runs it. A run trains, is
registered, and the report renders against it; a client without the account, or a database URI
with its password inside, is one line before anything runs."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error, run_main, sets
from tests.services import MlflowServer, Postgres

pytestmark = pytest.mark.e2e

ACCOUNT = {"MLFLOW_TRACKING_USERNAME": "platform", "MLFLOW_TRACKING_PASSWORD": "pg-test-admin-pw-31"}


@pytest.fixture(scope="module")
def postgres_mlflow(tmp_path_factory):
    db = Postgres()
    why = db.available()
    if why:
        pytest.fail(why)  # on the CI image and this machine: a skip would hide a broken backend
    db.start()
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), db.uri, account=ACCOUNT, env={"PGPASSWORD": db.password})
    try:
        server.start()
        yield db, server
    finally:
        server.stop()
        db.stop()


def test_train_register_and_report_on_postgres(postgres_mlflow, tiny_model, small_corpus, tmp_path):
    db, server = postgres_mlflow
    env = {"MLFLOW_TRACKING_URI": server.uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache"), **ACCOUNT}
    proc = run_main("train", "simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=4,
                                             eval_steps=2, runtime="process", num_workers=1,
                                             output_dir=tmp_path / "runs"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = run_main("report", "--experiment", "simcse", "--out", str(tmp_path / "report"), env=env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "simcse" in (tmp_path / "report" / "report.md").read_text()

    import os

    os.environ.update(ACCOUNT)
    try:
        from mlflow.tracking import MlflowClient

        c = MlflowClient(server.uri)
        run = c.search_runs([c.get_experiment_by_name("simcse").experiment_id])[0]
        assert run.info.status == "FINISHED" and "sts_avg" in run.data.metrics
        versions = c.search_model_versions(f"run_id = '{run.info.run_id}'")
        assert len(versions) == 1
    finally:
        for key in ACCOUNT:
            os.environ.pop(key, None)
    # The rows are PostgreSQL's: the database holds the run.
    import sqlalchemy

    engine = sqlalchemy.create_engine(db.uri, connect_args={"password": db.password})
    with engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT count(*) FROM runs")).scalar() >= 2  # train + report
    engine.dispose()


def test_a_client_without_the_account_is_one_line(postgres_mlflow, cli):
    _, server = postgres_mlflow
    proc = cli("train", "simcse", env={"MLFLOW_TRACKING_URI": server.uri})
    assert_user_error(proc, "refused this client (HTTP 401)", "MLFLOW_TRACKING_USERNAME")
    wrong = cli("train", "simcse", env={"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_TRACKING_USERNAME": "platform",
                                        "MLFLOW_TRACKING_PASSWORD": "not-the-password"})
    assert_user_error(wrong, "refused this client (HTTP 401)")


def test_the_database_store_directly(postgres_mlflow, cli, monkeypatch):
    """``MLFLOW_TRACKING_URI=postgresql://...`` (no server): checked before anything runs; the
    password in the URI is refused (it belongs in PGPASSWORD), a wrong one is one line."""
    db, _ = postgres_mlflow
    from platform.tracking import store

    monkeypatch.setenv("PGPASSWORD", db.password)
    store.check_reachable(db.uri)
    with_password = db.uri.replace(f"{db.user}@", f"{db.user}:{db.password}@")
    proc = cli("train", "simcse", env={"MLFLOW_TRACKING_URI": with_password})
    assert_user_error(proc, "carries a password; put the password in PGPASSWORD")
    assert db.password not in proc.stderr
    proc = cli("train", "simcse", env={"MLFLOW_TRACKING_URI": db.uri, "PGPASSWORD": "wrong-password"})
    assert_user_error(proc, "is unreachable", "password authentication failed")


def test_a_replaced_head_finds_every_run_model_and_account(postgres_mlflow, tmp_path):
    """The cluster's MLflow on its managed PostgreSQL: the head's disk goes (a plain ``ray down``, a
    failed head, ``ray up`` replacing it) and a new head's server on the same database finds every
    run, metric, model version and account, the admin's and one it created (the accounts live in
    that database too, not in a file beside the server)."""
    import base64
    import json
    import shutil
    import urllib.request

    db, _ = postgres_mlflow
    old = MlflowServer(tmp_path / "old-head", db.uri, account=ACCOUNT, env={"PGPASSWORD": db.password}).start()

    def call(server, method, path, body=None, user=ACCOUNT["MLFLOW_TRACKING_USERNAME"],
             password=ACCOUNT["MLFLOW_TRACKING_PASSWORD"]):
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = urllib.request.Request(server.uri + path, method=method, data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    experiment = call(old, "POST", "/api/2.0/mlflow/experiments/create", {"name": "replaced-head"})["experiment_id"]
    run = call(old, "POST", "/api/2.0/mlflow/runs/create", {"experiment_id": experiment})["run"]["info"]["run_id"]
    call(old, "POST", "/api/2.0/mlflow/runs/log-metric", {"run_id": run, "key": "stsb_dev_spearman", "value": 81.5,
                                                          "timestamp": 0, "step": 125})
    call(old, "POST", "/api/2.0/mlflow/registered-models/create", {"name": "replaced-head-encoder"})
    call(old, "POST", "/api/2.0/mlflow/model-versions/create", {"name": "replaced-head-encoder", "source": "s3://b/m",
                                                                "run_id": run})
    call(old, "POST", "/api/2.0/mlflow/users/create", {"username": "alice", "password": "alice-password-123"})
    old.stop()
    shutil.rmtree(tmp_path / "old-head")  # the head's disk, gone with it
    new = MlflowServer(tmp_path / "new-head", db.uri, account=ACCOUNT, env={"PGPASSWORD": db.password}).start()
    try:
        history = call(new, "GET", f"/api/2.0/mlflow/metrics/get-history?run_id={run}&metric_key=stsb_dev_spearman")
        assert [(m["step"], m["value"]) for m in history["metrics"]] == [(125, 81.5)]
        versions = call(new, "GET", "/api/2.0/mlflow/model-versions/search?filter=name%3D%27replaced-head-encoder%27")
        assert [v["run_id"] for v in versions["model_versions"]] == [run]
        assert call(new, "GET", "/api/2.0/mlflow/users/get?username=alice")["user"]["username"] == "alice"
        # alice signs in on the new head with the password she was given on the old one.
        assert call(new, "GET", "/api/2.0/mlflow/users/get?username=alice", user="alice",
                    password="alice-password-123")["user"]["username"] == "alice"
    finally:
        new.stop()
