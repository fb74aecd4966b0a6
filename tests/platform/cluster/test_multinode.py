"""The cluster of cluster.yaml on one machine (``tests/topology.py``): a Ray head with no CPUs
running the driver, an MLflow server whose artifacts go to an S3 endpoint, two worker nodes that
see neither the data folder nor the repository's runs/, mlruns/ or caches. Only the network and
the S3 endpoint connect them; ``output_dir`` is an ``s3://`` URI.

These tests need mount namespaces (root). Where ``unshare --mount`` is refused they skip with the
reason, except under ``PLATFORM_REQUIRE_MULTINODE=1`` (set by ``.ci/run``), where they fail.

The drivers run from a copy of the repository with the test ingredient ``aux=barrier``
(``tests/barrier.py``), which holds a run at a chosen step while a file says so: each test
interrupts its run there, mid-fit, every time.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.topology import BUCKET, Topology, available, processes
from tests.helpers import ROOT, assert_user_error, commits_step, release_barrier, repo_with_barrier, runs_of, sets, start_cli, steps_of, wait_for

pytestmark = pytest.mark.scenario


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    why = available()
    if why:
        if os.environ.get("PLATFORM_REQUIRE_MULTINODE") == "1":
            pytest.fail(f"multi-node tests required here, but: {why}")
        pytest.skip(why)
    topo = Topology(base=tmp_path_factory.mktemp("topology"), workers=2, cpus_per_worker=2)
    topo.up()
    os.environ.update(topo.mlflow_account)  # this process reads the server as a user would
    try:
        yield topo, repo_with_barrier(tmp_path_factory.mktemp("repo"))
    finally:
        for key in topo.mlflow_account:
            os.environ.pop(key, None)
        topo.down()
    # As after `ray stop`: no later Ray job on this machine is pointed at the stopped cluster.
    from ray._common.utils import get_ray_address_file

    address_file = Path(get_ray_address_file(None))
    assert not (address_file.is_file() and address_file.read_text().strip().endswith(f":{topo.gcs_port}"))


def _head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _driver(topology, module: str, args: list[str]) -> subprocess.Popen:
    """The driver on the head (the repository with the barrier), with the variables README "On a
    cluster" sets; the platform's cache where the workers cannot see it."""
    topo, repo = topology
    env = {**topo.client_env(), "PLATFORM_GIT_COMMIT": _head_commit(), "PLATFORM_CACHE_DIR": str(ROOT / ".cache" / "platform")}
    return start_cli(module, *args, env=env, cwd=repo)


