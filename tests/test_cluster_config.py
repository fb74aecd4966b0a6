"""cluster.yaml validates against the JSON schema Ray ships, and keeps the security defaults."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
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
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "mlflow server" in head and "MLFLOW_TRACKING_URI" in head
    assert "cu128" in " ".join(cfg["worker_setup_commands"]) and "cpu" in " ".join(cfg["head_setup_commands"])
    text = (ROOT / "cluster.yaml").read_text().lower()
    assert "aws_secret_access_key" not in text and "password" not in text


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
