"""What a Slurm job asks for and decides, without a Slurm: the README's line sized from its run
(``--cpus-per-task``, ``--mem``), a trial that cannot fit refused in one line at the submit and
inside the job, the login-node preflight, the site options' script, the requeue decision, the
starts of one job (a successor included), MLflow's allowed hosts, and the shared copy of MLflow's
store on a filesystem that refuses SQLite's locks. The job itself runs on a real Slurm in
tests/platform/cluster/test_cluster_slurm.py."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_user_error

SWEEP = ["--", "python", "-m", "platform.tune", "una", "--num-samples", "4"]
PAPER_REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"  # the paper profile's bert-base-uncased


def slurm(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "platform.cluster", "slurm", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def directives(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M))


@pytest.fixture
def cuda_venv(tmp_path) -> Path:
    """A venv folder as the CUDA lock leaves it (its torch's metadata says +cu130), for the render."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    meta = venv / "lib" / "python3.11" / "site-packages" / "torch-2.13.0+cu130.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cu130\n")
    return venv


@pytest.fixture
def hf_home(tmp_path, tiny_model) -> Path:
    """A Hugging Face cache holding the paper profile's backbone at its pinned commit (the tiny BERT's
    files in its place: what the check reads is that the snapshot is there)."""
    home = tmp_path / "hf"
    snapshot = home / "hub" / "models--bert-base-uncased" / "snapshots" / PAPER_REVISION
    snapshot.mkdir(parents=True)
    for path in tiny_model.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    return home


def readme_line() -> list[str]:
    """The README's Slurm line, as a user copies it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"`(python -m platform\.cluster slurm [^`]+)`", text.replace("\n", " "))
    return found.group(1).split()


def test_the_readme_line_is_sized_from_the_run(cuda_venv, hf_home, tmp_path, monkeypatch):
    """The README's line names no --cpus-per-task or --mem: the script asks for what one node holds
    (a paper trial's 4 CPUs and its data pipeline's 1, one GPU), not Slurm's default of one CPU; the
    backbone cached on the login node, the job runs offline."""
    from platform.cluster_slurm import check, parse, render

    line = readme_line()
    assert line[:4] == ["python", "-m", "platform.cluster", "slurm"] and "--cpus-per-task" not in line
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    job = parse([*line[4:line.index("--")], "--output", str(tmp_path / "out"), *line[line.index("--"):]], {})
    job.venv = cuda_venv
    script = render(check(job))
    d = directives(script)
    assert (d["nodes"], d["gpus-per-node"], d["cpus-per-task"], d["mem"]) == ("4", "1", "5", f"{22 * 1024}M"), d
    assert "1 Train worker(s) x 4 CPUs + 1 trial(s) x 1 data-pipeline CPUs per node (4 trial(s) at once over 4 " \
           "node(s))" in script
    assert "export HF_HUB_OFFLINE=1" in script and f"export HF_HOME={hf_home}" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_what_does_not_fit_is_refused_in_one_line_before_anything_is_submitted(tmp_path):
    from platform.errors import ConfigError
    from platform.slurm_sizing import Needs, Offer, size

    paper = Needs(workers=1, cpus_per_worker=4.0, gpu=True, augment_cpus=1.0, trials=4)
    with pytest.raises(ConfigError, match=r"5 CPUs on one node at least\); partition gpu's largest node has 4 CPUs"):
        size(paper, nodes=4, gpus=1, cpus_named=None, offer=Offer("gpu", cpus=4, mem_mb=0, gpus=4))
    with pytest.raises(ConfigError, match=r"--gpus-per-node 2, but partition gpu's largest node has 1 GPUs"):
        size(paper, nodes=1, gpus=2, cpus_named=None, offer=Offer("gpu", cpus=64, mem_mb=0, gpus=1))
    # Four trials on one node of 16 CPUs: capped there (fewer run at once), memory to what the node has.
    cpus, mem, why = size(paper, nodes=1, gpus=4, cpus_named=None, offer=Offer("gpu", cpus=16, mem_mb=65536, gpus=4))
    assert (cpus, mem) == (16, 65536) and "capped at partition gpu's largest node's 16 CPUs" in why
    assert size(paper, nodes=2, gpus=2, cpus_named=None, offer=None)[:2] == (10, (4 + 4 + 24 + 4) * 1024)
    with pytest.raises(ConfigError, match="asks Slurm for none"):
        size(paper, nodes=1, gpus=0, cpus_named=None, offer=None)
    sets = ["--set", "cpus_per_worker=1.5", "--set", "augment_cpus=0.25"]
    assert_user_error(slurm("--output", str(tmp_path), "--print", "--cpus-per-task", "1", *SWEEP, *sets),
                      "1.75 CPUs on one node", "--cpus-per-task 1 gives each node 1")
    assert_user_error(slurm("--output", str(tmp_path), "--print", *SWEEP, "--set", "use_gpu=true"),
                      "use_gpu true", "--gpus-per-node")


def test_inside_the_job_nodes_too_small_for_a_trial_are_named_in_one_line():
    from platform.slurm_sizing import Needs, fits

    trial = Needs(workers=1, cpus_per_worker=1.5, gpu=False, augment_cpus=0.25, trials=2)
    assert fits(trial, [{"CPU": 2.0}, {"CPU": 2.0}]) is None
    line = fits(trial, [{"CPU": 1.0}, {"CPU": 1.0}])
    assert "cannot hold one trial" in line and "1.75 CPUs on one node" in line and "largest node offers 1 CPUs" in line
    gpu = Needs(workers=2, cpus_per_worker=4, gpu=True, augment_cpus=1, trials=1)
    assert fits(gpu, [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}]) is None  # DDP across two nodes
    assert "0 GPUs" in fits(gpu, [{"CPU": 32}])
    assert fits(gpu, [{"CPU": 8, "GPU": 1}]) is not None  # two workers, one GPU


def test_the_login_node_preflight_refuses_what_compute_nodes_would_miss(tmp_path, hf_home):
    assert_user_error(slurm("--output", str(tmp_path), "--print", *SWEEP, env={"PLATFORM_DATA_DIR": str(tmp_path / "no")}),
                      "does not exist", "fetch the data on the login node first")
    empty = tmp_path / "empty-hf"
    pinned = f"model=bert-base-uncased@{PAPER_REVISION}"
    proc = slurm("--output", str(tmp_path), "--print", *SWEEP, "--set", pinned,
                 env={"HF_HOME": str(empty), "HF_HUB_OFFLINE": "1"})
    assert_user_error(proc, f"bert-base-uncased@{PAPER_REVISION} is not in the Hugging Face cache at {empty}/hub",
                      "HF_HUB_OFFLINE is set")
    proc = slurm("--output", str(tmp_path), "--print", *SWEEP, "--set", pinned,
                 env={"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": ""})
    assert proc.returncode == 0, proc.stderr
    assert "export HF_HUB_OFFLINE=1" in proc.stdout and f"export HF_HOME={hf_home}" in proc.stdout


def test_site_options_reach_the_script(cuda_venv, tmp_path):
    """Typed GPUs, --gres, --constraint, --exclusive and any other sbatch option as #SBATCH lines;
    setup lines (module load, conda) run before `set -u` and the venv; the venv's own python."""
    from platform.cluster_slurm import check, parse, render

    job = parse(["--gres", "gpu:a100:2", "--constraint", "a100|h100", "--exclusive", "--sbatch-arg=--reservation=lab",
                 "--setup", "module load cuda/12.4", "--setup", "conda activate base", "--node-interface", "ib0",
                 "--max-requeues", "5", "--output", str(tmp_path / "out"), *SWEEP, "--set", "use_gpu=true",
                 "--set", "cpus_per_worker=4"], {})
    job.venv = cuda_venv
    script = render(check(job))
    d = directives(script)
    assert (d["gres"], d["constraint"], d["exclusive"], d["reservation"]) == ("gpu:a100:2", "a100|h100", "", "lab"), d
    # Two trials on the node's 2 GPUs: 4 CPUs each, and the local profile's 0.2 for each one's data pipeline.
    assert "gpus-per-node" not in d and d["cpus-per-task"] == "9", d
    lines = script.splitlines()
    assert lines.index("module load cuda/12.4") < lines.index("conda activate base") < lines.index("set -u") \
        < lines.index(f". {cuda_venv / 'bin' / 'activate'}")
    assert "--node-interface=ib0" in lines[-1] and "--max-requeues=5" in lines[-1]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    typed = parse(["--gpus-per-node", "h100:4", "--output", str(tmp_path / "out"), *SWEEP], {})
    assert typed.gpus == 4
    assert_user_error(slurm("--gpus-per-node", "four", "--output", str(tmp_path), "--print", *SWEEP),
                      "--gpus-per-node 'four'", "TYPE:N")


@pytest.mark.parametrize("code, signals, starts, progress, requeued", [
    (0, ("walltime",), 0, True, False),  # USR1 just before the command exited 0: finished, not requeued
    (130, ("walltime",), 0, True, True),  # stopped at the walltime with work saved: requeued
    (130, ("walltime",), 3, True, False),  # --max-requeues 3 spent
    (130, ("walltime",), 0, False, False),  # nothing saved this start: a requeue would do the same again
    (130, ("terminated",), 0, True, False),  # Slurm's SIGTERM: Slurm itself requeues (preemption) or ends it
    (130, ("tasks",), 0, True, True),  # the tasks' SIGTERM (a preemption's grace time), relayed: requeued
    (0, ("tasks",), 0, True, False),  # ... but not after the command finished
    (130, ("tasks", "terminated"), 0, True, False),  # ... nor once Slurm's own SIGTERM came (its grace ended)
    (1, (), 0, True, False),  # the command failed: no signal, no requeue
])
def test_the_job_requeues_itself_only_for_unfinished_work_it_can_resume(code, signals, starts, progress, requeued):
    from platform.slurm_job import Stop, requeue_decision

    stop = Stop()
    for name in signals:
        setattr(stop, name, time.monotonic())
    assert bool(requeue_decision(code, stop, starts, 3, progress)) is requeued


def test_the_runs_a_driver_that_died_with_ray_left_open_are_ended_killed_by_the_job(tmp_path, mlflow_uri, capsys):
    """Ray terminated the driver with its node's raylet as Slurm stopped the job: the job's process
    ends the recorded sweep's run and its trials' still open KILLED; a finished trial stays so."""
    import json

    from platform.slurm_job import end_left_open
    from platform.sweep_runs import SWEEP_STATE
    from platform.tracking.recorder import Run

    parent = Run.create(mlflow_uri, "una", "una-sweep-x", {"sweep": "true"})
    running = Run.create(mlflow_uri, "una", "trial-a", {"trial_id": "a"}, parent=parent, in_trial=True)
    done = Run.create(mlflow_uri, "una", "trial-b", {"trial_id": "b"}, parent=parent, in_trial=True)
    done.end("completed", needs_checkpoint=False)
    folder = tmp_path / "una-sweep-x"
    folder.mkdir()
    (folder / SWEEP_STATE).write_text(json.dumps({"parent_run_id": parent.id}))
    record = tmp_path / "sweep"
    record.write_text(str(folder))
    end_left_open({"MLFLOW_TRACKING_URI": mlflow_uri}, record, 1)
    assert [r.info().info.status for r in (parent, running, done)] == ["KILLED", "KILLED", "FINISHED"]
    assert "its runs left open ended KILLED: trial-a, una-sweep-x" in capsys.readouterr().out
    end_left_open({"MLFLOW_TRACKING_URI": mlflow_uri}, tmp_path / "no-record", 1)  # no sweep: nothing to end


def test_a_sigterm_to_the_tasks_alone_stops_the_command_as_soon_as_a_node_relays_it(tmp_path, monkeypatch, capsys):
    """A preemption with a grace time: Slurm signals the job's tasks, not the batch, and Ray goes
    with them. A node's task leaves the relay in the start's folder; the batch passes SIGTERM on to
    the command (its Ctrl-C: state saved, runs KILLED) within a second, and the job counts as one
    to requeue."""
    import threading

    from platform import storage
    from platform.slurm_job import Stop, requeue_decision, run_command

    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))  # KillWait: Slurm's default
    ready, attempt = tmp_path / "ready", tmp_path / "attempt-0"
    attempt.mkdir()
    command = [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(130)); "
               f"open({str(ready)!r}, 'w').close(); time.sleep(60)"]
    relayed = {}

    def node() -> None:
        while not ready.exists():
            time.sleep(0.05)
        relayed["at"] = time.monotonic()
        storage.write_json(attempt / "terminated-1.json", {"node": "n2", "at": time.time()})

    threading.Thread(target=node, daemon=True).start()
    stop = Stop()
    code = run_command(command, dict(os.environ), stop, None, walltime_stop_s=150, attempt=attempt)
    assert code == 130 and stop.tasks and not stop.terminated
    assert time.monotonic() - relayed["at"] < 5
    assert "slurm: the job's tasks got SIGTERM (n2's first" in capsys.readouterr().out
    assert requeue_decision(code, stop, 0, 3, progress=True)