def _barrier(folder: Path, step: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return {"aux": "barrier", "barrier_dir": folder, "barrier_step": step}


@pytest.fixture(scope="module")
def sweep(topology, tiny_model, small_corpus, tmp_path_factory):
    """A UNA sweep of 2 trials, one after the other (Ray Data on the workers, TF-IDF statistics
    made once on the head), sent SIGTERM (``ray job stop``) while its second trial is held mid-fit,
    then resumed with the same command and ``--resume``, then resumed once more."""
    topo, _ = topology
    tmp = tmp_path_factory.mktemp("una-sweep")
    output = topo.storage("una-sweep")
    space = tmp / "una.yaml"  # one trial at a time, no early stopping: the second trial reaches the barrier
    space.write_text((ROOT / "tune_spaces" / "una.yaml").read_text().replace("type: asha", "type: none")
                     .replace("local: {num_samples: 4, max_concurrent_trials: 2}", "local: {num_samples: 2, max_concurrent_trials: 1}"))
    barrier = tmp / "barrier"
    args = ["una", "--space", str(space), *sets(
        model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=6, eval_steps=3, log_steps=1,
        num_workers=1, use_gpu="false", output_dir=output, **_barrier(barrier, step=5))]
    proc = _driver(topology, "tune", args)

    def trials(status: str) -> list:
        return [r for r in runs_of(topo.tracking_uri, "una")[1] if r.data.tags.get("trial_id") and r.info.status == status]

    def registered():  # a fit resumes from the checkpoints the controller committed (its points come live, before)
        return _committed_in_s3(topo, "una-sweep", 3, besides=out["first"].data.tags["trial_id"])

    out = {"first": wait_for("the first trial to finish", lambda: trials("FINISHED"), proc=proc)[0], "output": output}
    (barrier / "armed").touch()
    wait_for("the second trial to reach step 5", (barrier / "blocked").exists, proc=proc)
    wait_for("its checkpoint of step 3", registered, proc=proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    out["stopped"] = (proc.returncode, stdout, stderr)
    out["reserved_after_stop"] = topo.reserved()  # the driver has exited: its job's groups released
    release_barrier(barrier)
    out["after_stop"] = runs_of(topo.tracking_uri, "una")[1]
    resumed = _driver(topology, "tune", [*args, "--resume"])
    stdout, stderr = resumed.communicate(timeout=900)
    out["resumed"] = (resumed.returncode, stdout, stderr)
    out["client"], out["runs"] = runs_of(topo.tracking_uri, "una")
    again = _driver(topology, "tune", [*args, "--resume"])
    stdout, stderr = again.communicate(timeout=600)
    out["again"] = subprocess.CompletedProcess(args, again.returncode, stdout, stderr)
    return out


def _children(runs) -> list:
    return [r for r in runs if r.data.tags.get("trial_id")]


def test_sigterm_stops_a_sweep_as_ctrl_c(sweep):
    """Exit 130 with the resume command printed; the finished trial FINISHED, the cut trial's run
    and the sweep's KILLED, none RUNNING; the cut trial's points up to its last checkpoint."""
    code, out, err = sweep["stopped"]
    assert code == 130, err[-3000:]
    assert "--resume" in out
    status = {r.data.tags.get("trial_id", "parent"): r.info.status for r in sweep["after_stop"]}
    assert status == {sweep["first"].data.tags["trial_id"]: "FINISHED", "parent": "KILLED",
                      **{t: "KILLED" for t in status if t not in ("parent", sweep["first"].data.tags["trial_id"])}}
    assert len(status) == 3
    # Nothing of the sweep stays reserved on the cluster (a trial stopped while Ray Train restarted
    # its worker group once left a group holding a worker's CPU after its job had ended).
    assert sweep["reserved_after_stop"] == [], sweep["reserved_after_stop"]


def test_the_resumed_sweep_continues_the_cut_trial_in_its_run(sweep):
    """The finished trial does not run again; the cut trial continues in its own run from its
    checkpoint of step 3, every step once; every run ends FINISHED with the real commit."""
    code, out, err = sweep["resumed"]
    assert code == 0, err[-3000:]
    assert "best trial" in out and f"{sweep['output']}/" in out
    c, runs = sweep["client"], sweep["runs"]
    cut = next(r for r in sweep["after_stop"] if r.data.tags.get("trial_id") and r.info.status == "KILLED")
    assert {r.info.run_id for r in _children(runs)} == {cut.info.run_id, sweep["first"].info.run_id}
    cut = c.get_run(cut.info.run_id)
    assert cut.data.tags["platform.resumed"] == "1"
    assert steps_of(c, cut.info.run_id, "train_loss") == list(range(1, 7))
    assert steps_of(c, cut.info.run_id, "stsb_dev_spearman") == [3, 6]
    assert steps_of(c, cut.info.run_id, "resumed_at_step") == [3]
    commit = _head_commit()
    for run in runs:
        assert run.info.status == "FINISHED", run.info
        assert run.data.tags["git_commit"] == commit


def test_the_best_trial_is_finalized_from_s3(sweep):
    """The best of the FINISHED trials: its checkpoint in S3, its 7-task table on it and the parent,
    its export in the server's artifact store (not on the head's disk)."""
    c, runs = sweep["client"], sweep["runs"]
    children = _children(runs)
    (parent,) = [r for r in runs if not r.data.tags.get("trial_id")]
    best = next(r for r in children if r.info.run_id == parent.data.tags["best_run_id"])
    assert best.data.metrics["best_stsb_dev_spearman"] == max(r.data.metrics["best_stsb_dev_spearman"] for r in children)
    assert "best.sts_avg" in parent.data.metrics and "sts_avg" in best.data.metrics
    for child in children:
        assert {"una.alpha", "una.beta", "una.r", "lr"} <= set(child.data.params)
        assert child.data.tags["best_checkpoint"].startswith(f"s3://{BUCKET}/")
    assert parent.data.tags["best_checkpoint"].startswith(f"{sweep['output']}/una-sweep-")
    # the model: once, logged; beside it its scores, their per-pair similarities, its configuration and its geometry figure
    assert {a.path for a in c.list_artifacts(best.info.run_id)} == {"sts_results.json", "sts_pairs.npz", "config.json", "plots"}
    assert {a.path for a in c.list_artifacts(best.info.run_id, "plots")} == {"plots/geometry.png"}
    assert best.data.tags["logged_model"].startswith("models:/m-")


def test_artifacts_and_data_never_touch_a_workers_disk(topology, sweep):
    """MLflow's artifacts are in the S3 store behind the server; the TF-IDF statistics were made
    once, on the head, and reached the workers through the object store: nothing was read from or
    written to a worker's own copy of the head's folders."""
    topo, _ = topology
    s3 = topo.s3_client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="mlflow/").get("Contents", [])]
    assert any(k.endswith("sts_results.json") for k in keys)
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="una-sweep/").get("KeyCount", 0) > 0
    for i in range(topo.workers):
        for hidden, disk in topo.worker_disks(i).items():
            assert not any(disk.iterdir()), f"worker{i} wrote into its {hidden}: {sorted(disk.rglob('*'))[:5]}"


