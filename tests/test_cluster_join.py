"""The cluster users launch: a Ray head that offers no CPUs and worker nodes that Ray's autoscaler
adds from 0 (its fake multi-node provider, ``RAY_FAKE_CLUSTER=1``: real raylets on this machine,
started and stopped by the real autoscaler). On it, as on the head of ``cluster.yaml``:

- the README's sweep command, run with no ``RAY_ADDRESS`` (a shell after ``ray attach``), joins that
  cluster (Ray's convention: what ``ray start`` recorded), and its trials finish once the
  autoscaler has added nodes;
- the README's ``ray job submit`` line (``--working-dir .`` and the commit in ``env_vars``) runs a
  job whose run ends FINISHED with that commit, its caches outside the job's temporary copy;
- a job that would write into its temporary copy is refused with one line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, RayHead, runs_of, sets, wait_for

pytestmark = pytest.mark.multinode

WORKER_CPUS = 2


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


def _head(tmp_path_factory, empty_db, name: str, args_for) -> RayHead:
    """A head as cluster.yaml starts it: MLFLOW_TRACKING_URI and PLATFORM_DATA_DIR exported before
    ``ray start``, so every driver and job on it inherits them; a HOME of its own, where a job's
    caches go."""
    import tempfile

    from tests.helpers import new_mlflow_db

    base = tmp_path_factory.mktemp(name)
    uri = new_mlflow_db(empty_db, base / "mlflow.db")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rayc-"))  # short: Ray's socket paths live under it
    home = base / "home"
    home.mkdir()
    head = RayHead(ray_tmp, env={"RAY_FAKE_CLUSTER": "1" if name == "fake-cluster" else "0", "MLFLOW_TRACKING_URI": uri, "HOME": str(home),
                                 "PLATFORM_DATA_DIR": os.environ["PLATFORM_DATA_DIR"]})
    head.args = args_for(head, base)
    head.uri, head.home = uri, home
    return head.start()


@pytest.fixture(scope="module")
def head(tmp_path_factory, _empty_mlflow_db):
    """The autoscaling cluster: a head with no CPUs, workers from 0."""
    def args(head, base):
        config = base / "autoscaling.yaml"
        config.write_text(yaml.safe_dump(fake_cluster_config(head.port)))
        return ["--num-cpus", "0", "--num-gpus", "0", f"--autoscaling-config={config}"]

    head = _head(tmp_path_factory, _empty_mlflow_db, "fake-cluster", args)
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def job_head(tmp_path_factory, _empty_mlflow_db):
    """A plain ``ray start --head`` with this machine's CPUs, for jobs. (The fake provider's nodes
    share one session folder on this machine, where each node's runtime-env agent manages the same
    unpacked job copies: a job's copy can vanish under its driver there, never on real nodes.)"""
    head = _head(tmp_path_factory, _empty_mlflow_db, "job-head", lambda head, base: ["--num-cpus", "2"])
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


def _tiny(tiny_model, small_corpus, output: Path) -> list[str]:
    return sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, log_steps=2,
                num_workers=1, use_gpu="false", output_dir=output)


