"""cluster.yaml validates against the JSON schema Ray ships, and keeps the security defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers import ROOT


def _config():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_validates_against_rays_schema():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(_config(), schema)


def test_cluster_layout_and_security_defaults():
    cfg = _config()
    nodes = cfg["available_node_types"]
    assert cfg["head_node_type"] == "head" and nodes["gpu_worker"]["min_workers"] == 0
    ingress = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(p["FromPort"], p["ToPort"]) for p in ingress] == [(22, 22)]  # only SSH from outside
    # ... and only from cluster.env's range: unrendered, the placeholder is no address range at all.
    assert [r["CidrIp"] for p in ingress for r in p["IpRanges"]] == ["${SSH_ALLOWED_CIDR}"]
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "mlflow server" in head and "MLFLOW_TRACKING_URI" in head
    assert "cu128" in " ".join(cfg["worker_setup_commands"]) and "cpu" in " ".join(cfg["head_setup_commands"])
    text = (ROOT / "cluster.yaml").read_text().lower()
    assert "aws_secret_access_key" not in text and not re.search(r"password(\s*=|:\s)\s*\S", text)  # no value set here


def test_ray_runs_with_a_token_made_on_the_head_and_given_to_the_workers():
    """Ray 2.60 authenticates only where RAY_AUTH_MODE=token: every node starts Ray so, with the
    token the head makes once (owner-only) and the launcher copies to the workers."""
    cfg = _config()
    made = " ".join(cfg["head_setup_commands"])
    assert "~/.ray/auth_token" in made and "umask 077" in made and "secrets.token_hex(32)" in made
    assert cfg["cluster_synced_files"] == ["~/.ray/auth_token"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert start.index("RAY_AUTH_MODE=token") < start.index("ray start --")
    assert "export RAY_AUTH_MODE=token" in " ".join(cfg["setup_commands"])  # ray exec, job drivers


def test_mlflow_runs_with_basic_auth_from_cluster_env(tmp_path):
    """The head writes MLflow's auth configuration from cluster.env's account (refusing to start
    without one) and serves with --app-name basic-auth; the configuration is owner-only."""
    from platform.cluster import write_mlflow_auth

    head = " ".join(_config()["head_start_ray_commands"])
    assert "--app-name basic-auth" in head and "MLFLOW_AUTH_CONFIG_PATH=~/mlflow/basic_auth.ini" in head
    assert "platform.cluster mlflow-auth ~/mlflow/basic_auth.ini" in head
    assert ': "${MLFLOW_TRACKING_PASSWORD:?' in head and "MLFLOW_FLASK_SERVER_SECRET_KEY" in head
    path = write_mlflow_auth(tmp_path / "auth" / "basic_auth.ini", "platform", "a-long-password-1")
    text = path.read_text()
    assert "admin_username = platform" in text and "admin_password = a-long-password-1" in text
    assert "default_permission = NO_PERMISSIONS" in text and oct(path.stat().st_mode & 0o777) == "0o600"


def _env_file(tmp_path, **values):
    settings = {"SSH_ALLOWED_CIDR": "198.51.100.0/24", "MLFLOW_TRACKING_USERNAME": "platform",
                "MLFLOW_TRACKING_PASSWORD": "correct-horse-battery", "MLFLOW_ARTIFACTS_DESTINATION": "s3://b/mlflow",
                **values}
    path = tmp_path / "cluster.env"
    path.write_text("# settings\n" + "".join(f"{k}={v}  # note\n" for k, v in settings.items() if v is not None))
    return path


def test_render_puts_cluster_envs_ssh_range_in_and_validates(tmp_path):
    from platform.cluster import render

    out = render(ROOT / "cluster.yaml", _env_file(tmp_path), tmp_path / "rendered.yaml")
    rendered = yaml.safe_load(out.read_text())
    ranges = [r["CidrIp"] for p in rendered["provider"]["security_group"]["IpPermissions"] for r in p["IpRanges"]]
    assert ranges == ["198.51.100.0/24"] and rendered["file_mounts"] == {"~/platform": str(ROOT)}
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(rendered, schema)


@pytest.mark.parametrize("values,needle", [
    ({"SSH_ALLOWED_CIDR": "0.0.0.0/0"}, "opens SSH to the whole internet"),
    ({"SSH_ALLOWED_CIDR": "::/0"}, "opens SSH to the whole internet"),
    ({"SSH_ALLOWED_CIDR": "my office"}, "is not an address range"),
    ({"SSH_ALLOWED_CIDR": None}, "set SSH_ALLOWED_CIDR"),
    ({"MLFLOW_TRACKING_PASSWORD": "short"}, "at least 12 characters"),
    ({"MLFLOW_TRACKING_PASSWORD": None}, "set MLFLOW_TRACKING_PASSWORD"),
    ({"MLFLOW_ARTIFACTS_DESTINATION": "/home/me"}, "must be an s3:// location"),
])
def test_cluster_env_mistakes_are_one_line(values, needle, tmp_path, cli):
    proc = cli("cluster", "render", "--env-file", str(_env_file(tmp_path, **values)))
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert "correct-horse" not in proc.stderr


def test_the_whole_internet_only_when_said(tmp_path):
    from platform.cluster import render

    env = _env_file(tmp_path, SSH_ALLOWED_CIDR="0.0.0.0/0", SSH_ALLOW_ANYWHERE="yes")
    rendered = yaml.safe_load(render(ROOT / "cluster.yaml", env, tmp_path / "r.yaml").read_text())
    assert rendered["provider"]["security_group"]["IpPermissions"][0]["IpRanges"][0]["CidrIp"] == "0.0.0.0/0"


def test_cluster_sized_to_the_paper_sweeps_and_head_runs_no_training():
    """The GPU nodes the cluster can scale to are what the paper profile's concurrent trials use
    (each trial num_workers GPUs, one GPU per node); the head offers Ray no CPUs or GPUs, so no
    Train worker or Ray Data task lands there."""
    from platform.config import TrainConfig
    from platform.space import load_space

    cfg = _config()
    gpu_nodes = cfg["available_node_types"]["gpu_worker"]["max_workers"]
    assert cfg["max_workers"] == gpu_nodes
    for method in ("simcse", "una", "san", "augcse", "vascl"):
        base = TrainConfig.build(method, "paper")
        spec = load_space(base, None)
        assert spec.max_concurrent_trials * base.num_workers == gpu_nodes, method
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--num-cpus=0" in head


def test_fresh_ubuntu_gets_a_venv_that_jobs_use():
    """Ubuntu 22.04 cloud images lack python3-venv; every node installs it, makes ~/venv, and puts
    it first on PATH for the Ray processes that start jobs (whose entrypoint says `python`)."""
    cfg = _config()
    setup = " ".join(cfg["setup_commands"])
    assert "apt-get install" in setup and "python3-venv" in setup and "python3 -m venv ~/venv" in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert start.index('export PATH="$HOME/venv/bin:$PATH"') < start.index("ray start")
