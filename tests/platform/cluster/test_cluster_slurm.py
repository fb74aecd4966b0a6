"""A sweep across a Slurm allocation with one command (``python -m platform.cluster slurm``), on a
real Slurm (``tests/slurm.py``: Debian's slurmctld here, a slurmd in each of two node namespaces on
addresses outside the private ranges, this machine's disk as the shared filesystem, each node's /tmp
its own, Slurm's default of one CPU per task). How it differs from a site's Slurm: ``tests/slurm.py``'s
``DIFFERENCES`` (and docs/slurm.md).

One sweep, submitted as the README's line (no ``--cpus-per-task``: the job is sized from the run; 6
trials, 2 at a time: a Train worker of 1.5 CPUs fits once on a node, beside its data pipeline's
0.25-CPU tasks), is stopped twice mid-way: by a preemption's grace-time SIGTERM (to the job's tasks
alone, as Slurm sends it first; the job requeues itself), then by the walltime warning (as Slurm's
``--signal=B:USR1`` sends it) after Slurm was told to refuse its requeue, so the job submits a
successor that continues it. Beside it, a job whose node offers less
than a trial needs (and whose login shell has ``SBATCH_EXPORT=NONE``). Read from their outcomes:

- the sweep ran across the allocation: each start's command began once both nodes had joined (the
  second node starts Ray 30 s after the first), the trials trained on both nodes, MLflow answered
  on a public address, and nothing of the job is left running on a node;
- it finishes in the successor with every trial's record intact in the job's MLflow (its shared
  copy): no finished trial redone, none left RUNNING, the same sweep folder resumed, its
  checkpoints in the shared output folder, each start's Ray logs kept;
- the preemption's SIGTERM, which takes Ray down on every node, stops the sweep as an interruption:
  its running trials' runs end KILLED (none FAILED) and Tune's state is saved;
- ``status`` says the job's state, restarts, MLflow's address and both tunnel lines;
- the job that cannot hold a trial ends within 2 minutes with one line, not requeued.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_user_error, sets, wait_for

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
    # 3 CPUs a node: the sweep asks for the 2 a trial needs, the one left runs the small job beside it.
    cluster = slurm_module.Slurm(base / "slurm", cpus=3, subnet="198.18.7", memory_mb=16000,
                                 slow_ray={"n2": SLOW_RAY_S})
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


def sweep_command(shared, samples: int, steps: int) -> list[str]:
    folder, model, corpus = shared
    return ["python", "-m", "platform.tune", "una", "--num-samples", str(samples),
            *sets(model=model, corpus=corpus, batch_size=8, max_steps=steps, eval_steps=2, log_steps=2, num_workers=1,
                  cpus_per_worker=1.5, augment_cpus=0.25, use_gpu="false")]


def submit(slurm, shared, name: str, samples: int, steps: int, *extra: str) -> tuple[str, Path]:
    """The README's line (``--nodes``, and no ``--cpus-per-task``), from a login shell."""
    out = shared[0] / name
    proc = subprocess.run(
        [sys.executable, "-m", "platform.cluster", "slurm", "--nodes", "2", "--name", name, "--output", str(out), *extra,
         "--", *sweep_command(shared, samples, steps)],
        cwd=ROOT, env=login_env(slurm, shared[0]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = re.search(r"^submitted job (\d+)", proc.stdout, re.M).group(1)
    assert f"log: {out}/slurm-{job}.out" in proc.stdout
    return job, out


def job_state(slurm, job: str) -> dict[str, str]:
    text = slurm.run("scontrol", "show", "job", job).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def runs(folder: Path) -> list[dict]:
    """The runs in the job's MLflow copy (in its folder on the shared filesystem), with their tags."""
    with sqlite3.connect(f"file:{folder / 'mlflow.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT run_uuid, status, end_time FROM runs").fetchall()
        tags = db.execute("SELECT run_uuid, key, value FROM tags").fetchall()
    by_run = {r: {"id": r, "status": s, "end_time": e, "tags": {}} for r, s, e in rows}
    for r, k, v in tags:
        by_run[r]["tags"][k] = v
    return list(by_run.values())


def trials(folder: Path) -> list[dict]:
    try:
        return [r for r in runs(folder) if "trial_id" in r["tags"]]
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
def small(slurm, shared):
    """A one-node job given 1 CPU where a trial needs 1.75 (sbatch's own --cpus-per-task over the
    rendered one, as a site's submit plugin or defaults may give less), submitted from a login shell
    with SBATCH_EXPORT=NONE: the job ends non-zero with one line, not requeued."""
    out = shared[0] / "small"
    env = {**login_env(slurm, shared[0]), "SBATCH_EXPORT": "NONE"}
    proc = subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", "--name", "small", "--output", str(out),
                           "--print", "--", *sweep_command(shared, 1, 4)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "#SBATCH --cpus-per-task=2\n" in proc.stdout, proc.stdout  # sized from the run: 1.5 + 0.25 CPUs
    out.mkdir(parents=True)
    submitted = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", str(ROOT / ".cluster" / "slurm-small.sbatch")],
                               env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0], out


@pytest.fixture(scope="module")
def requeued(slurm, shared, small):
    """One sweep (6 trials, 2 at a time, one Train worker per node) stopped twice mid-way: by a
    preemption's grace-time SIGTERM to its tasks after a trial finished, then by the walltime
    warning after another, with Slurm refusing the job's requeue (``Requeue=0``, as ``JobRequeue=0``
    or a site's plugin does): the job submits a successor that continues the same sweep."""
    job, out = submit(slurm, shared, "sweep", SAMPLES, 24)
    script = (ROOT / ".cluster" / "slurm-sweep.sbatch").read_text()
    folder = out / f"job-{job}"

    def finished() -> dict[str, int]:
        return {r["tags"]["trial_id"]: r["end_time"] for r in trials(folder) if r["status"] == "FINISHED"}

    first = waited(slurm, out, job, "a trial to finish", finished, 900)
    # The small job ended long before (Slurm forgets an ended job after MinJobAge, 300 s): read it now.
    small_job, small_out = small
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    waited(slurm, small_out, small_job, "the small job to end",
           lambda: job_state(slurm, small_job).get("JobState") in ended, 600)
    small_state = job_state(slurm, small_job)
    # A preemption with a grace time: Slurm signals the job's tasks first, not its batch shell
    # (scancel --signal without --batch does the same); Ray goes down with them on every node.
    signalled = time.time()
    assert slurm.run("scancel", "--signal=TERM", job).returncode == 0
    waited(slurm, out, job, "the job to requeue itself",
           lambda: re.search(rf"^slurm: job {job} requeued", log(out, job), re.M), 300)
    preempted = {r["tags"]["trial_id"]: r["status"] for r in trials(folder)}  # the copy made before the requeue
    tune_saved = max((p.stat().st_mtime for p in (out / "runs").glob("una-sweep-*/tune/experiment_state*.json")),
                     default=0.0)
    waited(slurm, out, job, "the second start to resume the sweep",
           lambda: re.search(r"^slurm: running .* --resume \S+$", log(out, job), re.M), 600)
    second = waited(slurm, out, job, "another trial to finish", lambda: len(finished()) > len(first) and finished(), 900)
    # Two at a time, and MLflow's shared copy up to 30 s behind: a pair may finish within one copy.
    assert len(second) < SAMPLES - 1  # two trials still to come
    assert slurm.run("scontrol", "update", f"JobId={job}", "Requeue=0").returncode == 0
    assert slurm.run("scancel", "--signal=USR1", "--batch", job).returncode == 0  # as --signal=B:USR1@S sends it
    successor = waited(slurm, out, job, "the job to submit its successor", lambda: re.search(
        r"^slurm: Slurm refused the requeue .* job (\d+) submitted", log(out, job), re.M), 600).group(1)
    waited(slurm, out, job, "the job to end", lambda: job_state(slurm, job).get("JobState") in ended, 600)
    state = job_state(slurm, job)
    waited(slurm, out, successor, "the successor to end", lambda: job_state(slurm, successor).get("JobState") in ended,
           1200)
    status = subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", "status", successor], cwd=ROOT,
                            env=login_env(slurm, shared[0]), capture_output=True, text=True, timeout=120)
    last = max(folder.glob("attempt-*"), key=lambda p: int(p.name.split("-")[-1]))  # the successor's start
    node_logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(last.glob("*.log")))
    return {"job": job, "successor": successor, "out": out, "folder": folder, "first": first, "second": second,
            "node_logs": node_logs,
            "state": state, "successor_state": job_state(slurm, successor), "log": log(out, job),
            "successor_log": log(out, successor), "script": script, "status": status, "small_state": small_state,
            "small_log": log(small_out, small_job), "preempted": preempted, "signalled": signalled,
            "tune_saved": tune_saved}