def test_the_starts_of_one_job_share_its_folder_a_successor_included(tmp_path, monkeypatch):
    from platform.slurm_job import Lineage, made_progress

    monkeypatch.delenv("PLATFORM_SLURM_LINEAGE", raising=False)
    first = Lineage(tmp_path, "41")
    first.end(130)
    again = Lineage(tmp_path, "41")  # requeued: the same id
    monkeypatch.setenv("PLATFORM_SLURM_LINEAGE", "41")
    successor = Lineage(tmp_path, "57")  # submitted by the job where Slurm refused the requeue
    assert [x.attempt.name for x in (first, again, successor)] == ["attempt-0", "attempt-1", "attempt-2"]
    assert {x.folder for x in (first, again, successor)} == {tmp_path / "job-41"}
    assert (successor.attempt / "slurm-job-id").read_text() == "57" and successor.starts == 2
    sweep = tmp_path / "runs" / "una-sweep-1"
    (sweep / "tune").mkdir(parents=True)
    successor.sweep_record.write_text(str(sweep))
    command = ["python", "-m", "platform.tune", "una", "--set", f"output_dir={tmp_path / 'runs'}"]
    assert not made_progress(command, time.time() - 5, successor.sweep_record)
    (sweep / "trials" / "t1" / "checkpoint_000001").mkdir(parents=True)
    assert made_progress(command, time.time() - 5, successor.sweep_record)
    assert not made_progress(command, time.time() + 5, successor.sweep_record)  # saved before this start


