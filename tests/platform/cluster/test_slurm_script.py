"""``python -m platform.cluster slurm``'s script and its refusals, without a Slurm: what ``--print``
renders (``bash -n`` accepts it; the settings a user named are in it), each bad input one line, and
what a requeued start adds to the command. The job itself runs in tests/platform/cluster/test_cluster_slurm.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_user_error

SWEEP = ["--", "python", "-m", "platform.tune", "una", "--num-samples", "4"]


def slurm(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def directives(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M))


def test_print_renders_a_script_bash_accepts_with_the_settings_named(tmp_path, data_root, monkeypatch):
    monkeypatch.delenv("PLATFORM_DATA_DIR")  # cluster.env's, relative to the repository, is the one
    env_file = tmp_path / "cluster.env"
    env_file.write_text("CLUSTER_NAME=lab-sweeps\nSBATCH_ACCOUNT=nlp-lab\nSBATCH_PARTITION=gpu\n"
                        f"PLATFORM_DATA_DIR={os.path.relpath(data_root.resolve(), ROOT)}\n")
    proc = slurm("--nodes", "3", "--gpus-per-node", "0", "--cpus-per-task", "16", "--mem", "64G", "--time", "1-12:00:00",
                 "--qos", "long", "--partition", "a100", "--signal-seconds", "600", "--output", str(tmp_path / "out"),
                 "--env-file", str(env_file), "--print", *SWEEP)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    d = directives(script)
    assert d == {"job-name": "lab-sweeps", "nodes": "3", "ntasks-per-node": "1", "cpus-per-task": "16", "mem": "64G",
                 "time": "1-12:00:00", "partition": "a100", "account": "nlp-lab", "qos": "long",
                 "output": f"{tmp_path / 'out'}/slurm-%j.out", "open-mode": "append", "requeue": "",
                 "signal": "B:USR1@600"}, d
    assert f". {Path(sys.prefix) / 'bin' / 'activate'}" in script  # the venv the render ran in
    assert f"export PLATFORM_DATA_DIR={data_root.resolve()}" in script  # absolute: the job starts elsewhere
    assert script.rstrip().endswith("--name lab-sweeps --max-requeues=3 --signal-seconds=600 "
                                    f"--script={ROOT / '.cluster' / 'slurm-lab-sweeps.sbatch'} -- "
                                    "python -m platform.tune una --num-samples 4")
    assert f"exec {Path(sys.prefix) / 'bin' / 'python'} -m platform.slurm_job" in script  # no bare python on PATH
    assert "export HF_HUB_OFFLINE=1" in script  # the backbone was found on the login node (a local path here)
    assert (ROOT / ".cluster" / "slurm-lab-sweeps.sbatch").read_text() == script
    (ROOT / ".cluster" / "slurm-lab-sweeps.sbatch").unlink()


def test_gpus_are_asked_per_node_and_the_defaults_are_slurms(tmp_path):
    proc = slurm("--name", "gpus", "--gpus-per-node", "2", "--output", str(tmp_path), "--print", *SWEEP,
                 env={"SBATCH_PARTITION": ""})
    (ROOT / ".cluster" / "slurm-gpus.sbatch").unlink(missing_ok=True)
    if "CPU build" in proc.stderr:  # this venv holds torch's CPU build: the GPU job is refused, in one line
        assert_user_error(proc, "--gpus-per-node 2", "requirements/cuda.txt")
        return
    d = directives(proc.stdout)
    assert d["gpus-per-node"] == "2" and "time" not in d and "partition" not in d and "mem" not in d


@pytest.mark.parametrize("args, needles", [
    (["--nodes", "0", *SWEEP], ["--nodes must be at least 1"]),
    (["--time", "90 minutes", *SWEEP], ["--time '90 minutes'", "Slurm's formats"]),
    (["--time", "4", *SWEEP], ["--time 4 leaves no time before the walltime warning"]),
    (["--mem", "lots", *SWEEP], ["--mem 'lots'"]),
    (["--name", "Lab_Sweeps", *SWEEP], ["'Lab_Sweeps'"]),
    (["--", "bash", "-c", "rm -rf ~"], ["COMMAND must be a platform command", "bash -c"]),
    (["--", "python", "-m", "platform.cluster", "up"], ["COMMAND must be a platform command"]),
    (["--nodes", "2"], ["COMMAND must be a platform command", "got nothing"]),
    (["--apptainer", "no-such.sif", *SWEEP], ["apptainer image no-such.sif is not a file here"]),
    (["--apptainer", "a.sif", "--container-image", "nvcr.io#nvidia/pytorch:24.01-py3", *SWEEP], ["two launchers"]),
])
def test_bad_input_is_one_line(args, needles, tmp_path):
    assert_user_error(slurm("--output", str(tmp_path), "--print", *args), *needles)


def test_without_sbatch_on_path_it_says_so(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = slurm("--name", "nosbatch", "--output", str(tmp_path), *SWEEP, env={"PATH": str(bare)})
    (ROOT / ".cluster" / "slurm-nosbatch.sbatch").unlink(missing_ok=True)
    assert_user_error(proc, "sbatch is not on PATH", "login node")


def test_a_local_tracking_store_is_refused_for_a_job(tmp_path):
    proc = slurm("--output", str(tmp_path), "--print", *SWEEP, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
    assert_user_error(proc, "MLFLOW_TRACKING_URI", "not a tracking server")


@pytest.mark.parametrize("limit, expected", [("30", 1800), ("30:15", 1815), ("2:00:00", 7200), ("1-0", 86400),
                                             ("1-2:30", 95400), ("0-0:10:05", 605)])
def test_slurm_time_formats(limit, expected):
    from platform.cluster_slurm import seconds

    assert seconds(limit) == expected


def test_a_requeued_sweep_resumes_exactly_the_sweep_its_job_began(tmp_path, monkeypatch):
    """``--resume FOLDER`` for the sweep the job recorded when it began it, even where another job's
    sweep of the same method is newer in the same output_dir; a fresh start when it had begun none."""
    from platform.slurm_job import named_run, resume_arguments

    command = ["python", "-m", "platform.tune", "una", "--set", f"output_dir={tmp_path}"]
    record = tmp_path / "job-7" / "sweep"
    assert resume_arguments(command, record) == []
    ours = tmp_path / "una-sweep-20250101-000000"
    record.parent.mkdir()
    record.write_text(str(ours))
    (tmp_path / f"una-sweep-{time.strftime('%Y%m%d-%H%M%S')}").mkdir()  # another job's, newer
    assert resume_arguments(command, record) == ["--resume", str(ours)]
    assert resume_arguments([*command, "--resume"], record) == []  # the user's own --resume stands
    train = named_run(["python", "-m", "platform.train", "simcse", "--set", f"output_dir={tmp_path}"], "lab", "7")
    assert train[-2:] == ["--run-name", "lab-7"]
    assert resume_arguments(train, record) == []
    (tmp_path / "lab-7").mkdir()
    assert resume_arguments(train, record) == ["--resume", "lab-7"]


def test_an_old_driver_is_named_with_the_build_it_would_need():
    from platform.cluster_slurm import driver_refusal

    line = driver_refusal("535.183.01", "13.0", "2.13.0+cu130")
    assert "NVIDIA driver 535.183.01" in line and "CUDA 13.0" in line and "580 or newer" in line
    assert "a lock for CUDA 12" in line and "\n" not in line
    assert "a newer driver" in driver_refusal("418.1", "13.0", "2.13.0")


def test_sigterm_is_taken_once():
    """A scheduler signals every process of a job and its script passes SIGTERM on: the second one
    must not reach Tune as a second Ctrl-C (which aborts without saving)."""
    code = ("import os, signal, time\n"
            "from platform.errors import cli_main\n"
            "calls = []\n"
            "@cli_main\n"
            "def main(argv=None):\n"
            "    signal.signal(signal.SIGINT, lambda s, f: calls.append(s))\n"
            "    os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
            "    print(len(calls))\n"
            "    return 0\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", (proc.stdout, proc.stderr, signal.SIGTERM)


def test_a_restored_sweep_reaches_mlflow_where_its_new_driver_does(monkeypatch, tiny_model):
    """Tune restores a resumed sweep's callbacks from its saved state; a requeued Slurm job's MLflow
    server has another address, which the restored trials' runs must be written to."""
    import cloudpickle

    from platform.config import TrainConfig
    from platform.sweep_runs import Sweep, TrialRuns

    before = TrialRuns(Sweep(TrainConfig(method="una", model=str(tiny_model)), [], "http://10.0.0.1:41000", "p", "/f"))
    saved = cloudpickle.dumps(before.callback())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.2:42000")
    restored = cloudpickle.loads(saved)
    runs = restored.on_trial_start.__closure__[0].cell_contents
    assert runs.sweep.uri == "http://10.0.0.2:42000" and runs.sweep.parent == "p"