def test_the_readme_line_is_sized_from_the_run_and_the_sweep_runs_across_the_allocation(slurm, shared, requeued):
    text = requeued["log"] + requeued["successor_log"]
    assert requeued["successor_state"]["JobState"] == "COMPLETED", (  # text, not a tuple pytest would cut short
        f"{requeued['successor_state']}\n{requeued['node_logs']}\n{text[-6000:]}\n{slurm.log()[-3000:]}")
    # No --cpus-per-task on the line: the script asks for what a trial needs on a node, under Slurm's default of 1.
    assert "#SBATCH --cpus-per-task=2\n" in requeued["script"] and "#SBATCH --mem=14336M\n" in requeued["script"]
    # Each start's command began once both nodes had joined: its Ray line counts their CPUs.
    assert text.count("slurm: all 2 node(s) joined Ray") == 3, text[-6000:]
    assert len(re.findall(r"^Ray: the cluster at \S+ \(RAY_ADDRESS\), 4 CPUs", text, re.M)) == 3, text[-6000:]
    # MLflow served the sweep on the first node's public address (no 403 for its Host header).
    assert re.search(r"^slurm: MLflow at http://198\.18\.7\.\d+:\d+ ", text, re.M), text[-6000:]
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


def test_a_sweep_stopped_twice_finishes_in_its_successor_with_every_trial_record_intact(requeued):
    """The successor finishes the sweep the job began (the same folder); the trials finished before a
    stop keep their runs (same ids, same end), none is left RUNNING, none is trained twice; every
    start's Ray logs are in the job's folder."""
    state, folder = requeued["successor_state"], requeued["folder"]
    text = requeued["log"] + requeued["successor_log"]
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, text[-8000:])
    # A normal end stops each node's Ray and its task exits 0: srun kills no task, none exits non-zero.
    assert not re.search(r"^srun: error: \S+: task \d+: (Killed|Exited)", requeued["successor_log"], re.M), \
        requeued["successor_log"][-4000:]
    assert requeued["state"]["Restarts"] == "1", requeued["state"]  # the refused requeue left it at one
    resumed = re.findall(r"^slurm: running .* --resume (\S+)$", text, re.M)
    (sweep,) = (requeued["out"] / "runs").glob("una-sweep-*")
    assert resumed == [str(sweep)] * 2, text[-8000:]
    found = trials(folder)
    assert len(found) == SAMPLES and all(r["status"] == "FINISHED" for r in found), found
    assert not [r for r in runs(folder) if r["status"] == "RUNNING"]
    ends = {r["tags"]["trial_id"]: r["end_time"] for r in found}
    assert all(ends[t] == end for t, end in {**requeued["first"], **requeued["second"]}.items()), (requeued, ends)
    (parent,) = [r for r in runs(folder) if r["tags"].get("sweep") == "true"]
    assert parent["status"] == "FINISHED"
    assert sorted(p.name for p in folder.glob("attempt-*")) == ["attempt-0", "attempt-1", "attempt-2"]
    killed = folder / "attempt-0" / "ray-logs"  # the start the preemption ended
    assert {p.relative_to(killed).as_posix() for p in killed.rglob("*.out")} >= \
        {"n1/raylet.out", "n1/gcs_server.out", "n2/raylet.out"}, sorted(killed.rglob("*"))


