"""The cluster of cluster.yaml on one machine (``benchmarks/topology.py``): a Ray head with no CPUs
running the driver, an MLflow server whose artifacts go to an S3 endpoint, two worker nodes that
see neither the data folder nor the repository's runs/, mlruns/ or caches. Only the network and
the S3 endpoint connect them; ``output_dir`` is an ``s3://`` URI.

These tests need mount namespaces (root). Where ``unshare --mount`` is refused they skip with the
reason, except under ``PLATFORM_REQUIRE_MULTINODE=1`` (set by ``.ci/run``), where they fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.topology import BUCKET, Topology, available, processes
from tests.conftest import ROOT

pytestmark = pytest.mark.multinode


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    why = available()
    if why:
        if os.environ.get("PLATFORM_REQUIRE_MULTINODE") == "1":
            pytest.fail(f"multi-node tests required here, but: {why}")
        pytest.skip(why)
    topo = Topology(base=tmp_path_factory.mktemp("topology"), workers=2, cpus_per_worker=2)
    topo.up()
    yield topo
    topo.down()
    # As after `ray stop`: no later Ray job on this machine is pointed at the stopped cluster.
    from ray._common.utils import get_ray_address_file

    address_file = Path(get_ray_address_file(None))
    assert not (address_file.is_file() and address_file.read_text().strip().endswith(f":{topo.gcs_port}"))


def _head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _driver(topo: Topology, module: str, args: list[str]) -> subprocess.Popen:
    """The driver on the head: the platform's command with the variables README "On a cluster" sets."""
    env = {**os.environ, **topo.client_env()}
    return subprocess.Popen([sys.executable, "-m", f"platform.{module}", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sets(**kv) -> list[str]:
    return [a for k, v in kv.items() for a in ("--set", f"{k}={v}")]


def _runs(topo: Topology, experiment: str):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(topo.tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    return c, (c.search_runs([exp.experiment_id]) if exp else [])


def test_una_sweep_interrupted_on_the_driver_resumes_from_s3(topology, tiny_model, small_corpus, tmp_path):
    """A UNA sweep of 3 trials (Ray Data on the workers, TF-IDF statistics made once on the head)
    interrupted on the driver (SIGINT) once a trial has finished resumes from the sweep and Tune
    state in S3 without re-running finished trials; every run ends FINISHED in the MLflow server
    with the real commit; the best checkpoint lives in S3, its 7-task table is in MLflow and its
    sentence-transformers export downloads from the server's artifact store and loads; resuming
    the finished sweep runs nothing again."""
    output = topology.storage("una-sweep")
    args = ["una", "--num-samples", "3", *_sets(
        model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=6, eval_steps=3, log_steps=1,
        num_workers=1, use_gpu="false", output_dir=output)]
    proc = _driver(topology, "tune", args)
    deadline = time.time() + 600
    finished: set[str] = set()
    while time.time() < deadline and proc.poll() is None and not finished:
        time.sleep(0.5)
        _, runs = _runs(topology, "una")
        finished = {r.data.tags["trial_id"] for r in runs if r.data.tags.get("trial_id") and r.info.status == "FINISHED"}
    assert finished, "no trial finished before the sweep ended"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    if proc.returncode == 0:
        pytest.skip("the sweep completed before the interrupt reached it")
    assert proc.returncode == 130, err[-3000:]
    assert "--resume" in out
    c, runs = _runs(topology, "una")
    assert not [r for r in runs if r.info.status == "RUNNING"]
    done_before = {r.data.tags["trial_id"] for r in runs if r.data.tags.get("trial_id") and r.info.status == "FINISHED"}
    assert finished <= done_before

    resumed = _driver(topology, "tune", [*args, "--resume"])
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-3000:]
    assert "best trial" in out and f"{output}/" in out
    c, runs = _runs(topology, "una")
    children = [r for r in runs if r.data.tags.get("trial_id")]
    per_trial: dict[str, list] = {}
    for r in children:
        per_trial.setdefault(r.data.tags["trial_id"], []).append(r)
    assert len(per_trial) == 3
    for trial_id in done_before:
        assert len(per_trial[trial_id]) == 1  # a finished trial did not run again
    parents = [r for r in runs if not r.data.tags.get("trial_id")]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    commit = _head_commit()
    for run in runs:
        assert run.info.status in ("FINISHED", "KILLED"), run.info  # KILLED: a trial's run cut by the interrupt
        assert run.data.tags["git_commit"] == commit
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.info.status == "FINISHED"
    assert best.data.metrics["best_stsb_dev_spearman"] == max(
        r.data.metrics.get("best_stsb_dev_spearman", -1e9) for r in children)
    assert "sts_avg" in parent.data.metrics and "sts_avg" in best.data.metrics
    for child in children:
        assert {"alpha", "beta", "r", "lr"} <= set(child.data.params)
        if child.info.status == "FINISHED":
            assert child.data.tags["best_checkpoint"].startswith(f"s3://{BUCKET}/")
    assert parent.data.tags["best_checkpoint"].startswith(f"{output}/una-sweep-")
    assert {a.path for a in c.list_artifacts(best.info.run_id, "best_checkpoint")} == {
        "best_checkpoint/hf", "best_checkpoint/sentence-transformers"}

    # The artifacts are in the S3 store behind the server, not on the head's disk.
    s3 = topology.s3_client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlflow/").get("Contents", [])]
    assert any(k.endswith("sts_results.json") for k in keys)
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="una-sweep/").get("KeyCount", 0) > 0

    # Nothing was read from or written to a worker's own copy of the head's folders: the TF-IDF
    # statistics were made once, on the head, and reached the workers through the object store.
    for i in range(topology.workers):
        for hidden, disk in topology.worker_disks(i).items():
            assert not any(disk.iterdir()), f"worker{i} wrote into its {hidden}: {sorted(disk.rglob('*'))[:5]}"

    import mlflow
    from sentence_transformers import SentenceTransformer

    local = mlflow.artifacts.download_artifacts(run_id=best.info.run_id,
                                                artifact_path="best_checkpoint/sentence-transformers",
                                                tracking_uri=topology.tracking_uri, dst_path=str(tmp_path))
    emb = SentenceTransformer(local, device="cpu").encode(["A man is playing a guitar.", "A woman slices a tomato."])
    assert emb.shape == (2, 32)

    again = _driver(topology, "tune", [*args, "--resume"])
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    c, runs = _runs(topology, "una")
    assert len([r for r in runs if r.data.tags.get("trial_id")]) == len(children)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    assert parent.data.tags["best_run_id"] in out


def _train_workers() -> list[int]:
    return [pid for pid, cmd in processes() if "RayTrainWorker" in cmd]


def test_worker_node_killed_mid_run_resumes_from_s3(topology, tiny_model, small_corpus):
    """A 2-worker DDP run: the raylet of a node running a Train worker is killed (its workers die
    with it) after a checkpoint reached S3. Ray Train restarts the worker group on the nodes left
    from that checkpoint, every rank from its own state, and the run finishes with a clean metric
    history (every step and every evaluation once). Runs last: it takes a node down (and brings
    it back for whatever runs after)."""
    steps, eval_steps = 48, 8
    # 1 CPU per worker: the group fits on one 2-CPU node, so it can restart on the node left.
    args = ["simcse", *_sets(model=tiny_model, corpus=small_corpus, batch_size=4, max_steps=steps,
                             eval_steps=eval_steps, log_steps=1, num_workers=2, cpus_per_worker=1, use_gpu="false",
                             final_eval="false", max_failures=2, data_pipeline="local",
                             output_dir=topology.storage("killed-node"))]
    proc = _driver(topology, "train", args)
    killed_node, first_checkpoint_seen = None, None
    deadline = time.time() + 400
    try:
        while time.time() < deadline and proc.poll() is None and killed_node is None:
            time.sleep(0.3)
            c, runs = _runs(topology, "simcse")
            runs = [r for r in runs if r.data.params.get("output_dir", "").endswith("killed-node")]
            if not runs:
                continue
            if first_checkpoint_seen is None and c.get_metric_history(runs[0].info.run_id, "stsb_dev_spearman"):
                first_checkpoint_seen = time.time()
            # Ray Train registers a reported checkpoint on its next poll of the workers.
            if first_checkpoint_seen and time.time() - first_checkpoint_seen > 3:
                for pid in _train_workers():
                    node = topology.node_of(pid)
                    if node is not None:
                        os.kill(topology.raylet_pid(node), signal.SIGKILL)
                        killed_node = node
                        break
        out, err = proc.communicate(timeout=600)
    finally:
        if killed_node is not None:
            topology.start_worker(killed_node)
            topology.wait_for_nodes(topology.workers + 1)
    assert killed_node is not None, "the run ended before its node could be killed"
    assert proc.returncode == 0, err[-3000:]
    assert "resumed at step" in out + err
    c, runs = _runs(topology, "simcse")
    run = next(r for r in runs if r.data.params.get("output_dir", "").endswith("killed-node"))
    assert run.info.status == "FINISHED"
    assert run.data.tags["git_commit"] == _head_commit()
    assert run.data.tags["best_checkpoint"].startswith(f"s3://{BUCKET}/killed-node/")
    loss_steps = [m.step for m in c.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(loss_steps) == list(range(1, steps + 1))  # no gap, no duplicate
    dev_steps = [m.step for m in c.get_metric_history(run.info.run_id, "stsb_dev_spearman")]
    assert sorted(dev_steps) == list(range(eval_steps, steps + 1, eval_steps))