def test_the_best_model_downloads_from_the_server_and_loads(topology, sweep, tmp_path):
    import mlflow
    from sentence_transformers import SentenceTransformer

    topo, _ = topology
    (parent,) = [r for r in sweep["runs"] if not r.data.tags.get("trial_id")]
    best = sweep["client"].get_run(parent.data.tags["best_run_id"])
    mlflow.set_tracking_uri(topo.tracking_uri)
    local = mlflow.artifacts.download_artifacts(best.data.tags["logged_model"], dst_path=str(tmp_path))
    local = f"{local}/model.sentence_transformer"
    emb = SentenceTransformer(local, device="cpu").encode(["A man is playing a guitar.", "A woman slices a tomato."])
    assert emb.shape == (2, 32)


def test_resuming_a_finished_sweep_is_refused(sweep):
    assert_user_error(sweep["again"], "finished", "nothing to resume")


def _checkpointed(topo, step: int) -> bool:
    """Whether Ray Train's controller committed the run's checkpoint of ``step``."""
    return _committed_in_s3(topo, "killed-node", step)


def _committed_in_s3(topo, prefix: str, step: int, besides: str | None = None) -> bool:
    """Whether Ray Train's controller has committed the checkpoint of ``step`` of a fit under
    ``prefix`` in the topology's bucket, other than trial ``besides``."""
    s3 = topo.s3_client()
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    return any(commits_step(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read(), step)
               for key in [o["Key"] for page in pages for o in page.get("Contents", [])]
               if key.endswith("/checkpoint_manager_snapshot.json") and not (besides and f"/{besides}/" in key))


def _train_workers() -> list[int]:
    return [pid for pid, cmd in processes() if "RayTrainWorker" in cmd]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_worker_node_killed_mid_run_resumes_from_s3(topology, tiny_model, small_corpus, tmp_path):
    """A 2-worker DDP run held at step 20 (checkpoints of steps 8 and 16 in S3): the raylet of a
    node running a Train worker is killed (its workers die with it). Ray Train restarts the worker
    group on the nodes left from the checkpoint of step 16, every rank from its own state, and the
    run finishes with a clean metric history (every step and every evaluation once). Runs last: it
    takes a node down (and brings it back for whatever runs after)."""
    topo, _ = topology
    assert topo.reserved() == [], "the cluster holds placement groups from earlier runs: the group cannot restart"
    steps, eval_steps = 48, 8
    barrier = tmp_path / "barrier"
    held = _barrier(barrier, step=20)
    (barrier / "armed").touch()
    # 1 CPU per worker: the group fits on one 2-CPU node, so it can restart on the node left.
    args = ["simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=4, max_steps=steps,
                            eval_steps=eval_steps, log_steps=1, num_workers=2, cpus_per_worker=1, use_gpu="false",
                            final_eval="false", max_failures=2, data_pipeline="local",
                            output_dir=topo.storage("killed-node"), **held)]
    proc = _driver(topology, "train", args)
    killed_node = None
    try:
        wait_for("the run to reach step 20", (barrier / "blocked").exists, proc=proc)
        wait_for("its checkpoint of step 16", lambda: _checkpointed(topo, 16), proc=proc)
        node = next(n for n in map(topo.node_of, _train_workers()) if n is not None)
        doomed = [pid for pid in _train_workers() if topo.node_of(pid) == node]
        os.kill(topo.raylet_pid(node), signal.SIGKILL)
        killed_node = node
        # Its workers exit once they see their raylet gone; released before that, they trained on to
        # the checkpoint of step 24 and the group resumed there (seen on CI).
        wait_for("the killed node's Train workers to exit", lambda: not any(map(_alive, doomed)), proc=proc)
        release_barrier(barrier, kill_held=False)  # the group restarts from step 16 and passes
        try:  # the group restarts and finishes in about 30 s
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            state = topo.state()
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the run did not finish after the node was killed; Ray's state:\n{state}\n"
                        f"driver's stderr:\n{err[-4000:]}")
    finally:
        if killed_node is not None:
            topo.join_worker(killed_node, topo.workers + 1)
    assert proc.returncode == 0, err[-3000:]
    # Ray Train's own notes on the lost workers (its retry's traceback, their failed shutdown: ~45
    # lines each) stay in Ray's logs; the raylet's one line says that a worker died.
    for internal in ("[FailurePolicy]", "Graceful shutdown of backend failed"):
        assert internal not in out + err, (internal, out[-3000:], err[-3000:])
    c, runs = runs_of(topo.tracking_uri, "simcse")
    run = next(r for r in runs if r.data.tags.get("run.output_dir", "").endswith("killed-node"))
    # The restart is read from the run's history: a restarted worker's console line reaches the
    # driver through Ray's log monitor, which may drop it.
    assert steps_of(c, run.info.run_id, "resumed_at_step") == [16]
    assert run.info.status == "FINISHED"
    assert run.data.tags["git_commit"] == _head_commit()
    assert run.data.tags["best_checkpoint"].startswith(f"s3://{BUCKET}/killed-node/")
    assert steps_of(c, run.info.run_id, "train_loss") == list(range(1, steps + 1))  # no gap, no duplicate
    assert steps_of(c, run.info.run_id, "stsb_dev_spearman") == list(range(eval_steps, steps + 1, eval_steps))
