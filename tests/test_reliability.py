"""Issue 7 on one machine: a two-node Ray cluster trains like one worker; a killed training worker
is replaced and the run resumes from its latest checkpoint with a clean metric history. (A sweep
interrupted on the driver and resumed, and a killed node, run on the multi-node topology with
object storage: tests/test_multinode.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ROOT
from tests.test_cli import _runs


@pytest.fixture()
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _sets(**kv):
    return [a for k, v in kv.items() for a in ("--set", f"{k}={v}")]


def _cli(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "platform.train", "simcse", *args], cwd=ROOT, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _weights(run_dir_checkpoint: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir_checkpoint, "model", "model.safetensors"))


def test_two_workers_on_two_nodes_equal_one_worker(two_node_cluster, tiny_model, small_corpus, tmp_path, mlflow_uri):
    """Same global batches (data_pipeline=local), no dropout: 2 workers on 2 nodes (1.5 CPUs each,
    so they cannot share a node) give the single worker's weights and dev scores."""
    common = dict(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=6, eval_steps=3, log_steps=1,
                  dropout=0.0, data_pipeline="local", final_eval="false", output_dir=tmp_path / "runs")
    env = {"RAY_ADDRESS": two_node_cluster.address, "MLFLOW_TRACKING_URI": mlflow_uri}
    results = {}
    for workers in (1, 2):
        proc = _cli(_sets(**common, num_workers=workers, cpus_per_worker=1.5), env)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results[workers] = out
    c, runs = _runs(mlflow_uri)
    by_workers = {int(r.data.params["num_workers"]): r for r in runs}
    assert set(by_workers) == {1, 2}
    dev = {w: [m.value for m in c.get_metric_history(r.info.run_id, "stsb_dev_spearman")] for w, r in by_workers.items()}
    assert dev[2] == pytest.approx(dev[1], abs=1e-3)
    loss = {w: sorted((m.step, m.value) for m in c.get_metric_history(r.info.run_id, "train_loss")) for w, r in by_workers.items()}
    assert [s for s, _ in loss[2]] == [s for s, _ in loss[1]] == list(range(1, 7))
    assert [v for _, v in loss[2]] == pytest.approx([v for _, v in loss[1]], rel=1e-4)
    w1, w2 = (_weights(by_workers[w].data.tags["best_checkpoint"]) for w in (1, 2))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=name)


def _train_workers(cluster) -> list:
    """The Ray Train workers of ``cluster`` (its raylets' children), not another Ray's on this machine."""
    import psutil

    raylets = {info.process.pid for node in cluster.list_all_nodes() for info in node.all_processes["raylet"]}
    found = []
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "RayTrainWorker" in cmd and proc.info["ppid"] in raylets:
            found.append(proc)
    return found


def test_killed_worker_resumes_from_latest_checkpoint(tiny_model, small_corpus, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    try:
        steps, eval_steps = 64, 8
        args = _sets(model=tiny_model, corpus=small_corpus, batch_size=4, max_steps=steps, eval_steps=eval_steps,
                     log_steps=1, num_workers=2, cpus_per_worker=0.5, final_eval="false", max_failures=2,
                     output_dir=tmp_path / "runs")
        proc = _cli(args, {"RAY_ADDRESS": cluster.address, "MLFLOW_TRACKING_URI": mlflow_uri})
        c = MlflowClient(mlflow_uri)
        killed, first_checkpoint_seen = None, None
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and killed is None:
            time.sleep(0.3)
            exp = c.get_experiment_by_name("simcse")
            runs = c.search_runs([exp.experiment_id]) if exp else []
            if not runs:
                continue
            if first_checkpoint_seen is None and c.get_metric_history(runs[0].info.run_id, "stsb_dev_spearman"):
                first_checkpoint_seen = time.time()
            # Ray Train's controller registers a reported checkpoint on its next poll of the
            # workers; a kill within that window would restart from the one before.
            if first_checkpoint_seen and time.time() - first_checkpoint_seen > 3:
                workers = _train_workers(cluster)
                if workers:
                    killed = max(m.step for m in c.get_metric_history(runs[0].info.run_id, "train_loss"))
                    workers[-1].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        assert killed is not None, "the run ended before a worker could be killed"
        assert proc.returncode == 0, err[-3000:]
        assert "resumed at step" in out + err
        c, runs = _runs(mlflow_uri)
        run = runs[0]
        assert run.info.status == "FINISHED"
        loss_steps = [m.step for m in c.get_metric_history(run.info.run_id, "train_loss")]
        assert sorted(loss_steps) == list(range(1, steps + 1))  # no gap, no duplicate
        dev_steps = [m.step for m in c.get_metric_history(run.info.run_id, "stsb_dev_spearman")]
        assert sorted(dev_steps) == list(range(eval_steps, steps + 1, eval_steps))
    finally:
        cluster.shutdown()
