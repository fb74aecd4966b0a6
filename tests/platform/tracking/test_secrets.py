"""Secrets are never printed or stored: credentials written into a URI are refused (masked in the
message), and credentials given the right way (the clients' variables) appear nowhere the
platform writes: console, MLflow store (params, tags, metrics, artifacts), checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_main, sets

SECRETS = {"MLFLOW_TRACKING_PASSWORD": "mlflow-pw-5f3a9c", "MLFLOW_TRACKING_TOKEN": "mlflow-token-77e1b2",
           "AWS_SECRET_ACCESS_KEY": "aws-secret-c0ffee42", "HF_TOKEN": "hf_secret_token_d00d"}


def _holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_run_with_planted_secrets_leaves_them_nowhere(tiny_model, small_corpus, tmp_path):
    store = tmp_path / "store"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}", "PLATFORM_CACHE_DIR": str(tmp_path / "cache"),
           "AWS_ACCESS_KEY_ID": "AKIAPLANTED", **SECRETS}
    proc = run_main("train", "simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=2,
                                             eval_steps=2, runtime="process", num_workers=1, final_eval="false",
                                             output_dir=tmp_path / "runs"), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "runs").is_dir() and list(store.rglob("*"))
    for secret in SECRETS.values():
        assert secret not in proc.stdout + proc.stderr
        assert not _holding(store, secret.encode()), secret
        assert not _holding(tmp_path / "runs", secret.encode()), secret


@pytest.mark.parametrize("uri,needle", [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/runs", "output_dir s3://***@bucket/runs carries credentials"),
    ("gs://user:gcs-secret-pw@bucket/runs", "output_dir gs://***@bucket/runs carries credentials"),
])
def test_credentials_in_a_storage_uri_are_refused_and_masked(uri, needle, cli):
    proc = cli("train", "simcse", "--set", f"output_dir={uri}", "--print-config")
    secret = uri.split(":")[2].split("@")[0]
    assert proc.returncode == 2 and needle in proc.stderr
    assert secret not in proc.stderr + proc.stdout


def test_tracking_credentials_reach_workers_as_mlflow_reads_them(monkeypatch):
    """MLflow's own variables go to the Ray workers; a URI with a password never gets there (it is
    refused before Ray starts); storage keys are the nodes' own, not shipped in the job."""
    from platform.errors import UserError
    from platform.run.ray_env import worker_env
    from platform.tracking import store

    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    env = worker_env()
    assert env["MLFLOW_TRACKING_PASSWORD"] == SECRETS["MLFLOW_TRACKING_PASSWORD"]
    assert "AWS_SECRET_ACCESS_KEY" not in env and "HF_TOKEN" not in env
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:hunter2-pw@mlflow.example.org")
    with pytest.raises(UserError, match=r"https://\*\*\*@mlflow.example.org carries a password") as info:
        store.tracking_uri()
    assert "hunter2" not in str(info.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://mlflow:pg-pw-123@db:5432/mlflow")
    with pytest.raises(UserError, match="PGPASSWORD"):
        store.tracking_uri()


def test_every_error_line_masks_credentials(capsys):
    from platform.errors import fail

    with pytest.raises(SystemExit):
        fail("cannot open s3://KEY:topsecret@bucket/x nor https://u:pw2@host/y")
    err = capsys.readouterr().err
    assert "topsecret" not in err and "pw2" not in err and "s3://***@bucket/x" in err