@pytest.mark.e2e
def test_the_command_waits_until_every_node_of_the_allocation_has_joined(monkeypatch):
    """The job starts its command only once all its nodes are in Ray (the command sizes its work by
    the CPUs and GPUs it sees): on a real Ray of one node, the wait for two holds until a second node
    joins, and ends at its deadline, refused, when none does."""
    import threading

    from ray.cluster_utils import Cluster

    from platform import slurm_job

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    step = subprocess.Popen(["sleep", "600"])  # the job's srun step, alive
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    try:
        found = {}
        waiting = threading.Thread(target=lambda: found.update(
            ok=slurm_job.joined(cluster.address, 2, env, step, slurm_job.Stop())))
        waiting.start()
        waiting.join(timeout=8)
        assert waiting.is_alive()  # one node of two: still waiting
        cluster.add_node(num_cpus=1)
        waiting.join(timeout=120)
        table = found["ok"]
        assert len(table) == 2 and all(n["Alive"] and n["Resources"]["CPU"] == 1 for n in table), table
        monkeypatch.setattr(slurm_job, "JOIN_TIMEOUT_S", 5)
        started = time.monotonic()
        assert slurm_job.joined(cluster.address, 3, env, step, slurm_job.Stop()) is None
        assert time.monotonic() - started < 60
    finally:
        step.kill()
        cluster.shutdown()


