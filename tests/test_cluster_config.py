"""cluster.yaml validates against the JSON schema Ray ships, and keeps the security defaults."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from tests.conftest import ROOT


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