@pytest.mark.e2e
def test_the_jobs_mlflow_answers_at_a_public_address(tmp_path):
    """MLflow checks each request's Host header: the node's own public address passes with the job's
    --allowed-hosts and is refused (403) with MLflow's defaults (localhost and the private ranges)."""
    from platform.run.ray_env import free_port
    from platform.slurm_job import allowed_hosts

    public = "198.18.7.7"

    def serve(*extra: str) -> tuple[subprocess.Popen, int]:
        port = free_port()
        proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path}/{port}.db",
                                 *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return proc, port

    def status(port: int) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1",
                                         headers={"Host": f"{public}:{port}"})
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code
            except OSError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)

    servers = []
    try:
        servers.append(serve())
        port = free_port()
        servers.append((subprocess.Popen(
            [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path}/ours.db", "--allowed-hosts",
             allowed_hosts(public, port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True), port))
        assert status(servers[0][1]) == 403
        assert status(port) == 200
    finally:
        for proc, _ in servers:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* fcntl's locks refused on files under $NOLOCK_PREFIX, as NFS mounted nolock or Lustre noflock do. */
static int refused(int fd, int cmd) {
    const char *prefix = getenv("NOLOCK_PREFIX");
    char link[64], path[4096];
    if (!prefix || (cmd != F_SETLK && cmd != F_SETLKW && cmd != F_GETLK && cmd != F_OFD_SETLK &&
                    cmd != F_OFD_SETLKW && cmd != F_OFD_GETLK)) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return strncmp(path, prefix, strlen(prefix)) == 0;
}
#define SHIMMED(name) \
int name(int fd, int cmd, ...) { \
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap); \
    static int (*real)(int, int, ...); \
    if (!real) real = dlsym(RTLD_NEXT, #name); \
    if (refused(fd, cmd)) { errno = ENOLCK; return -1; } \
    return real(fd, cmd, arg); \
}
SHIMMED(fcntl)
SHIMMED(fcntl64)
"""


def test_mlflows_shared_copy_needs_no_lock_on_the_shared_filesystem(tmp_path):
    """The copy and the restore work where the shared filesystem refuses fcntl locks (an LD_PRELOAD
    shim refuses them under one folder); SQLite itself writing there fails, which the shim shows."""
    source, library = tmp_path / "nolock.c", tmp_path / "nolock.so"
    source.write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True)
    shared, local = tmp_path / "shared", tmp_path / "local"
    shared.mkdir()
    local.mkdir()
    with sqlite3.connect(local / "mlflow.db") as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
        db.execute("INSERT INTO runs VALUES ('a')")
    code = f"""
import sqlite3, sys
from pathlib import Path
from platform.slurm_job import MlflowServer
shared, local = Path({str(shared)!r}), Path({str(local)!r})
try:  # (SQLite's online backup onto such a path retries "database is locked" for ever)
    sqlite3.connect(shared / "direct.db").execute("CREATE TABLE t (a)")
    print("direct: written")
except sqlite3.Error as exc:
    print("direct: refused", exc)
server = MlflowServer(shared.parent, shared / "job-1", local)
server.snapshot(force=True)
with sqlite3.connect(local / "mlflow.db") as db:
    db.execute("INSERT INTO runs VALUES ('b')")
(local / "mlflow.db").replace(local / "before.db")
server.restore()
with sqlite3.connect(local / "mlflow.db") as db:
    print("restored:", sorted(r for (r,) in db.execute("SELECT run_uuid FROM runs")))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LD_PRELOAD": str(library), "NOLOCK_PREFIX": str(shared)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "direct: refused" in proc.stdout, proc.stdout  # SQLite on the shared path fails under the shim
    assert "restored: ['a']" in proc.stdout, proc.stdout  # the copy made before 'b' came back whole
    assert (shared / "job-1" / "mlflow.db").is_file() and not list((shared / "job-1").glob(".*"))


def test_status_of_a_job_no_one_knows_is_one_line(tmp_path):
    env = {"PATH": str(tmp_path)}  # no Slurm command on PATH: nothing knows the job
    assert_user_error(slurm("status", "12345", "--output", str(tmp_path), env=env), "knows no job 12345", "--output")
    assert_user_error(slurm("cancel", "x", env=env), "JOBID must be Slurm's job number")


def test_a_nodes_address_comes_from_its_interface_and_loopback_is_refused():
    from platform.errors import UserError
    from platform.slurm_job import hostport, node_ip

    route = subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True).stdout.split()
    if "dev" in route:  # the default route's interface has a global address
        ip = node_ip(route[route.index("dev") + 1])
        assert ip and not ip.startswith("127.")
    with pytest.raises(UserError, match="--node-interface lo: .* no such interface with a global address"):
        node_ip("lo")
    assert hostport("10.0.0.2", 6379) == "10.0.0.2:6379" and hostport("fd00::2", 6379) == "[fd00::2]:6379"