def test_the_sweep_on_the_head_joins_the_cluster_and_its_trials_finish_on_added_nodes(head, tiny_model, small_corpus,
                                                                                      tmp_path):
    """``python -m platform.tune una`` in a shell on the head (no RAY_ADDRESS): a driver of that
    cluster, not a private Ray; the head has no CPUs, so every trial ran on nodes the autoscaler
    added from 0; every trial FINISHED."""
    wait_for("the head's raylet", lambda: _alive_nodes(head) == 1, timeout=60)  # the head alone: workers start at 0
    env = {**os.environ, "RAY_TMPDIR": str(head.tmp), "MLFLOW_TRACKING_URI": head.uri}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "platform.tune", "una", "--num-samples", "2",
                           *_tiny(tiny_model, small_corpus, tmp_path / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(rf"^Ray: the cluster this machine belongs to, at \S+:{head.port}", proc.stdout, re.M), proc.stdout
    assert _alive_nodes(head) >= 2
    drivers = [j for j in _jobs(head) if j.get("type") == "DRIVER" and "platform.tune" in (j.get("entrypoint") or "")]
    assert drivers and all(j["status"] == "SUCCEEDED" for j in drivers), _jobs(head)
    _, runs = runs_of(head.uri, "una")
    trials = [r for r in runs if r.data.tags.get("trial_id")]
    assert len(trials) == 2 and all(r.info.status == "FINISHED" for r in trials)


def _readme_job_submit() -> str:
    """The README's ``ray job submit`` command up to its entrypoint (``--``), lines joined."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^ray job submit .*?(?<!\\)$", text, re.M | re.S)
    assert match, "README shows no ray job submit command"
    command = match.group(0).replace("\\\n", " ")
    return command.split(" -- ", 1)[0]


def _submit(head, entrypoint: list[str], env_vars: dict | None = None, wait: bool = True) -> subprocess.CompletedProcess:
    command = _readme_job_submit().replace("http://127.0.0.1:8265", head.dashboard)
    assert head.dashboard in command
    if env_vars:  # a job-specific variable beside the README's commit
        command = command.replace('{\\"env_vars\\": {', "{\\\"env_vars\\\": {" + "".join(
            f'\\"{k}\\": \\"{v}\\", ' for k, v in env_vars.items()), 1)
    full = f"{command} {'' if wait else '--no-wait '}-- {shlex.join(entrypoint)}"
    env = {**os.environ, "RAY_TMPDIR": str(head.tmp)}
    for key in ("RAY_ADDRESS", "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES"):  # a user's shell has neither
        env.pop(key, None)
    deadline = time.monotonic() + 90
    while True:
        proc = subprocess.run(["bash", "-c", full], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        # A head just started answers before its job agent registers, and says to try again.
        if "No available agent to submit job" not in proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(2)


def test_ray_job_submit_as_the_readme_writes_it(job_head, tiny_model, small_corpus, tmp_path):
    """The job carries the repository (--working-dir .) and the commit (env_vars); the platform
    adds only what the job lacks. Its run ends FINISHED with the submitted commit, and the
    caches it made are in the node's cache folder, not in the job's temporary copy."""
    head = job_head
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    proc = _submit(head, ["python", "-m", "platform.train", "simcse", *_tiny(tiny_model, small_corpus, tmp_path / "runs")])
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]
    assert re.search(r"Ray: job \S+ of the cluster at ", proc.stdout), proc.stdout[-3000:]
    _, runs = runs_of(head.uri, "simcse")
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["git_commit"] == commit
    assert Path(run.data.tags["best_checkpoint"]).is_relative_to(tmp_path / "runs")
    cache = head.home / ".cache" / "contrastive-platform"
    assert any(cache.iterdir())
    copies = [c for c in head.tmp.glob("ray/session_*/runtime_resources/working_dir_files/_ray_pkg_*") if c.is_dir()]
    # (Empty folders of the submitting checkout travel in the copy; nothing may be written into them.)
    written = [f for c in copies for name in (".cache", "runs", "mlruns") for f in (c / name).rglob("*") if f.is_file()]
    assert copies and not written, written


@pytest.mark.parametrize("entry,env_vars,needle", [
    (["--set", "num_workers=1"], {}, "would be inside the job's temporary copy"),
    (["--set", "output_dir=/tmp"], {"MLFLOW_TRACKING_URI": ""}, "MLFLOW_TRACKING_URI is unset"),
])
def test_a_job_that_would_write_into_its_temporary_copy_is_refused(job_head, entry, env_vars, needle):
    head = job_head
    proc = _submit(head, ["python", "-m", "platform.train", "simcse", *entry], env_vars=env_vars)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
