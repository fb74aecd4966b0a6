"""Reliability on one machine: ``train`` on a two-node Ray cluster, 2 DDP workers, trains exactly as
one plain process does, and the run is complete end to end (MLflow, artifacts, the evaluator).
(A killed node with 2 DDP workers, and a sweep interrupted on the driver and resumed, run on the
multi-node topology with object storage: tests/platform/cluster/test_multinode.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, run_cli, run_main, runs_of, sets

pytestmark = pytest.mark.scenario


@pytest.fixture()
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _train(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "platform.train", "simcse", *args], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def _weights(run_dir_checkpoint: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir_checkpoint, "model", "model.safetensors"))


def test_train_on_two_nodes_equals_one_process_end_to_end(two_node_cluster, tiny_model, small_corpus, tmp_path,
                                                          mlflow_uri):
    """Same global batches (data_pipeline=local), no dropout: 2 Ray Train workers on 2 nodes
    (1.5 CPUs each, so they cannot share a node) give the losses, dev scores and weights of the
    loop run in one plain process without Ray (runtime=process). The Ray run is then checked as
    a user sees it: the 7-task table, its MLflow run, the exported model, the evaluator."""
    common = dict(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=6, eval_steps=3, log_steps=1,
                  dropout=0.0, data_pipeline="local", output_dir=tmp_path / "runs")
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    proc = run_main("train", "simcse", *sets(**common, runtime="process", num_workers=1, final_eval="false"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train(sets(**common, num_workers=2, cpus_per_worker=1.5), {**env, "RAY_ADDRESS": two_node_cluster.address})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STS12" in proc.stdout and "avg" in proc.stdout
    c, runs = runs_of(mlflow_uri)
    by_runtime = {r.data.tags["run.runtime"]: r for r in runs}
    assert set(by_runtime) == {"process", "ray"} and by_runtime["ray"].data.tags["run.num_workers"] == "2"
    history = {rt: {key: sorted((m.step, m.value) for m in c.get_metric_history(r.info.run_id, key))
                    for key in ("stsb_dev_spearman", "train_loss")} for rt, r in by_runtime.items()}
    for key, steps, tolerance in (("stsb_dev_spearman", [3, 6], {"abs": 1e-3}),
                                  ("train_loss", list(range(1, 7)), {"rel": 1e-4})):
        assert [s for s, _ in history["ray"][key]] == [s for s, _ in history["process"][key]] == steps
        assert [v for _, v in history["ray"][key]] == pytest.approx([v for _, v in history["process"][key]], **tolerance)
    w_process, w_ray = (_weights(by_runtime[rt].data.tags["best_checkpoint"]) for rt in ("process", "ray"))
    for name in w_process:
        torch.testing.assert_close(w_ray[name], w_process[name], rtol=1e-4, atol=1e-5, msg=name)

    run = by_runtime["ray"]
    assert run.info.status == "FINISHED"
    assert run.data.tags["method"] == "simcse" and run.data.tags["profile"] == "local"
    assert len(run.data.tags["git_commit"]) >= 7
    assert run.data.params["batch_size"] == "8" and run.data.params["temperature"] == "0.05"
    for task in ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"):
        assert f"sts_{task}" in run.data.metrics
    # the model: once, logged; beside it its scores, their per-pair similarities, its configuration and its geometry figure
    assert {a.path for a in c.list_artifacts(run.info.run_id)} == {"sts_results.json", "sts_pairs.npz", "config.json", "plots"}
    assert {a.path for a in c.list_artifacts(run.info.run_id, "plots")} == {"plots/geometry.png"}

    import mlflow
    from sentence_transformers import SentenceTransformer

    mlflow.set_tracking_uri(mlflow_uri)
    st_dir = mlflow.artifacts.download_artifacts(run.data.tags["logged_model"], dst_path=str(tmp_path / "dl"))
    st_dir = f"{st_dir}/model.sentence_transformer"
    assert SentenceTransformer(st_dir, device="cpu").encode(["a test sentence ."]).shape == (1, 32)
    results = json.loads(open(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="sts_results.json", tracking_uri=mlflow_uri, dst_path=str(tmp_path / "dl2"),
    )).read())
    assert results["scores"]["avg"] == pytest.approx(run.data.metrics["sts_avg"])

    # The evaluator accepts the training checkpoint and recovers its evaluation pooler.
    ckpt = run.data.tags["best_checkpoint"]
    ev = run_cli("evaluate", ckpt, "--tasks", "STSBenchmark", "--json", str(tmp_path / "ev.json"))
    assert ev.returncode == 0, ev.stderr[-2000:]
    scores = json.loads((tmp_path / "ev.json").read_text())
    assert scores["pooler"] == "cls_before_pooler"
    assert scores["scores"]["STSBenchmark"] == pytest.approx(run.data.metrics["sts_STSBenchmark"], abs=1e-6)