def test_a_nodes_ray_and_mlflow_ports_are_ones_no_connection_or_bind_on_the_node_can_take():
    """The ports a node's Ray and the job's MLflow listen on come from the job's window, outside the
    kernel's ephemeral range: a port from that range, free when chosen, is often taken by an outbound
    connection or another bind(0) before Ray binds it, and the node's Ray then fails to start."""
    import socket

    from platform.cluster_slurm import SERVICE_PORTS, WINDOWS
    from platform.slurm_job import service_ports

    first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    width = (SERVICE_PORTS[1] - SERVICE_PORTS[0] + 1) // WINDOWS
    low = SERVICE_PORTS[0] + (7 % WINDOWS) * width
    with socket.socket() as listener, socket.socket() as server, socket.socket() as client:
        listener.bind(("127.0.0.1", low))  # held by a listener, and by a connection's local end
        listener.listen()
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.1", low + 1))
        client.connect(server.getsockname())
        ports = service_ports(7, 9)
    assert len(set(ports)) == 9 and low not in ports and low + 1 not in ports, ports
    assert all(low <= p < low + width and not first <= p <= last for p in ports), (ports, first, last)
    assert not set(ports) & set(service_ports(8, 9))  # another job's window


def test_a_node_whose_ray_ends_before_the_job_starts_is_named_with_its_log(tmp_path, capsys):
    """A node's Ray that ends unasked (here: the head's, on a CPU count Ray refuses) is named in the
    job's one line with its log, not reported as nodes that did not join within JOIN_TIMEOUT_S."""
    import socket

    from platform.slurm_job import fail_start

    attempt = tmp_path / "attempt-0"
    attempt.mkdir()
    env = {**os.environ, "SLURM_NODEID": "0", "SLURM_JOB_ID": "5", "SLURM_CPUS_ON_NODE": "-1"}
    proc = subprocess.run([sys.executable, "-m", "platform.slurm_job", "node", str(attempt)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert fail_start(attempt, "not all 2 node(s) joined the head") == 3
    line = capsys.readouterr().err
    assert line == (f"error: {socket.gethostname()}: its Ray ended (exit {proc.returncode}; its log: "
                    f"{attempt}/ray-node-0.log)\n"), line
    assert "must be nonnegative" in (attempt / "ray-node-0.log").read_text()
