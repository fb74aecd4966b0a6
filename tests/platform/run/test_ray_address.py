"""Which Ray a command uses (Ray's convention): RAY_ADDRESS, else the cluster ``ray start``
recorded on this machine, else a new local instance; ``RAY_ADDRESS=local`` asks for a private one.
What runs on a real head is in ``tests/platform/cluster/test_cluster_join.py``."""

from __future__ import annotations

import os
import re

import pytest



def test_ray_address_local_keeps_a_private_ray_and_a_dead_recorded_cluster_is_passed_over(tmp_path):
    """RAY_ADDRESS=local: a new instance whatever this machine belongs to; a cluster recorded by a
    ``ray start`` that no longer answers (ended without ``ray stop``) is passed over, and the
    command's Ray line says so (``tests/platform/test_shim.py`` starts the local Ray beside such a record)."""
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


@pytest.mark.scenario
def test_a_local_start_whose_raylet_misses_rays_30_seconds_is_made_again(tmp_path):
    """Ray gives a new node's raylet a hard-coded 30 s to register with its GCS
    (``ray/_private/node.py``); on the 2-core CI VM under the suite a command's local start once
    missed it ("The current node timed out during startup"). Ray's own debug hook
    (``RAY_RAYLET_VALGRIND=1`` runs the raylet under the ``valgrind`` on ``PATH``) runs here a
    ``valgrind`` that holds the first raylet back: the first start times out for real, what it
    left is ended, and the second start is the command's Ray."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    bin_dir, first = tmp_path / "bin", tmp_path / "first.pid"
    bin_dir.mkdir()
    (bin_dir / "valgrind").write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == --* ]]; do shift; done  # valgrind\'s options, as Ray passes them\n'
        f'if [ ! -e {first} ]; then echo $$ > {first}; exec sleep 300; fi\n'
        'exec "$@"\n')
    (bin_dir / "valgrind").chmod(0o755)
    program = ("import pathlib, psutil, ray; from platform.run.ray_env import init_ray; init_ray(num_cpus=1); "
               f"pid = int(pathlib.Path({str(first)!r}).read_text()); "
               "print('first raylet alive:', psutil.pid_exists(pid) and psutil.Process(pid).status() != 'zombie'); "
               "print('CPUs:', ray.cluster_resources()['CPU']); ray.shutdown()")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_RAYLET_VALGRIND": "1", "RAY_ADDRESS": "local"}
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timed_out = re.search(r"Ray: the local start timed out .*; (\d+) process\(es\) of it ended, starting again", proc.stdout)
    assert timed_out and int(timed_out.group(1)) >= 2, proc.stdout  # its GCS and raylet at least
    assert "first raylet alive: False" in proc.stdout and "CPUs: 1.0" in proc.stdout, proc.stdout
    assert "Ray: a local instance (RAY_ADDRESS=local), 1 CPUs" in proc.stdout.split("starting again", 1)[1], proc.stdout


# A driver that counts its node's idle workers (titled ``ray::IDLE``) for a few seconds after it
# connects, no task submitted: the most it saw. Its argument picks how Ray starts: ``init_ray`` as
# the commands start it, else Ray's default (with the caller's environment).
IDLE_WORKERS = """
import sys, time, psutil, ray
from platform.run import ray_env
mode = sys.argv[1]
if mode == "init_ray":
    ray_env.init_ray(num_cpus=2)
else:
    ray.init(address="local", num_cpus=2, include_dashboard=False)
seen, end = 0, time.monotonic() + 6
while time.monotonic() < end:
    seen = max(seen, sum(p.name() == "ray::IDLE" for p in psutil.Process().children(recursive=True)))
    time.sleep(0.2)
print("workers:", seen)
ray.shutdown()
"""


def test_a_new_driver_leaves_no_idle_workers_for_ray_to_end():
    """Ray's raylet starts a worker per CPU for its node's first driver, and ends those no task took
    once the job's own workers run; Ray 2.60's worker now and then aborts in that exit (SIGABRT, a
    "Fatal Python error" on the sweep's console). The commands' local start
    and the Slurm job's ``ray start`` (``raylet_env``) ask for none; Ray's default, the control,
    starts them."""
    import subprocess
    import sys

    from platform.run.ray_env import raylet_env
    from tests.helpers import ROOT

    base = {**os.environ, "RAY_ADDRESS": "local"}
    starts = {"init_ray": base, "ray start's environment": {**base, **raylet_env()}, "Ray's default": base}
    procs = {name: subprocess.Popen([sys.executable, "-c", IDLE_WORKERS, "init_ray" if name == "init_ray" else "ray"],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, env in starts.items()}
    seen = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (name, err[-3000:])
        seen[name] = int(re.search(r"workers: (\d+)", out).group(1))
    assert seen["init_ray"] == 0 and seen["ray start's environment"] == 0, seen
    assert seen["Ray's default"] >= 1, seen


# Two local starts in one process, as a retried start makes them: where each session's raylet
# spills objects, beside that session's folder.
TWO_STARTS = """
import json, ray
from platform.run import ray_env
for _ in range(2):
    ray_env.init_ray(num_cpus=1)
    node = ray._private.worker.global_worker.node
    spill = json.loads(node._config["object_spilling_config"])["params"]["directory_path"]
    print("session:", node.get_session_dir_path(), "spills:", spill)
    ray.shutdown()
print("config:", dict(ray_env.RAYLET_CONFIG), ray_env.raylet_env())
"""


def test_a_second_local_start_in_one_process_spills_into_its_own_session():
    """``ray.init`` writes its session's spilling folder into the ``_system_config`` it is given; a
    second start in the same process (a retried one, or a test's) handed the same dict spilled into
    the first session's folder and made ``raylet_env`` fail. Each start gets its own copy."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run([sys.executable, "-c", TWO_STARTS], cwd=ROOT, env={**os.environ, "RAY_ADDRESS": "local"},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sessions = re.findall(r"session: (\S+) spills: (\S+)", proc.stdout)
    assert len(sessions) == 2 and sessions[0][0] != sessions[1][0], proc.stdout
    assert all(spill.startswith(session) for session, spill in sessions), proc.stdout
    assert ("config: {'prestart_worker_first_driver': False} "
            "{'RAY_prestart_worker_first_driver': '0'}") in proc.stdout, proc.stdout
