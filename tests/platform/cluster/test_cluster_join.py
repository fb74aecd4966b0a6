"""The cluster users launch: a Ray head that offers no CPUs and worker nodes that Ray's autoscaler
adds from 0 (its fake multi-node provider, ``RAY_FAKE_CLUSTER=1``: real raylets on this machine,
started and stopped by the real autoscaler). On it, as on the head of ``cluster.yaml``:

- the README's sweep command, run with no ``RAY_ADDRESS`` (a shell after ``ray attach``), joins that
  cluster (Ray's convention: what ``ray start`` recorded), and its trials finish once the
  autoscaler has added nodes;
- every process of that cluster and the driver runs with ``tests/tracer`` on ``PYTHONPATH``: the
  project modules whose functions the sweep ran (driver, trials, Train workers, Ray Data) are the
  the Code map (docs/development.md), and the path from its ``main`` to the loss, joined over the
  driver, a trial and a Train worker, is at most ``MOST_HOPS_TO_THE_LOSS`` calls long;
- (``tests/platform/cluster/test_cluster_job.py``: the README's ``ray job submit`` line on a real head.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest
import yaml

from platform.tracking.names import END_REASON_TAG
from tests.helpers import ROOT, code_map, runs_of, tiny_run_args, wait_for
from tests.services import cluster_head

pytestmark = pytest.mark.scenario

WORKER_CPUS = 2
# The project's calls from ``python -m platform.tune una`` (runtime=ray) to the loss's
# ``F.cross_entropy``, over the driver, a trial and a Train worker; the path may shrink, not grow.
MOST_HOPS_TO_THE_LOSS = 9


def fake_cluster_config(gcs_port: int) -> dict:
    """The launcher config of Ray's fake multi-node provider, shaped as cluster.yaml: a head with
    no CPUs, one worker type that autoscales from 0."""
    return {
        "cluster_name": "fake-platform", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{gcs_port}"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu_worker": {"resources": {"CPU": WORKER_CPUS}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        },
        "head_node_type": "ray.head.default", "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        **{key: [] for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                               "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")},
    }


@pytest.fixture(scope="module")
def head(tmp_path_factory, _empty_mlflow_db):
    """The autoscaling cluster: a head with no CPUs, workers from 0."""
    def args(head, base):
        config = base / "home" / "ray_bootstrap_config.yaml"  # where `ray up` puts it on the head
        config.write_text(yaml.safe_dump(fake_cluster_config(head.port)))
        return ["--num-cpus", "0", "--num-gpus", "0", f"--autoscaling-config={config}"]

    trace = tmp_path_factory.mktemp("trace") / "calls.txt"
    head = cluster_head(tmp_path_factory, _empty_mlflow_db, "fake-cluster", args, fake=True,
                        env={"PYTHONPATH": str(ROOT / "tests" / "tracer"), "PLATFORM_TRACE_OUT": str(trace)})
    head.trace = trace
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.tmp, ignore_errors=True)


def _alive_nodes(head) -> int:
    """Nodes the GCS counts alive (Ray's state API: the dashboard's node summary merges nodes of
    one address, which the fake provider's nodes share)."""
    with urllib.request.urlopen(head.dashboard + "/api/v0/nodes", timeout=10) as resp:
        nodes = json.loads(resp.read())["data"]["result"]["result"]
    return sum(1 for n in nodes if n["state"] == "ALIVE")


def _jobs(head) -> list[dict]:
    with urllib.request.urlopen(head.dashboard + "/api/jobs/", timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def sweep(head, tiny_model, small_corpus, tmp_path_factory):
    """``python -m platform.tune una`` in a shell on the head (no RAY_ADDRESS), 2 trials."""
    wait_for("the head's raylet", lambda: _alive_nodes(head) == 1, timeout=60)  # the head alone: workers start at 0
    env = {**os.environ, "RAY_TMPDIR": str(head.tmp), "MLFLOW_TRACKING_URI": head.uri,
           **{k: head.env[k] for k in ("PYTHONPATH", "PLATFORM_TRACE_OUT")}}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "platform.tune", "una", "--num-samples", "2",
                           *tiny_run_args(tiny_model, small_corpus, tmp_path_factory.mktemp("join") / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    proc.calls = [line.split()[:3] for line in head.trace.read_text(encoding="utf-8").splitlines()]  # this sweep's
    return proc


def test_the_sweep_on_the_head_joins_the_cluster_and_its_trials_finish_on_added_nodes(head, sweep):
    """A driver of that cluster, not a private Ray; the head has no CPUs, so every trial ran on
    nodes the autoscaler added from 0; every trial FINISHED."""
    proc = sweep
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(rf"^Ray: the cluster this machine belongs to, at \S+:{head.port}", proc.stdout, re.M), proc.stdout
    assert _alive_nodes(head) >= 2
    drivers = [j for j in _jobs(head) if j.get("type") == "DRIVER" and "platform.tune" in (j.get("entrypoint") or "")]
    assert drivers and all(j["status"] == "SUCCEEDED" for j in drivers), _jobs(head)
    _, runs = runs_of(head.uri, "una")
    trials = [r for r in runs if r.data.tags.get("trial_id")]
    ended = [f"trial {r.data.tags['trial_id']}: {r.info.status} ({r.data.tags.get(END_REASON_TAG)})" for r in trials]
    assert len(trials) == 2 and all(r.info.status == "FINISHED" for r in trials), \
        "\n".join([*ended, "the sweep's output:", proc.stdout[-3000:], proc.stderr[-3000:]])


def test_the_code_map_is_what_the_sweep_ran(head, sweep):
    """Every project module with a function the sweep ran, in the driver, its trials, the Train
    workers or Ray Data's tasks, is in the Code map (docs/development.md) with its job in a line, and the map
    lists nothing else."""
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    calls = sweep.calls
    ran = {module for _, module, _ in calls}
    by_worker = {module for pid, module, name in calls if name == "train_loop_per_worker"}
    assert by_worker == {"platform/run/loop.py"}  # the Train workers were traced, not the driver alone
    mapped = code_map()
    assert set(mapped) == ran, (sorted(ran - set(mapped)), sorted(set(mapped) - ran))
    assert all(len(job) > 10 for job in mapped.values()), mapped


def test_the_end_of_the_sweep_loads_weights_on_the_workers_not_in_the_driver(head, sweep):
    """The final 7 STS tasks, the baseline and the export ran as Ray tasks (on the nodes the
    autoscaler added: the head offers no CPU); the driver loaded no weights."""
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    driver = {pid for pid, module, name in sweep.calls if module == "platform/tune.py" and name == "main"}
    assert len(driver) == 1
    tasks = {name: pid for pid, module, name in sweep.calls if module in ("platform/run/final_evaluation.py", "platform/run/export.py")
             and name in ("score_checkpoint", "score_backbone", "export_model")}
    assert set(tasks) == {"score_checkpoint", "score_backbone", "export_model"}, sweep.calls
    assert not driver & set(tasks.values())
    loads = {pid for pid, module, name in sweep.calls if module == "methods/encoder.py" and name == "from_pretrained"}
    assert loads and not driver & loads
    assert "s of it the driver's CPU" in sweep.stdout


def _actors(head, class_name: str) -> list[dict]:
    with urllib.request.urlopen(head.dashboard + "/api/v0/actors?limit=10000&detail=1", timeout=10) as resp:
        actors = json.loads(resp.read())["data"]["result"]["result"]
    return [a for a in actors if class_name in (a.get("class_name") or "")]


def test_generation_grows_with_the_cluster(head, sweep, data_root, tmp_path):
    """``platform.augment augcse`` on the head (0 CPUs): its generation actors' pool is sized by
    the most the autoscaler can add (the launcher config ``ray up`` leaves on the head), not by the
    CPUs there are when it starts (none), so more than one actor generates once nodes are added."""
    from platform.data import read_corpus

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(read_corpus(data_root / "corpus" / "wiki1m_for_simcse.first11914.txt.gz",
                                            limit=2048)) + "\n", encoding="utf-8")
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    env = {**os.environ, "RAY_TMPDIR": str(head.tmp), "MLFLOW_TRACKING_URI": head.uri, "HOME": str(head.home),
           "PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "platform.augment", "augcse", "--corpus", str(corpus),
                           "--out", str(tmp_path / "augmented"), "--set", "augmentations=4-aug"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    generators = _actors(head, "Generators")
    assert len(generators) > 1, [(a["class_name"], a["state"], a.get("node_id")) for a in generators]


def test_the_sweep_records_what_its_nodes_ran(head, sweep):
    """The sweep's parent run holds its nodes' hours from Ray's node table (the head and the nodes
    the autoscaler added), which the report sets beside the trials' GPU-hours."""
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    _, runs = runs_of(head.uri, "una")
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "true"]
    m = parent.data.metrics
    assert m["nodes_seen"] >= 2  # the head and at least one added node
    wall = (parent.info.end_time - parent.info.start_time) / 3.6e6
    assert 0.5 * wall < m["node_hours"] <= m["nodes_seen"] * wall, (m, wall)
    assert m["gpu_hours_offered"] == 0  # the fake cluster's nodes have no GPUs


def test_the_path_from_the_sweep_to_the_loss_is_short(head, sweep):
    """A reader follows ``python -m platform.tune una`` to ``F.cross_entropy`` through the project's
    own functions: the driver's stack where it hands the sweep to Tune, a trial's where it hands
    its fit to Ray Train and a Train worker's at its first loss (``tests/tracer`` records each),
    joined: at most ``MOST_HOPS_TO_THE_LOSS`` calls between the command's ``main`` and the loss."""
    assert sweep.returncode == 0, sweep.stderr[-4000:]
    stacks = [json.loads(line) for line in (head.trace.parent / (head.trace.name + ".stacks")).read_text().splitlines()]

    def first(target: str, last: str) -> list[str]:
        return next(s["stack"] for s in stacks if s["target"] == target and s["stack"] and s["stack"][-1].startswith(last))

    driver = first("Tuner.fit", "platform/tune.py:")
    trial = first("DataParallelTrainer.fit", "platform/run/fit.py:")
    worker = first("cross_entropy", "methods/losses.py:")
    assert trial[0] == "platform/tune.py:trial" and worker[0] == "platform/run/loop.py:train_loop_per_worker", (trial, worker)
    joined = driver[driver.index("platform/tune.py:main"):] + trial + worker
    path = [f for f in joined if not f.endswith(":wrapper")]  # cli_main's and off_the_main_thread's wrappers
    hops = len(path) - 1
    print(f"{hops} hops over {len({f.split(':')[0] for f in path})} files:\n  " + "\n  ".join(path))
    assert hops <= MOST_HOPS_TO_THE_LOSS, path
