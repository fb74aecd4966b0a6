"""Which Ray a command uses (Ray's convention): RAY_ADDRESS, else the cluster ``ray start``
recorded on this machine, else a new local instance; ``RAY_ADDRESS=local`` asks for a private one.
What runs on a real head is in ``tests/test_cluster_join.py``."""

from __future__ import annotations

import os

from tests.helpers import assert_user_error, runs_of


def test_ray_address_local_keeps_a_private_ray_and_a_dead_recorded_cluster_is_one_line(tmp_path, cli, mlflow_uri):
    """RAY_ADDRESS=local: a new instance whatever this machine belongs to; a cluster recorded by a
    ``ray start`` that no longer answers is named, with what to do, before any run is created."""
    from platform.run.ray_env import find_cluster

    recorded = tmp_path / "ray" / "ray_current_cluster"
    recorded.parent.mkdir(parents=True)
    recorded.write_text("127.0.0.1:9")
    env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert find_cluster() == ("127.0.0.1:9", f"recorded by `ray start` in {recorded}")
        os.environ["RAY_ADDRESS"] = "local"
        assert find_cluster() == (None, "RAY_ADDRESS=local")
        os.environ["RAY_ADDRESS"] = "10.0.0.5:6379"
        assert find_cluster() == ("10.0.0.5:6379", "RAY_ADDRESS")
        recorded.unlink()
        os.environ["RAY_ADDRESS"] = ""
        assert find_cluster()[0] is None
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    recorded.write_text("127.0.0.1:9")
    proc = cli("train", "simcse", "--set", f"output_dir={tmp_path / 'runs'}", env={"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "", "MLFLOW_TRACKING_URI": mlflow_uri})
    assert_user_error(proc, "does not answer", "RAY_ADDRESS=local")
    assert runs_of(mlflow_uri)[1] == []
