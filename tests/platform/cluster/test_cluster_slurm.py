"""A sweep across a Slurm allocation with one command (``python -m platform.cluster slurm``), on a
real Slurm (``tests/slurm.py``: Debian's slurmctld here, a slurmd in each of two node namespaces,
this machine's disk as the shared filesystem, each node's /tmp its own). How it differs from a
site's Slurm: ``tests/slurm.py``'s ``DIFFERENCES`` (and docs/slurm.md).

One sweep (6 trials, 2 at a time: a Train worker of 1.5 CPUs fits once on a node of 2, beside its
data pipeline's 0.25-CPU tasks) is requeued twice mid-way (``scontrol requeue``, then the walltime
warning as Slurm's ``--signal=B:USR1`` sends it). Read from its outcome:

- it ran across the allocation: each start's command began once both nodes had joined (the second
  node starts Ray 30 s after the first), the trials trained on both nodes, and nothing of the job
  is left running on a node;
- it finishes on its third start with every trial's record intact in the job's MLflow (its shared
  copy): no finished trial redone, none left RUNNING, its checkpoints in the shared output folder.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, sets, wait_for

pytestmark = pytest.mark.scenario

SAMPLES = 6  # the sweep's trials, 2 at a time
SLOW_RAY_S = 30  # how much later the second node starts Ray than the first, at every start


@pytest.fixture(scope="module")
def slurm():
    from tests import slurm as slurm_module

    why = slurm_module.available()
    if why:
        if os.environ.get("PLATFORM_REQUIRE_MULTINODE"):
            pytest.fail(why)
        pytest.skip(why)
    # Not under /tmp: every node has its own /tmp; this folder is what they share.
    base = Path(tempfile.mkdtemp(prefix="platform-slurm-", dir="/var/tmp"))
    # n2's Ray starts 30 s after n1's: a command not held until every node joined would begin on n1's alone.
    cluster = slurm_module.Slurm(base / "slurm", slow_ray={"n2": SLOW_RAY_S})
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(slurm, data_root):
    """What the jobs read from the shared filesystem: a tiny BERT and a small corpus."""
    from platform.data import read_corpus
    from platform.data.columns import build_tiny_bert

    folder = slurm.base.parent / "shared"
    folder.mkdir()
    model = build_tiny_bert(folder / "tiny-bert")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(read_corpus(data_root / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=256))
                      + "\n", encoding="utf-8")
    return folder, model, corpus


def login_env(slurm, shared_folder: Path) -> dict[str, str]:
    """A login shell's environment: Slurm's configuration, the data, no test-only settings."""
    keep = ("PATH", "HOME", "LANG", "PLATFORM_DATA_DIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(SLURM_CONF=str(slurm.conf), PYTHONPATH=str(ROOT / "tests" / "tracer"),
               PLATFORM_TRACE_OUT=str(shared_folder / "calls.txt"), PLATFORM_CACHE_DIR=str(shared_folder / "cache"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return env


def submit(slurm, shared, name: str, samples: int, steps: int, *extra: str) -> tuple[str, Path]:
    folder, model, corpus = shared
    out = folder / name
    proc = subprocess.run(
        [sys.executable, "-m", "platform.cluster", "slurm", "--nodes", "2", "--cpus-per-task", "2", "--name", name,
         "--output", str(out), *extra, "--", "python", "-m", "platform.tune", "una", "--num-samples", str(samples),
         *sets(model=model, corpus=corpus, batch_size=8, max_steps=steps, eval_steps=2, log_steps=2, num_workers=1,
               cpus_per_worker=1.5, augment_cpus=0.25, use_gpu="false")],
        cwd=ROOT, env=login_env(slurm, folder), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = re.search(r"^submitted job (\d+)", proc.stdout, re.M).group(1)
    assert f"log: {out}/slurm-{job}.out" in proc.stdout
    return job, out


def job_state(slurm, job: str) -> dict[str, str]:
    text = slurm.run("scontrol", "show", "job", job).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def runs(out: Path) -> list[dict]:
    """The runs in the job's MLflow copy (the shared folder's), with their tags."""
    with sqlite3.connect(f"file:{out / 'mlflow' / 'mlflow.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT run_uuid, status, end_time FROM runs").fetchall()
        tags = db.execute("SELECT run_uuid, key, value FROM tags").fetchall()
    by_run = {r: {"id": r, "status": s, "end_time": e, "tags": {}} for r, s, e in rows}
    for r, k, v in tags:
        by_run[r]["tags"][k] = v
    return list(by_run.values())


def trials(out: Path) -> list[dict]:
    try:
        return [r for r in runs(out) if "trial_id" in r["tags"]]
    except sqlite3.Error:  # no copy yet
        return []


def log(out: Path, job: str) -> str:
    path = out / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.is_file() else ""


def waited(slurm, out: Path, job: str, what: str, condition, timeout: float):
    """``wait_for``, whose failure carries what the job left: its state, its log (ending with where
    each thread of its processes waits), its nodes' Ray logs and Slurm's own logs (the folders are
    gone once the fixture ends)."""
    try:
        return wait_for(what, condition, timeout=timeout)
    except AssertionError as exc:
        dump_stacks(out)
        nodes = "".join(f"\n--- {p.relative_to(out)}\n{p.read_text(errors='replace')[-1500:]}"
                        for p in sorted(out.glob(f"job-{job}/attempt-*/*.log")))
        raise AssertionError(f"{exc}\njob: {job_state(slurm, job)}\n--- the job's log\n{log(out, job)[-20000:]}"
                             f"{nodes}\n--- Slurm\n{slurm.log()[-4000:]}") from None


def dump_stacks(out: Path) -> None:
    """SIGUSR2 to the job's processes that run the platform command (the sweep's driver, and the job
    process that started it; their arguments name the shared folder): each prints every thread's
    stack into the job's log (``platform.errors.cli_main``)."""
    import signal
    import time

    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        command = " ".join(proc.info["cmdline"] or [])
        if "platform.tune" in command and str(out.parent) in command:
            try:
                proc.send_signal(signal.SIGUSR2)
            except psutil.Error:
                pass
    time.sleep(3)


