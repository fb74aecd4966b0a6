"""Which Ray a command uses (Ray's convention): RAY_ADDRESS, else the cluster ``ray start``
recorded on this machine, else a new local instance; ``RAY_ADDRESS=local`` asks for a private one.
What runs on a real head is in ``tests/test_cluster_join.py``."""

from __future__ import annotations

import os



def test_ray_address_local_keeps_a_private_ray_and_a_dead_recorded_cluster_is_passed_over(tmp_path):
    """RAY_ADDRESS=local: a new instance whatever this machine belongs to; a cluster recorded by a
    ``ray start`` that no longer answers (ended without ``ray stop``) is passed over, and the
    command's Ray line says so (``tests/test_shim.py`` starts the local Ray beside such a record)."""
    import socket

    from platform.run.ray_env import find_cluster

    recorded = tmp_path / "ray" / "ray_current_cluster"
    recorded.parent.mkdir(parents=True)
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        port = live.getsockname()[1]
        env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": ""}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            recorded.write_text(f"127.0.0.1:{port}")
            assert find_cluster() == (f"127.0.0.1:{port}", f"recorded by `ray start` in {recorded}")
            os.environ["RAY_ADDRESS"] = "local"
            assert find_cluster() == (None, "RAY_ADDRESS=local")
            os.environ["RAY_ADDRESS"] = "10.0.0.5:6379"
            assert find_cluster() == ("10.0.0.5:6379", "RAY_ADDRESS")
            os.environ["RAY_ADDRESS"] = ""
            recorded.write_text("127.0.0.1:9")
            assert find_cluster() == (None, "the cluster `ray start` recorded (127.0.0.1:9) does not answer")
            recorded.unlink()
            assert find_cluster() == (None, "no cluster recorded on this machine")
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