def test_a_preemptions_sigterm_to_the_tasks_ends_the_running_trials_killed_with_tunes_state_saved(requeued):
    """Slurm's SIGTERM to the tasks alone takes Ray down on every node; a node's task relays it and
    the batch stops the command as Ctrl-C does, or, where Ray terminated the driver with its node's
    raylet first, ends the runs the command left open itself: each trial run left open ends KILLED
    (to be resumed), none FAILED or RUNNING, and Tune's state is there to resume from."""
    preempted, text = requeued["preempted"], requeued["log"]
    found = re.search(r"^slurm: the job's tasks got SIGTERM \(n[12]'s first", text, re.M)
    assert found, text[-6000:]
    stop = text[found.start():].split("slurm: running", 1)[0]  # the stop, up to the next start
    if "KILLED" not in preempted.values() or {"FAILED", "RUNNING"} & set(preempted.values()):
        pytest.fail(f"the trials' runs in MLflow's copy made before the requeue: {preempted}\n--- the stop's log\n"
                    f"{stop[-12000:]}", pytrace=False)  # whole: an assertion's message would be cut
    # Tune's state as last saved: after the signal where the command stopped itself, else before it
    # (the driver went with the head's raylet; the job ended its runs).
    assert requeued["tune_saved"] > 0


def test_status_says_the_state_restarts_and_how_to_reach_mlflow_and_the_dashboard(requeued):
    proc = requeued["status"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines[f"job {requeued['successor']}"].startswith("COMPLETED, restarts 0"), proc.stdout
    assert lines["start"].startswith("3 ") and "ended with exit code 0" in lines["start"], proc.stdout
    mlflow = re.fullmatch(r"(http://198\.18\.7\.\d+):(\d+) \(user platform, password in \S+\)", lines["mlflow"])
    assert mlflow, proc.stdout
    host = mlflow.group(1).removeprefix("http://")
    assert lines["mlflow tunnel"] == f"ssh -N -L 5000:{host}:{mlflow.group(2)} LOGIN-NODE, then http://127.0.0.1:5000"
    assert re.fullmatch(r"ssh -N -L 8265:127\.0\.0\.1:\d+ -J LOGIN-NODE n1, then http://127\.0\.0\.1:8265 "
                        r"\(Ray's token in \S+/ray_token\)", lines["dashboard tunnel"]), proc.stdout
    nodes = [line for line in proc.stdout.splitlines() if line.startswith("ray node: ")]
    assert len(nodes) == 2 and all(re.fullmatch(r"ray node: 198\.18\.7\.\d+ alive, 2 CPUs, 0 GPUs", n) for n in nodes), \
        proc.stdout


def test_a_job_whose_nodes_cannot_hold_a_trial_ends_at_once_with_one_line(requeued):
    state, text = requeued["small_state"], requeued["small_log"]
    assert state["JobState"] == "FAILED" and state["ExitCode"] == "3:0" and state["Restarts"] == "0", (state, text)
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "cannot hold one trial" in errors[0] and "1.75 CPUs on one node" in errors[0] \
        and "the largest node offers 1 CPUs" in errors[0], text[-3000:]
    started = time.mktime(time.strptime(state["StartTime"], "%Y-%m-%dT%H:%M:%S"))
    assert time.mktime(time.strptime(state["EndTime"], "%Y-%m-%dT%H:%M:%S")) - started < 120, state


# Stands in for Apptainer, which this machine cannot install: it takes `apptainer exec` as the job
# renders it, refuses a missing image or a path the process uses outside what is mounted, records
# the call and runs the process here.
APPTAINER = r"""#!/bin/bash
set -eu
echo "$*" >> "$(dirname "$0")/../apptainer-calls.txt"
[ "$1" = exec ] || { echo "apptainer: $1: only exec" >&2; exit 64; }
shift
binds= workdir=
while [ "${1#--}" != "$1" ]; do
  case "$1" in --nv) shift ;; --bind) binds=$2; shift 2 ;; --pwd) workdir=$2; shift 2 ;; *) exit 64 ;; esac
done
[ -f "$1" ] || { echo "apptainer: no image $1" >&2; exit 65; }
shift
for path in "$workdir" $(printf '%s\n' "$@" | grep -oE '(^|=)/[^ ,]+' | sed 's/^=//'); do
  found=
  for b in ${binds//,/ }; do case "$path/" in "$b"/*) found=1 ;; esac; done
  [ -n "$found" ] || { echo "apptainer: $path is not mounted ($binds)" >&2; exit 66; }
done
cd "$workdir"
exec "$@"
"""


def test_two_jobs_of_the_default_name_each_keep_their_own_runs(slurm, shared, requeued):
    """Two `train` jobs submitted at once with the default name (one output folder): each ends
    COMPLETED with its run FINISHED in its own MLflow copy, and neither copy holds the other's run.
    The first gets the walltime warning (SIGUSR1 to its batch, as ``--signal=B:USR1`` sends it)
    just after its command exited 0, during its teardown: it still ends COMPLETED, not requeued.
    The second runs its Ray node and its command in an Apptainer image (``--apptainer``; a stand-in
    for apptainer that checks what is mounted); pyxis's ``--container-image`` is refused in one line
    where srun does not take it."""
    folder, model, corpus = shared
    out = folder / "default-name"
    command = ["python", "-m", "platform.train", "simcse",
               *sets(model=model, corpus=corpus, batch_size=8, max_steps=4, eval_steps=2, log_steps=2, num_workers=1,
                     cpus_per_worker=1, augment_cpus=0.25, use_gpu="false")]
    (folder / "bin").mkdir()
    (folder / "bin" / "apptainer").write_text(APPTAINER)
    (folder / "bin" / "apptainer").chmod(0o755)
    (folder / "platform.sif").write_bytes(b"")
    boxed = login_env(slurm, folder)
    boxed["PATH"] = f"{folder / 'bin'}:{boxed['PATH']}"
    pyxis = subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", "--output", str(out), "--container-image",
                            "nvcr.io#nvidia/pytorch:24.01-py3", "--", *command], cwd=ROOT, env=boxed, capture_output=True,
                           text=True, timeout=120)
    assert_user_error(pyxis, "--container-image needs pyxis")
    jobs = []
    for extra, env in (([], login_env(slurm, folder)), (["--apptainer", str(folder / "platform.sif")], boxed)):
        proc = subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", "--output", str(out), *extra, "--",
                               *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        jobs.append(re.search(r"^submitted job (\d+)", proc.stdout, re.M).group(1))
    (ROOT / ".cluster" / "slurm-platform.sbatch").unlink(missing_ok=True)
    waited(slurm, out, jobs[0], "the first job's command to end",
           lambda: re.search(r"^slurm: the command ended \(0\)", log(out, jobs[0]), re.M), 900)
    assert slurm.run("scancel", "--signal=USR1", "--batch", jobs[0]).returncode == 0
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    states = {job: waited(slurm, out, job, f"job {job} to end", lambda job=job: (
        job_state(slurm, job) if job_state(slurm, job).get("JobState") in ended else None), 900) for job in jobs}
    late = log(out, jobs[0]).split("slurm: the command ended (0)", 1)[1]
    assert "slurm: the walltime is near; the command had already exited 0 and the job ends as it is" in late, late
    assert "requeued" not in late and states[jobs[0]]["Restarts"] == "0", (states[jobs[0]], late)
    for job in jobs:
        assert states[job]["JobState"] == "COMPLETED", (states[job], log(out, job)[-6000:])
        (run,) = [r for r in runs(out / f"job-{job}") if r["tags"].get("mlflow.runName") == f"platform-{job}"]
        assert run["status"] == "FINISHED", run
        others = [r for r in runs(out / f"job-{job}") if r["tags"].get("mlflow.runName", "").startswith("platform-")]
        assert others == [run], others
    calls = (folder / "apptainer-calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "-m platform.slurm_job node" in calls[0] and "-m platform.train simcse" in calls[1] \
        and all(c.startswith("exec --bind ") and " --nv " not in c for c in calls), calls
    assert f"in apptainer image {folder / 'platform.sif'}" in log(out, jobs[1])