@pytest.fixture(scope="module")
def requeued(slurm, shared):
    """One sweep (6 trials, 2 at a time, one Train worker per node) requeued twice mid-way: by
    ``scontrol requeue`` (what a preemption does) after a trial finished, then by the walltime warning
    after another. The trials finished before each requeue, the job's final state and its log."""
    job, out = submit(slurm, shared, "sweep", SAMPLES, 24)

    def finished() -> dict[str, int]:
        return {r["tags"]["trial_id"]: r["end_time"] for r in trials(out) if r["status"] == "FINISHED"}

    first = waited(slurm, out, job, "a trial to finish", finished, 900)
    assert slurm.run("scontrol", "requeue", job).returncode == 0
    waited(slurm, out, job, "the second start to resume the sweep",
           lambda: re.search(r"^slurm: running .* --resume$", log(out, job), re.M), 600)
    second = waited(slurm, out, job, "another trial to finish", lambda: len(finished()) > len(first) and finished(), 900)
    # Two at a time, and MLflow's shared copy up to 30 s behind: a pair may finish within one copy.
    assert len(second) < SAMPLES - 1  # two trials still to come
    assert slurm.run("scancel", "--signal=USR1", "--batch", job).returncode == 0  # as --signal=B:USR1@S sends it
    waited(slurm, out, job, "the job to requeue itself", lambda: f"slurm: job {job} requeued" in log(out, job), 600)
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    waited(slurm, out, job, "the job to end", lambda: job_state(slurm, job).get("JobState") in ended, 1200)
    state = job_state(slurm, job)
    return {"job": job, "out": out, "first": first, "second": second, "state": state, "log": log(out, job)}


def test_the_sweep_runs_across_the_allocation_and_leaves_nothing_on_a_node(slurm, shared, requeued):
    text = requeued["log"]
    assert requeued["state"]["JobState"] == "COMPLETED", (requeued["state"], text[-6000:], slurm.log()[-3000:])
    # Each start's command began once both nodes had joined: its Ray line counts their CPUs.
    assert text.count("slurm: all 2 node(s) joined Ray") == 3, text[-6000:]
    assert len(re.findall(r"^Ray: the cluster at \S+ \(RAY_ADDRESS\), 4 CPUs", text, re.M)) == 3, text[-6000:]
    sweeps = list((requeued["out"] / "runs").glob("una-sweep-*"))
    assert len(sweeps) == 1 and list(sweeps[0].rglob("checkpoint_*")), sorted(requeued["out"].rglob("*"))[:50]
    # The trials' Train workers ran on both nodes (one fits on a node at a time).
    calls = [line.split() for line in (shared[0] / "calls.txt").read_text().splitlines()]
    assert {host for _, module, name, host in calls if name == "train_loop_per_worker"} == {"n1", "n2"}
    # Nothing of the job is left on a node (Ray, MLflow, Python): the node's own slurmd, and Slurm's
    # step daemon while it ends.
    def left(node: str) -> list[str]:
        found = []
        for pid in slurm.pids(node):
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:  # ended meanwhile
                pass
        return [c for c in found if not c.startswith(("slurmd ", "slurmstepd", "unshare "))]

    for node in slurm.names:
        wait_for(f"nothing of the job left on {node}", lambda node=node: not left(node), timeout=60)


def test_a_sweep_requeued_twice_finishes_with_every_trial_record_intact(requeued):
    """The third start finishes the sweep; the trials finished before a requeue keep their runs (same
    ids, same end), none is left RUNNING, none is trained twice."""
    state, text, out = requeued["state"], requeued["log"], requeued["out"]
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, text[-8000:])
    assert state["Restarts"] == "2", state
    assert len(re.findall(r"^slurm: running .* --resume$", text, re.M)) == 2, text[-8000:]
    found = trials(out)
    assert len(found) == SAMPLES and all(r["status"] == "FINISHED" for r in found), found
    assert not [r for r in runs(out) if r["status"] == "RUNNING"]
    ends = {r["tags"]["trial_id"]: r["end_time"] for r in found}
    assert all(ends[t] == end for t, end in {**requeued["first"], **requeued["second"]}.items()), (requeued, ends)
    (parent,) = [r for r in runs(out) if r["tags"].get("sweep") == "true"]
    assert parent["status"] == "FINISHED"