def test_resume_names_a_sweep_folder_or_refuses_one_without_a_sweep(tmp_path, tiny_model):
    """``tune --resume FOLDER`` (what a Slurm job's later start runs) reads that folder's sweep, and
    refuses in one line a folder that holds none; no other sweep of the method is looked at."""
    from platform.config import TrainConfig
    from platform.errors import UserError
    from platform.sweep_runs import resumable_sweep

    base = TrainConfig(method="una", model=str(tiny_model), output_dir=str(tmp_path))
    (tmp_path / f"una-sweep-{time.strftime('%Y%m%d-%H%M%S')}").mkdir()
    with pytest.raises(UserError, match=r"--resume .*/empty: no sweep there"):
        resumable_sweep("sqlite:///unused.db", base, {}, folder=str(tmp_path / "empty"))


def test_a_container_holds_every_ray_node_and_the_command_with_the_jobs_folders_mounted(tmp_path, monkeypatch):
    """pyxis: srun's options on the nodes' step, and the command an srun step of its own on this
    node; Apptainer: ``apptainer exec`` around both, ``--nv`` where the job has GPUs. Either way the
    repository, the venv, the output, the data, the caches and the temp folder are mounted at their own paths."""
    from platform.cluster_slurm import SlurmJob, render
    from platform.slurm_job import Container

    image = tmp_path / "platform.sif"
    image.write_bytes(b"")
    monkeypatch.chdir(ROOT)
    job = SlurmJob("boxed", SWEEP[1:], tmp_path / "out", Path(sys.prefix), gpus_per_node="a100:2",
                   container=("apptainer", str(image)))
    assert f"--apptainer={image} --gpus --" in render(job)
    env = {"PLATFORM_DATA_DIR": "/shared/lab/data", "HF_HOME": "/shared/lab/out/hf"}  # the cache within the output
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    models = Path(tempfile.mkdtemp(dir="/var/tmp"))  # a folder the command names, outside every other mount
    (models / "bert").mkdir()
    try:
        boxed = Container.of(("apptainer", str(image)), True, env, Path("/shared/lab/out"),
                             ["python", "-m", "platform.train", "simcse", "--set", f"model={models / 'bert'}",
                              "--set", "corpus=/nowhere/corpus.txt"])  # not there: nothing to mount
    finally:
        shutil.rmtree(models)
    mounted = (str(ROOT), "/shared/lab/data", "/shared/lab/out", tempfile.gettempdir(), str(models / "bert"))
    assert set(boxed.binds) == {*mounted, *[sys.prefix] * (not sys.prefix.startswith(str(ROOT) + "/"))}, boxed.binds
    assert boxed.wrap(["python", "-m", "platform.tune"]) == [
        "apptainer", "exec", "--nv", "--bind", ",".join(boxed.binds), "--pwd", str(ROOT), str(image), "python", "-m",
        "platform.tune"]
    assert boxed.step(["python", "-m", "platform.slurm_job", "node"]) == boxed.wrap(["python", "-m", "platform.slurm_job",
                                                                                      "node"])
    pyxis = Container.of(("pyxis", "nvcr.io#nvidia/pytorch:24.01-py3"), True, env, Path("/shared/lab/out"), [])
    options = ["--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
               "--container-mounts=" + ",".join(f"{b}:{b}" for b in pyxis.binds), f"--container-workdir={ROOT}"]
    assert pyxis.step(["ray"]) == [*options, "ray"]
    assert pyxis.wrap(["python"]) == ["srun", "--export=ALL", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n1",
                                      *options, "python"]


def test_a_successor_that_has_not_started_mlflow_does_not_show_the_last_starts_address(tmp_path):
    """``slurm status`` and ``slurm tunnel`` of a job whose second start has not reached its MLflow
    yet say so, instead of the first start's address and token; once it has, they show its own."""
    from platform.slurm_job import MlflowServer, say_where

    folder = tmp_path / "job-7"
    for n in (0, 1):
        (folder / f"attempt-{n}").mkdir(parents=True)
        (folder / f"attempt-{n}" / "slurm-job-id").write_text(f"{7 + n}\n")
    server = MlflowServer(tmp_path, folder, tmp_path / "local", "lo")
    say_where("http://198.18.7.1:20001", server, folder, {"node": "n1"}, folder / "attempt-0" / "ray_token")
    for verb in ("status", "tunnel"):
        proc = slurm(verb, "8", "--output", str(tmp_path))
        assert proc.returncode == 0 and "mlflow: not started yet in this start" in proc.stdout, proc.stdout + proc.stderr
        assert "198.18.7.1" not in proc.stdout and "attempt-0" not in proc.stdout, proc.stdout
    say_where("http://198.18.7.2:20001", server, folder, {"node": "n2"}, folder / "attempt-1" / "ray_token")
    proc = slurm("tunnel", "8", "--output", str(tmp_path))
    assert "mlflow: http://198.18.7.2:20001" in proc.stdout and "attempt-1/ray_token" in proc.stdout, proc.stdout
